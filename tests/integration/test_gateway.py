"""The HTTP gateway against real NATS JetStream and Redis (no mocks): what it publishes, what it reads back.

Nothing else of Rackscale runs here: job records, nodes and allocations are written with the Store the
way the queue, inventory and placement write them, and inventory's drain replies come from a tiny
responder on names.node_admin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonschema
import msgspec
import nats.errors
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from services.gateway.service import GatewayService, build_app, idempotent_job_id
from shared import sse
from shared.names import Names, job_cell
from shared.runtime import Deps
from shared.schemas import (
    JOB_INTAKE,
    NODE_ADMIN,
    AdminReply,
    AllocationRecord,
    Committed,
    JobBody,
    JobCancel,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    NodeChanged,
    NodeGpus,
    NodeRecord,
    Released,
    TopologyBody,
    encode,
)
from shared.settings import Settings
from shared.store import ViewMark
from shared.tracing import noop_tracer
from tests.integration.conftest import delete_nats_namespace, delete_redis_namespace
from tests.openapi_events import assert_conforms

pytestmark = pytest.mark.asyncio

NOW = 1_700_000_000.0
JOB = {"name": "train", "tenant": "a", "gpus": 8}
Client = TestClient[web.Request, web.Application]


@dataclass
class Gw:
    client: Client
    deps: Deps
    names: Names

    @property
    def js(self) -> Any:
        return self.deps.bus.js

    async def stream_count(self, subject: str) -> int:
        info = await self.js.stream_info(self.names.stream_for(subject), subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    async def pull(self, subject: str, n: int = 1, timeout: float = 1.0) -> list[Msg]:
        """Up to `n` messages on `subject`, through a fresh durable pull consumer (a test consumer)."""
        durable = f"test-{subject.rsplit('.', 1)[-1]}"
        sub = await self.js.pull_subscribe(subject, durable=durable, stream=self.names.stream_for(subject))
        try:
            return list(await sub.fetch(n, timeout=timeout))
        except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either, depending on the step
            return []
        finally:
            await sub.unsubscribe()


async def _deps(nats_url: str, redis_url: str, names: Names) -> Deps:
    return await Deps.connect(
        Settings(gateway_port=0),
        "gateway",
        nats_url,
        redis_url,
        names,
        tracer=noop_tracer("gateway"),
        clock=lambda: NOW,
    )


async def _cleanup(nats_url: str, redis_url: str, namespace: str) -> None:
    # Names upper-cases the prefix in stream names ("T1A2B3C4D_JOBS").
    await delete_nats_namespace(nats_url, namespace.upper())
    await delete_redis_namespace(redis_url, namespace)


@pytest_asyncio.fixture
async def gw(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Gw]:
    names = Names(prefix=namespace)
    deps = await _deps(nats_url, redis_url, names)
    await deps.store.open_view(ViewMark(), time.time())
    app = build_app(deps, keepalive_s=0.3, admin_timeout_s=0.5)
    try:
        async with TestClient(TestServer(app)) as client:
            yield Gw(client, deps, names)
    finally:
        await deps.close()
        await _cleanup(nats_url, redis_url, namespace)


def _node(name: str, domain: str, **kw: Any) -> NodeRecord:
    return NodeRecord(name=name, domain=domain, **kw)


def _record(
    job_id: str, tenant: str = "a", state: JobState = JobState.PENDING, at: float = NOW, **kw: Any
) -> JobRecord:
    spec = JobBody(name=f"job-{job_id}", tenant=tenant, gpus=4)
    return JobRecord(id=job_id, spec=spec, state=state, submitted_at=at, updated_at=at, **kw)


# -- submit ----------------------------------------------------------------------------------------------


async def test_submit_publishes_job_submitted(gw: Gw) -> None:
    resp = await gw.client.post("/v1/jobs", json={**JOB, "topology": {"nvlink": "preferred"}})
    assert resp.status == 202
    accepted = await resp.json()
    assert accepted == {"id": accepted["id"], "state": "pending"} and len(accepted["id"]) == 32
    assert resp.headers["Location"] == f"/v1/jobs/{accepted['id']}"

    (msg,) = await gw.pull(gw.names.job_submit)
    sub = JOB_INTAKE.decode(msg.data)
    assert isinstance(sub, JobSubmitted)
    assert sub.job_id == accepted["id"] and sub.submitted_at == NOW
    assert sub.spec == JobBody(name="train", tenant="a", gpus=8, topology=TopologyBody(nvlink="preferred"))
    assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == sub.job_id
    assert msg.headers["traceparent"].startswith("00-")  # the job's trace starts at the gateway


@pytest.mark.parametrize(
    ("data", "status", "field"),
    [
        (b"{not json", 400, None),
        (b"[1]", 400, None),
        (b'{"name": "x", "tenant": "a", "gpus": 0}', 422, "gpus"),
        (b'{"name": "x", "tenant": "a", "gpus": 4, "colour": "red"}', 422, "colour"),
        (b'{"name": "x", "tenant": "a", "gpus": 4, "topology": {"segment": 0}}', 422, "topology.segment"),
        (b'{"name": "x", "tenant": "a", "gpus": 6, "gpus_per_node": 4}', 422, "gpus"),
    ],
)
async def test_invalid_submit_publishes_nothing(gw: Gw, data: bytes, status: int, field: str | None) -> None:
    resp = await gw.client.post("/v1/jobs", data=data, headers={"Content-Type": "application/json"})
    assert resp.status == status
    err = await resp.json()
    assert err["field"] == field and err["error"]
    assert await gw.stream_count(gw.names.job_submit) == 0
    assert await gw.pull(gw.names.job_submit, timeout=0.3) == []


async def test_validation_follows_the_registered_topology(gw: Gw) -> None:
    shape = {**JOB, "gpus": 16}  # 4 whole nodes, NVLink required in one domain
    # no node registered yet: only the static rules apply
    assert (await gw.client.post("/v1/jobs", json=shape)).status == 202

    for i in range(2):
        await gw.deps.store.put_node(_node(f"n{i}", "r1"))
    resp = await gw.client.post("/v1/jobs", json=shape)
    assert resp.status == 422
    assert await resp.json() == {"error": "gpus: 16 GPUs need 4 nodes; the cluster has 2", "field": "gpus"}

    for i in range(2, 6):
        await gw.deps.store.put_node(_node(f"n{i}", "r2" if i > 2 else "r1"))  # r1: 3 nodes, r2: 3 nodes
    resp = await gw.client.post("/v1/jobs", json=shape)
    assert resp.status == 422 and "can't fit in one NVLink domain (largest: 3 nodes)" in (await resp.json())["error"]
    resp = await gw.client.post("/v1/jobs", json={**shape, "topology": {"segment": 2}})
    assert resp.status == 202
    assert await gw.stream_count(gw.names.job_submit) == 2


async def test_a_fleet_relearning_its_nodes_still_takes_what_the_whole_fleet_fits(gw: Gw) -> None:
    """Redis came back empty: nodes register again one by one. A job the fleet seen whole fits is accepted
    (it waits for its nodes); one that never fit is still refused."""
    shape = {**JOB, "gpus": 16}
    for i in range(6):
        await gw.deps.store.put_node(_node(f"n{i}", "r1"))
    assert (await gw.client.post("/v1/jobs", json=shape)).status == 202
    keys = [k async for k in gw.deps.store.r.scan_iter(gw.names.key_pattern)]
    await gw.deps.store.r.delete(*keys)
    await gw.deps.store.open_view(ViewMark(), time.time())
    await gw.deps.store.put_node(_node("n0", "r1"))  # the first node back
    assert (await gw.client.post("/v1/jobs", json=shape)).status == 202
    too_big = await gw.client.post("/v1/jobs", json={**JOB, "gpus": 40})
    assert too_big.status == 422 and "the cluster has 6" in (await too_big.json())["error"]


async def test_idempotent_resubmit(gw: Gw) -> None:
    key = {"Idempotency-Key": "run-42"}
    first = await gw.client.post("/v1/jobs", json=JOB, headers=key)
    again = await gw.client.post("/v1/jobs", json=JOB, headers=key)
    assert (first.status, again.status) == (202, 202)
    job_id = (await first.json())["id"]
    assert (await again.json())["id"] == job_id == idempotent_job_id("a", "run-42")
    assert await gw.stream_count(gw.names.job_submit) == 1  # JetStream dropped the duplicate (same msg id)

    # once the queue has recorded it, a retry answers with the job as it is now
    rec = JobRecord(id=job_id, spec=JobBody(name="train", tenant="a", gpus=8), state=JobState.RUNNING)
    await gw.deps.store.put_job(rec, new=True)
    resp = await gw.client.post("/v1/jobs", json=JOB, headers=key)
    assert resp.status == 200
    assert (await resp.json())["id"] == job_id and (await resp.json())["state"] == "running"

    resp = await gw.client.post("/v1/jobs", json={**JOB, "gpus": 4}, headers=key)
    assert resp.status == 422 and (await resp.json())["field"] == "Idempotency-Key"
    other = await gw.client.post("/v1/jobs", json={**JOB, "tenant": "b"}, headers=key)
    assert other.status == 202 and (await other.json())["id"] != job_id  # keys are per tenant
    for key_value in ("x" * 256, "tab\there"):  # too long; not printable ASCII (the document's pattern)
        bad = await gw.client.post("/v1/jobs", json=JOB, headers={"Idempotency-Key": key_value})
        assert bad.status == 400 and (await bad.json())["field"] == "Idempotency-Key"
    assert await gw.stream_count(gw.names.job_submit) == 2


# -- reads -----------------------------------------------------------------------------------------------


async def test_get_job_shows_the_record(gw: Gw) -> None:
    store = gw.deps.store
    await store.put_node(_node("n1", "r1"))
    await store.put_node(_node("n2", "r2"))
    spec = JobBody(name="train", tenant="a", gpus=6, gpus_per_node=3, topology=TopologyBody(nvlink="preferred"))
    rec = JobRecord(
        id="j1",
        spec=spec,
        state=JobState.SUCCEEDED,
        reason="exited 0",
        submitted_at=NOW,
        updated_at=NOW + 30,
        started_at=NOW + 5,
        ended_at=NOW + 30,
        attempt=1,
        allocation=[NodeGpus("n1", [0, 1, 2]), NodeGpus("n2", [1, 2, 3])],
        exit_codes={"n1/0": 0, "n2/1": 0},
        exit_causes={"n1/0": "completed", "n2/1": "completed"},
        end="completed",
        trace="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    await store.put_job(rec, new=True)
    resp = await gw.client.get("/v1/jobs/j1")
    assert resp.status == 200
    assert await resp.json() == {
        "id": "j1",
        "name": "train",
        "tenant": "a",
        "state": "succeeded",
        "reason": "exited 0",
        "gpus": 6,
        "gpus_per_node": 3,
        "topology": {"nvlink": "preferred", "segment": None, "level": "domain"},
        "priority": 0,
        "exclusive": False,
        "checkpointable": False,
        "allocation": [
            {"domain": "r1", "node": "n1", "gpus": [0, 1, 2]},
            {"domain": "r2", "node": "n2", "gpus": [1, 2, 3]},
        ],
        "submitted_at": NOW,
        "started_at": NOW + 5,
        "ended_at": NOW + 30,
        "updated_at": NOW + 30,
        "attempt": 1,
        "exit_codes": {"n1/0": 0, "n2/1": 0},
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",  # the submit's trace, for the dashboard's Jaeger link
        "time_limit_s": None,
        "processes": "per_node",
        "workdir": "",
        "end": "completed",
        "exits": [
            {"node": "n1", "rank": 0, "exit_code": 0, "signal": None, "cause": "completed"},
            {"node": "n2", "rank": 1, "exit_code": 0, "signal": None, "cause": "completed"},
        ],
        "segment": None,  # no segments
        "min_gpus": None,  # rigid
        "array_id": None,  # not an array's task
        "array_index": None,
        "array": None,
        "dependency": "",
    }
    missing = await gw.client.get("/v1/jobs/nope")
    assert missing.status == 404 and await missing.json() == {"error": "unknown job nope", "field": None}


async def test_list_jobs_filters_and_pages(gw: Gw) -> None:
    rows = [("j0", "a", JobState.PENDING), ("j1", "a", JobState.RUNNING), ("j2", "b", JobState.RUNNING)]
    rows += [("j3", "a", JobState.FAILED), ("j4", "b", JobState.PENDING), ("j5", "a", JobState.RUNNING)]
    for i, (job_id, tenant, state) in enumerate(rows):
        await gw.deps.store.put_job(_record(job_id, tenant, state, at=NOW + i), new=True)

    async def ids(query: str) -> tuple[list[str], dict[str, Any]]:
        resp = await gw.client.get(f"/v1/jobs{query}")
        assert resp.status == 200
        page = await resp.json()
        return [j["id"] for j in page.pop("jobs")], page

    assert await ids("") == (["j0", "j1", "j2", "j3", "j4", "j5"], {"total": 6, "offset": 0, "limit": 50})
    assert await ids("?tenant=a") == (["j0", "j1", "j3", "j5"], {"total": 4, "offset": 0, "limit": 50})
    assert await ids("?state=running") == (["j1", "j2", "j5"], {"total": 3, "offset": 0, "limit": 50})
    assert await ids("?tenant=a&state=running") == (["j1", "j5"], {"total": 2, "offset": 0, "limit": 50})
    assert await ids("?tenant=a&offset=1&limit=2") == (["j1", "j3"], {"total": 4, "offset": 1, "limit": 2})
    assert await ids("?offset=10&limit=500") == ([], {"total": 6, "offset": 10, "limit": 500})

    for query, field in [
        ("?limit=501", "limit"),
        ("?limit=0", "limit"),
        ("?offset=-1", "offset"),
        ("?offset=two", "offset"),
        ("?state=sleeping", "state"),
    ]:
        resp = await gw.client.get(f"/v1/jobs{query}")
        assert resp.status == 422, query
        assert (await resp.json())["field"] == field


async def test_cancel_publishes_job_cancel(gw: Gw) -> None:
    await gw.deps.store.put_job(_record("j1", state=JobState.RUNNING), new=True)
    await gw.deps.store.put_job(_record("j2", state=JobState.SUCCEEDED), new=True)

    resp = await gw.client.delete("/v1/jobs/j1")
    assert resp.status == 202 and await resp.json() == {"id": "j1", "state": "cancelling"}
    (msg,) = await gw.pull(gw.names.job_cancel)
    assert JOB_INTAKE.decode(msg.data) == JobCancel(job_id="j1", at=NOW)

    done = await gw.client.delete("/v1/jobs/j2")
    assert done.status == 409 and "already succeeded" in (await done.json())["error"]
    assert (await gw.client.delete("/v1/jobs/nope")).status == 404
    assert await gw.stream_count(gw.names.job_cancel) == 1


async def test_a_gateway_of_another_cell_mints_ids_naming_it_and_sums_its_cell_up(
    nats_url: str, redis_url: str, namespace: str
) -> None:
    names = Names(prefix=namespace, cell="c1")
    deps = await _deps(nats_url, redis_url, names)
    await deps.store.open_view(ViewMark(), time.time())
    try:
        async with TestClient(TestServer(build_app(deps))) as client:
            store = deps.store
            await store.put_node(_node("n1", "r1", gpu_health={"3": "down"}))
            await store.put_node(_node("n2", "r1", state="draining", drained=True))
            await store.put_node(_node("n3", "r2", state="down"))
            resp = await client.post("/v1/jobs", json={**JOB, "gpus": 4})
            minted = (await resp.json())["id"]
            assert resp.status == 202 and minted.startswith("c1-") and job_cell(minted) == "c1"
            keyed = await client.post("/v1/jobs", json={**JOB, "gpus": 4}, headers={"Idempotency-Key": "k"})
            assert (
                (await keyed.json())["id"] == idempotent_job_id("a", "k", "c1") == f"c1-{idempotent_job_id('a', 'k')}"
            )
            # one job holding 2 GPUs of n1, another pending, a third ended
            for job, state in (("c1-j1", JobState.RUNNING), ("c1-j2", JobState.PENDING), ("c1-j3", JobState.FAILED)):
                await store.put_job(_record(job, state=state), new=True)
            held = [NodeGpus("n1", [0, 1])]
            assert (await store.commit(AllocationRecord(job_id="c1-j1", attempt=1, nodes=held, committed_at=NOW))).ok
            resp = await client.get("/v1/cluster/summary")
            assert resp.status == 200
            assert await resp.json() == {
                "cell": "c1",
                "generation": await store.topology_generation(),
                "gpus": 12,
                "healthy": 7,  # n1's GPU 3 and all of n3 are down
                "busy": 2,
                "free": 1,  # n1's GPU 2: n2 is draining
                "nodes": 3,
                "nodes_up": 1,
                "jobs_pending": 1,
                "jobs_running": 1,
            }
    finally:
        await deps.close()
        await _cleanup(nats_url, redis_url, namespace)


# -- arrays and dependencies ---------------------------------------------------------------------------------


async def _array(gw: Gw, array_id: str, states: list[JobState], tenant: str = "a") -> list[str]:
    """An array's tasks written as the queue writes them: every record, then the array's index."""
    body = JobBody(name="sweep", tenant=tenant, gpus=4, array=f"0-{len(states) - 1}%2")
    ids = [f"{array_id}_{i}" for i in range(len(states))]
    for i, (task, state) in enumerate(zip(ids, states, strict=True)):
        rec = JobRecord(id=task, spec=body, state=state, submitted_at=NOW, array_id=array_id, array_index=i)
        await gw.deps.store.put_job(rec, new=True)
    await gw.deps.store.index_array(array_id, ids)
    return ids


async def test_an_array_is_accepted_as_one_submit_and_read_as_its_tasks(gw: Gw) -> None:
    resp = await gw.client.post("/v1/jobs", json={**JOB, "array": "0-11%4"})
    assert resp.status == 202
    array = (await resp.json())["id"]
    assert resp.headers["Location"] == f"/v1/jobs?array={array}"
    (msg,) = await gw.pull(gw.names.job_submit)
    submitted = JOB_INTAKE.decode(msg.data)
    assert isinstance(submitted, JobSubmitted) and (submitted.job_id, submitted.spec.array) == (array, "0-11%4")

    # 12 tasks, listed in index order (not the ids' order: _10 after _9), with their array; filters apply
    states = [JobState.SUCCEEDED] * 3 + [JobState.RUNNING] * 4 + [JobState.PENDING] * 5
    tasks = await _array(gw, array, states)
    await gw.deps.store.put_job(_record("other", at=NOW - 1), new=True)
    page = await (await gw.client.get(f"/v1/jobs?array={array}")).json()
    assert [j["id"] for j in page["jobs"]] == tasks and page["total"] == 12
    assert {(j["array_id"], j["array"]) for j in page["jobs"]} == {(array, "0-11%2")}  # (as _array wrote them)
    assert [j["array_index"] for j in page["jobs"]] == list(range(12))
    running = await (await gw.client.get(f"/v1/jobs?array={array}&state=running&offset=1&limit=2")).json()
    assert [j["id"] for j in running["jobs"]] == tasks[4:6] and running["total"] == 4
    everything = await (await gw.client.get("/v1/jobs")).json()
    assert [j["id"] for j in everything["jobs"]] == ["other", *tasks]  # index order among all jobs too
    assert (await (await gw.client.get("/v1/jobs?array=nope")).json())["total"] == 0

    # the array's id is no job: a 404 that says where its tasks are; a task is a job
    resp = await gw.client.get(f"/v1/jobs/{array}")
    assert resp.status == 404 and f"GET /v1/jobs?array={array}" in (await resp.json())["error"]
    task = await (await gw.client.get(f"/v1/jobs/{tasks[10]}")).json()
    assert (task["id"], task["array_id"], task["array_index"]) == (tasks[10], array, 10)


async def test_cancel_of_an_array_is_one_cancel_of_its_id(gw: Gw) -> None:
    ids = await _array(gw, "arr", [JobState.SUCCEEDED, JobState.RUNNING, JobState.PENDING])
    resp = await gw.client.delete("/v1/jobs/arr")
    assert resp.status == 202 and await resp.json() == {"id": "arr", "state": "cancelling"}
    (msg,) = await gw.pull(gw.names.job_cancel)
    assert JOB_INTAKE.decode(msg.data) == JobCancel(job_id="arr", at=NOW)  # the queue cancels each task
    task = await gw.client.delete(f"/v1/jobs/{ids[1]}")  # one task alone
    assert task.status == 202 and (await task.json())["id"] == ids[1]
    await _array(gw, "done", [JobState.SUCCEEDED, JobState.CANCELLED])
    ended = await gw.client.delete("/v1/jobs/done")
    assert ended.status == 409 and (await ended.json())["error"] == "every task of array done has ended"


async def test_a_dependency_must_name_jobs_that_exist(gw: Gw) -> None:
    await gw.deps.store.put_job(_record("j1", state=JobState.RUNNING), new=True)
    await gw.deps.store.put_job(_record("theirs", tenant="b"), new=True)
    await _array(gw, "arr", [JobState.PENDING, JobState.PENDING])
    for dependency in ("afterok:j1", "afterany:arr,singleton", "afternotok:arr_1:j1", "singleton"):
        resp = await gw.client.post("/v1/jobs", json={**JOB, "dependency": dependency})
        assert resp.status == 202, (dependency, await resp.json())
    # an unknown id is refused naming it (the queue has no submit left to handle here: no queue consumer ever ran;
    # another tenant's: test_gateway_auth.py)
    for dependency, named in [("afterok:j1:nope", "afterok:nope"), ("afterany:arr_7", "afterany:arr_7")]:
        resp = await gw.client.post("/v1/jobs", json={**JOB, "dependency": dependency})
        body = await resp.json()
        assert resp.status == 422 and body["field"] == "dependency" and named in body["error"], body
    bad = await gw.client.post("/v1/jobs", json={**JOB, "dependency": "after:j1"})
    assert bad.status == 422 and (await bad.json())["field"] == "dependency"
    assert await gw.stream_count(gw.names.job_submit) == 4


async def test_an_arrays_idempotent_resubmit_answers_as_the_first(gw: Gw) -> None:
    key = {"Idempotency-Key": "sweep-1"}
    body = {**JOB, "array": "0-1"}
    first = await gw.client.post("/v1/jobs", json=body, headers=key)
    array = (await first.json())["id"]
    assert first.status == 202 and array == idempotent_job_id("a", "sweep-1")
    spec = JobBody(name="train", tenant="a", gpus=8, array="0-1")
    for i in range(2):
        rec = JobRecord(id=f"{array}_{i}", spec=spec, submitted_at=NOW, array_id=array, array_index=i)
        await gw.deps.store.put_job(rec, new=True)
    await gw.deps.store.index_array(array, [f"{array}_0", f"{array}_1"])
    again = await gw.client.post("/v1/jobs", json=body, headers=key)
    assert again.status == 202 and await again.json() == {"id": array, "state": "pending"}
    other = await gw.client.post("/v1/jobs", json={**body, "array": "0-2"}, headers=key)
    assert other.status == 422 and (await other.json())["field"] == "Idempotency-Key"
    assert await gw.stream_count(gw.names.job_submit) == 1


async def test_cluster_view(gw: Gw) -> None:
    store = gw.deps.store
    await store.put_node(_node("n1", "r1", gpu_health={"3": "down", "2": "degraded"}))
    await store.put_node(_node("n2", "r1"))
    await store.put_node(_node("n3", "r2", state="down", reason="missed heartbeats"))
    rec = AllocationRecord(
        job_id="j1", attempt=1, nodes=[NodeGpus("n1", [0, 1]), NodeGpus("n2", [0, 1, 2, 3])], committed_at=NOW
    )
    assert (await store.commit(rec)).ok

    resp = await gw.client.get("/v1/cluster")
    assert resp.status == 200
    view = await resp.json()
    assert view["generation"] == await store.topology_generation()
    assert view["utilisation"] == {"total": 12, "healthy": 7, "busy": 6, "ratio": round(6 / 7, 4)}
    r1, r2 = view["domains"]
    assert (r1["name"], r2["name"]) == ("r1", "r2")
    assert r1["utilisation"] == {"total": 8, "healthy": 7, "busy": 6, "ratio": round(6 / 7, 4)}
    assert r2["utilisation"] == {"total": 4, "healthy": 0, "busy": 0, "ratio": 0.0}
    n1 = r1["nodes"][0]
    assert n1["name"] == "n1" and n1["state"] == "up"
    assert n1["gpus"] == [
        {"index": 0, "health": "ok", "job": "j1", "cell": "job"},
        {"index": 1, "health": "ok", "job": "j1", "cell": "job"},
        {"index": 2, "health": "degraded", "job": None, "cell": "degraded"},
        {"index": 3, "health": "down", "job": None, "cell": "down"},
    ]
    assert r2["nodes"][0]["state"] == "down" and r2["nodes"][0]["reason"] == "missed heartbeats"
    assert {g["cell"] for g in r2["nodes"][0]["gpus"]} == {"down"}
    assert view["allocations"] == [
        {
            "job_id": "j1",
            "attempt": 1,
            "committed_at": NOW,
            "nodes": [
                {"domain": "r1", "node": "n1", "gpus": [0, 1]},
                {"domain": "r1", "node": "n2", "gpus": [0, 1, 2, 3]},
            ],
        }
    ]


async def test_the_cluster_view_shows_heartbeats_state_changes_and_gpus_as_they_come(gw: Gw) -> None:
    """The gateway keeps the node records while `topo:gen` stays, each node's built part while it is the same, and
    the allocations as placement's events tell them: what it shows must still be current: a heartbeat's time, a
    node gone down, a GPU taken and given back (placement's commit and its Committed, its release and Released)."""
    store, bus = gw.deps.store, gw.deps.bus

    async def node(name: str) -> dict[str, Any]:
        resp = await gw.client.get("/v1/cluster")
        assert resp.status == 200
        return next(n for d in (await resp.json())["domains"] for n in d["nodes"] if n["name"] == name)

    async def jobs_on(name: str, want: list[str | None]) -> None:
        # well inside the gateway's full-read period (ALLOCATIONS_READ_S): only the events can show the change
        deadline = asyncio.get_running_loop().time() + 2.0
        while (got := [g["job"] for g in (await node(name))["gpus"]]) != want:
            assert asyncio.get_running_loop().time() < deadline, f"{name}'s GPUs show {got}, not {want}"
            await asyncio.sleep(0.02)

    await store.put_node(_node("n1", "r1"))
    first = await node("n1")
    await store.touch_nodes({"n1": first["last_heartbeat"] + 7.0})  # a heartbeat: no new generation
    assert (await node("n1"))["last_heartbeat"] == first["last_heartbeat"] + 7.0
    await store.put_node(_node("n1", "r1", state="down", reason="no heartbeat"))
    assert ((await node("n1"))["state"], (await node("n1"))["reason"]) == ("down", "no heartbeat")
    await store.put_node(_node("n1", "r1"))
    held = [NodeGpus("n1", [2])]
    assert (await store.commit(AllocationRecord(job_id="j9", attempt=1, nodes=held, committed_at=NOW))).ok
    await bus.publish(gw.deps.names.placement_events, Committed(job_id="j9", attempt=1, nodes=held, at=NOW))
    await jobs_on("n1", [None, None, "j9", None])
    assert await store.release("j9")
    await bus.publish(gw.deps.names.placement_events, Released(job_id="j9", reason="done", at=NOW, attempt=1))
    await jobs_on("n1", [None, None, None, None])


# -- nodes -----------------------------------------------------------------------------------------------


async def test_drain_and_undrain_ask_inventory(gw: Gw, nats_client: NatsClient) -> None:
    asked: list[Any] = []

    async def inventory(m: Msg) -> None:  # a stand-in for inventory's admin responder
        req = NODE_ADMIN.decode(m.data)
        asked.append(req)
        if req.node != "n1":
            reply = AdminReply(ok=False, error=f"unknown node {req.node}")
        else:
            reply = AdminReply(ok=True, state="draining" if req.action == "drain" else "up")
        await m.respond(encode(reply))

    await nats_client.subscribe(gw.names.node_admin, cb=inventory)
    await nats_client.flush()

    resp = await gw.client.post("/v1/nodes/n1/drain", json={"reason": "swap a tray"})
    assert resp.status == 200 and await resp.json() == {"node": "n1", "state": "draining"}
    resp = await gw.client.post("/v1/nodes/n1/undrain")
    assert resp.status == 200 and await resp.json() == {"node": "n1", "state": "up"}
    resp = await gw.client.post("/v1/nodes/n9/drain")
    assert resp.status == 404 and await resp.json() == {"error": "unknown node n9", "field": None}
    resp = await gw.client.post("/v1/nodes/n1/clear-health", json={"reason": "GPU 3 reseated"})
    assert resp.status == 200
    assert [(a.node, a.action, a.reason) for a in asked] == [
        ("n1", "drain", "swap a tray"),
        ("n1", "undrain", ""),
        ("n9", "drain", ""),
        ("n1", "clear_health", "GPU 3 reseated"),
    ]
    bad = await gw.client.post("/v1/nodes/n1/drain", json={"why": "x"})
    assert bad.status == 422 and (await bad.json())["field"] == "why"
    assert len(asked) == 4  # nothing asked for a bad body


async def test_drain_without_inventory_is_503(gw: Gw) -> None:
    resp = await gw.client.post("/v1/nodes/n1/drain")
    assert resp.status == 503 and "inventory did not answer" in (await resp.json())["error"]


# -- events ----------------------------------------------------------------------------------------------


async def _frame(resp: aiohttp.ClientResponse) -> list[str]:
    """Lines of the next SSE frame (up to a blank line)."""
    lines: list[str] = []
    while True:
        line = (await asyncio.wait_for(resp.content.readline(), 5.0)).decode().rstrip("\n")
        if not line:
            if lines:
                return lines
            continue
        lines.append(line)


async def test_events_stream_job_and_node_events(gw: Gw) -> None:
    resp = await gw.client.get("/v1/events")
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
    assert await _frame(resp) == [": connected"]  # subscribed: events published from now on arrive

    ev = JobEvent(job_id="x", state=JobState.RUNNING, reason="", at=NOW, attempt=1, tenant="a")
    await gw.deps.bus.publish(gw.names.job_event("x"), ev)
    frame = await _frame(resp)
    while frame == [": keep-alive"]:
        frame = await _frame(resp)
    assert frame[0] == "event: job"
    assert msgspec.json.decode(frame[1].removeprefix("data: "), type=JobEvent) == ev

    node = NodeChanged(node="n1", state="down", reason="missed heartbeats", at=NOW)
    await gw.deps.bus.publish(gw.names.node_events, node)
    frame = await _frame(resp)
    while frame == [": keep-alive"]:
        frame = await _frame(resp)
    assert frame[0] == "event: node"
    assert msgspec.json.decode(frame[1].removeprefix("data: "), type=NodeChanged) == node

    assert await _frame(resp) == [": keep-alive"]  # every keepalive_s (0.3 s here, 15 s by default)
    resp.close()
    # both as a schema-checking client reads them against /openapi.json: typed event by event
    doc = await (await gw.client.get("/openapi.json")).json()
    for kind, data in (("job", ev), ("node", node)):
        assert_conforms(doc, "/v1/events", sse.Event(kind, msgspec.json.encode(data).decode()))
    with pytest.raises(jsonschema.ValidationError):  # a job event's data isn't a node's
        assert_conforms(doc, "/v1/events", sse.Event("node", msgspec.json.encode(ev).decode()))


# -- meta ------------------------------------------------------------------------------------------------


async def test_health_and_readiness(gw: Gw) -> None:
    assert (await gw.client.get("/healthz")).status == 200
    resp = await gw.client.get("/readyz")
    assert resp.status == 200 and await resp.json() == {"status": "ok", "nats": True, "redis": True, "view": True}


async def test_a_view_being_rebuilt_answers_503_never_404(gw: Gw) -> None:
    """While the view is rebuilt from the log (Redis came back empty or behind), a job it lacks may exist."""
    await gw.deps.store.put_job(_record("known"), new=True)
    await gw.deps.store.close_view()
    resp = await gw.client.get("/readyz")
    assert resp.status == 503 and (await resp.json())["view"] is False
    for method, path in (("GET", "/v1/jobs/unknown"), ("GET", "/v1/jobs"), ("GET", "/v1/cluster"),
                         ("DELETE", "/v1/jobs/unknown")):  # fmt: skip
        resp = await gw.client.request(method, path)
        assert resp.status == 503 and resp.headers["Retry-After"] == "1", (method, path, resp.status)
        assert "rebuilt" in (await resp.json())["error"]
    assert (await gw.client.get("/v1/jobs/known")).status == 200  # what the view has is served
    await gw.deps.store.open_view(ViewMark(), time.time())
    assert (await gw.client.get("/v1/jobs/unknown")).status == 404


async def test_a_job_accepted_but_not_yet_recorded_answers_503_never_404(gw: Gw) -> None:
    """A 202 comes before the queue writes the record: until the queue's submit consumer has handled every
    submit, a job without a record may be one of them (503 with Retry-After); once it has, none is (404)."""
    await gw.deps.store.put_node(_node("n1", "r1", gpus=8))
    n = gw.names
    queue = await gw.js.pull_subscribe(
        n.job_submit, durable=n.consumer("queue", "submit"), stream=n.stream_for(n.job_submit)
    )
    try:
        resp = await gw.client.post("/v1/jobs", json={"name": "x", "tenant": "a", "gpus": 4})
        assert resp.status == 202
        job = (await resp.json())["id"]
        for method in ("GET", "DELETE"):
            resp = await gw.client.request(method, f"/v1/jobs/{job}")
            assert resp.status == 503 and resp.headers["Retry-After"] == "1", (method, resp.status)
            assert "not recorded yet" in (await resp.json())["error"]
        [msg] = await queue.fetch(1, timeout=2)  # the queue has it, not yet acked: still maybe
        assert (await gw.client.get(f"/v1/jobs/{job}")).status == 503
        await gw.deps.store.put_job(_record(job), new=True)  # its handler writes, then acks
        await msg.ack_sync()
        assert (await gw.client.get(f"/v1/jobs/{job}")).status == 200
        assert (await gw.client.get("/v1/jobs/no-such-job")).status == 404  # every submit handled: unknown
    finally:
        await queue.unsubscribe()


async def test_not_ready_without_nats(nats_url: str, redis_url: str, namespace: str) -> None:
    deps = await _deps(nats_url, redis_url, Names(prefix=namespace))
    try:
        async with TestClient(TestServer(build_app(deps))) as client:
            await deps.bus.nc.close()
            resp = await client.get("/readyz")
            assert resp.status == 503 and (await resp.json())["nats"] is False
            assert (await client.get("/healthz")).status == 200
    finally:
        await deps.close()
        await _cleanup(nats_url, redis_url, namespace)


async def test_openapi_document_is_valid(gw: Gw) -> None:
    import openapi_spec_validator as validator

    resp = await gw.client.get("/openapi.json")
    assert resp.status == 200
    doc = await resp.json()
    validator.validate(doc)
    assert doc["openapi"] == "3.2.0" and "/v1/jobs/{id}" in doc["paths"]


async def test_http_errors_answer_json(gw: Gw) -> None:
    resp = await gw.client.get("/v1/nope")
    assert resp.status == 404 and (await resp.json())["error"] == "Not Found"
    resp = await gw.client.put("/v1/jobs", json=JOB)
    assert resp.status == 405 and "POST" in resp.headers["Allow"]
    resp = await gw.client.post("/v1/jobs", data=b"{" + b" " * (1 << 20) + b"}")
    assert resp.status == 413 and "error" in await resp.json()
    assert await gw.stream_count(gw.names.job_submit) == 0


async def test_service_serves_on_its_port_and_stops_with_open_streams(
    nats_url: str, redis_url: str, namespace: str
) -> None:
    deps = await _deps(nats_url, redis_url, Names(prefix=namespace))
    service = GatewayService(deps)
    try:
        await service.start()
        assert service.port
        base = f"http://{deps.settings.gateway_host}:{service.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            events = await http.get(f"{base}/v1/events")
            assert await _frame(events) == [": connected"]
            await asyncio.wait_for(service.stop(grace_s=1.0), 5.0)  # the open stream doesn't hold it up
            assert await asyncio.wait_for(events.content.read(), 5.0) == b""
            events.close()
    finally:
        await deps.close()
        await _cleanup(nats_url, redis_url, namespace)
