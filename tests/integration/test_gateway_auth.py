"""Access control in the gateway, against real NATS JetStream and Redis: bearer tokens → tenant and role.

Job records and allocations are written with the Store the way the queue and placement write them; the
drain answer comes from a tiny responder on names.node_admin (as in test_gateway.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from nats.aio.msg import Msg

from services.gateway.auth import Tokens
from services.gateway.service import build_app
from services.gateway.views import OTHER_TENANT
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import (
    JOB_INTAKE,
    NODE_ADMIN,
    AdminReply,
    AllocationRecord,
    JobBody,
    JobRecord,
    JobState,
    JobSubmitted,
    NodeGpus,
    encode,
)
from shared.settings import Settings
from shared.store import ViewMark
from shared.tracing import noop_tracer
from tests.integration.conftest import delete_nats_namespace, delete_redis_namespace

pytestmark = pytest.mark.asyncio

ALICE, BOB, ADMIN = "alice-token-0123456789", "bob-token-0123456789ab", "admin-token-0123456789"
TOKENS_YAML = f"""
tokens:
  - {{token: "{ALICE}", tenant: alice, role: user}}
  - {{token: "{BOB}", tenant: bob, role: user}}
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
"""
Client = TestClient[web.Request, web.Application]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Gw:
    client: Client
    deps: Deps
    names: Names

    async def count(self, subject: str) -> int:
        info = await self.deps.bus.js.stream_info(self.names.stream_for(subject), subjects_filter=subject)
        return sum((info.state.subjects or {}).values())

    async def job(self, job_id: str, tenant: str, state: JobState = JobState.RUNNING) -> None:
        spec = JobBody(name=f"job-{job_id}", tenant=tenant, gpus=4)
        await self.deps.store.put_job(JobRecord(id=job_id, spec=spec, state=state), new=True)


@pytest_asyncio.fixture
async def gw(nats_url: str, redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[Gw]:
    names = Names(prefix=namespace)
    deps = await Deps.connect(Settings(), "gateway", nats_url, redis_url, names, tracer=noop_tracer("gateway"))
    await deps.store.open_view(ViewMark(), time.time())
    path = tmp_path / "tokens.yaml"
    path.write_text(TOKENS_YAML)
    app = build_app(deps, keepalive_s=0.3, admin_timeout_s=0.5, tokens=Tokens.load(path))

    async def inventory(m: Msg) -> None:  # stands in for inventory's drain handler
        ask = NODE_ADMIN.decode(m.data)
        await m.respond(encode(AdminReply(ok=True, state="draining" if ask.action == "drain" else "up")))

    sub = await deps.bus.nc.subscribe(names.node_admin, cb=inventory)
    try:
        async with TestClient(TestServer(app)) as client:
            yield Gw(client, deps, names)
    finally:
        await sub.unsubscribe()
        await deps.close()
        await delete_nats_namespace(nats_url, namespace.upper())
        await delete_redis_namespace(redis_url, namespace)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/jobs"), ("GET", "/v1/jobs/x"), ("DELETE", "/v1/jobs/x"), ("POST", "/v1/jobs"),
     ("GET", "/v1/cluster"), ("POST", "/v1/nodes/n1/drain"), ("GET", "/v1/events")],
)  # fmt: skip
@pytest.mark.parametrize(
    "headers",
    [{}, bearer("not-a-token-of-ours-at-all"), {"Authorization": f"Basic {ALICE}"}, {"Authorization": "Bearer "}],
    ids=["missing", "unknown", "not-bearer", "empty"],
)
async def test_no_valid_token_is_401_with_a_json_error(gw: Gw, method: str, path: str, headers: dict[str, str]) -> None:
    resp = await gw.client.request(method, path, headers=headers, json={"name": "x", "tenant": "alice", "gpus": 4})
    assert resp.status == 401
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert isinstance(body["error"], str) and body["error"]
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert await gw.count(gw.names.job_submit) == 0


async def test_probes_and_the_api_description_need_no_token(gw: Gw) -> None:
    for path in ("/healthz", "/readyz", "/openapi.json", "/v1/schemas/job.json"):
        assert (await gw.client.get(path)).status == 200, path


async def test_metrics_on_the_api_port_take_an_admin_token(gw: Gw) -> None:
    assert (await gw.client.get("/metrics")).status == 401
    assert (await gw.client.get("/metrics", headers=bearer(ALICE))).status == 403
    resp = await gw.client.get("/metrics", headers=bearer(ADMIN))
    assert resp.status == 200 and "rackscale_queue_depth" in await resp.text()


async def test_a_user_cannot_read_or_cancel_another_tenants_job(gw: Gw) -> None:
    await gw.job("bob1", "bob")
    await gw.job("alice1", "alice")
    unknown = await gw.client.get("/v1/jobs/nosuchjob", headers=bearer(ALICE))
    other = await gw.client.get("/v1/jobs/bob1", headers=bearer(ALICE))
    assert (unknown.status, other.status) == (404, 404)
    # the same answer as for an id that doesn't exist: nothing says the job is there
    assert (await other.json())["error"] == (await unknown.json())["error"].replace("nosuchjob", "bob1")

    cancel = await gw.client.delete("/v1/jobs/bob1", headers=bearer(ALICE))
    assert cancel.status == 404
    assert await gw.count(gw.names.job_cancel) == 0, "nothing reached the bus"

    assert (await gw.client.get("/v1/jobs/alice1", headers=bearer(ALICE))).status == 200
    assert (await gw.client.get("/v1/jobs/bob1", headers=bearer(BOB))).status == 200
    assert (await gw.client.get("/v1/jobs/bob1", headers=bearer(ADMIN))).status == 200
    assert (await gw.client.delete("/v1/jobs/alice1", headers=bearer(ALICE))).status == 202
    assert (await gw.client.delete("/v1/jobs/bob1", headers=bearer(ADMIN))).status == 202
    assert await gw.count(gw.names.job_cancel) == 2


async def test_a_user_lists_only_its_tenants_jobs(gw: Gw) -> None:
    for i in range(3):
        await gw.job(f"a{i}", "alice")
        await gw.job(f"b{i}", "bob")

    async def ids(token: str, **query: str) -> tuple[set[str], int]:
        resp = await gw.client.get("/v1/jobs", params=query, headers=bearer(token))
        assert resp.status == 200
        page = await resp.json()
        return {j["id"] for j in page["jobs"]}, page["total"]

    assert await ids(ALICE) == ({"a0", "a1", "a2"}, 3)
    assert await ids(ALICE, tenant="bob") == (set(), 0)
    assert await ids(ALICE, tenant="alice") == ({"a0", "a1", "a2"}, 3)
    assert (await ids(ADMIN))[1] == 6
    assert await ids(ADMIN, tenant="bob") == ({"b0", "b1", "b2"}, 3)


async def test_a_user_submits_only_as_its_tenant(gw: Gw) -> None:
    job = {"name": "x", "gpus": 4}
    assert (await gw.client.post("/v1/jobs", json={**job, "tenant": "bob"}, headers=bearer(ALICE))).status == 403
    assert await gw.count(gw.names.job_submit) == 0
    assert (await gw.client.post("/v1/jobs", json={**job, "tenant": "alice"}, headers=bearer(ALICE))).status == 202
    assert (await gw.client.post("/v1/jobs", json={**job, "tenant": "bob"}, headers=bearer(ADMIN))).status == 202
    assert await gw.count(gw.names.job_submit) == 2


async def test_a_script_without_an_account_is_the_tokens_tenants(gw: Gw) -> None:
    script = "#!/bin/bash\n#SBATCH --gpus-per-node=4\n"
    shell = {"Content-Type": "text/x-shellscript"}
    resp = await gw.client.post("/v1/jobs", data=script, headers={**bearer(ALICE), **shell})
    assert resp.status == 202
    job_id = (await resp.json())["id"]
    sub = await gw.deps.bus.js.get_last_msg(gw.names.stream_for(gw.names.job_submit), gw.names.job_submit)
    spec = JOB_INTAKE.decode(sub.data)
    assert isinstance(spec, JobSubmitted) and spec.job_id == job_id and spec.spec.tenant == "alice"
    other = script + "#SBATCH --account=bob\n"
    assert (await gw.client.post("/v1/jobs", data=other, headers={**bearer(ALICE), **shell})).status == 403


async def test_another_tenants_array_and_jobs_are_not_there_for_a_user(gw: Gw) -> None:
    """An array's id, its tasks and a dependency: another tenant's are answered as ids that don't exist."""
    spec = JobBody(name="sweep", tenant="bob", gpus=4, array="0-1")
    for i in range(2):
        rec = JobRecord(id=f"arr_{i}", spec=spec, state=JobState.RUNNING, array_id="arr", array_index=i)
        await gw.deps.store.put_job(rec, new=True)
    await gw.deps.store.index_array("arr", ["arr_0", "arr_1"])
    await gw.job("bob1", "bob")
    read = await gw.client.get("/v1/jobs/arr", headers=bearer(ALICE))
    assert read.status == 404 and (await read.json())["error"] == "unknown job arr"
    assert (await gw.client.delete("/v1/jobs/arr", headers=bearer(ALICE))).status == 404
    listed = await gw.client.get("/v1/jobs", params={"array": "arr"}, headers=bearer(ALICE))
    assert (await listed.json())["total"] == 0
    for dependency in ("afterok:bob1", "afterany:arr", "afterok:arr_0"):
        job = {"name": "x", "tenant": "alice", "gpus": 4, "dependency": dependency}
        resp = await gw.client.post("/v1/jobs", json=job, headers=bearer(ALICE))
        assert resp.status == 422 and (await resp.json())["field"] == "dependency", dependency
    assert await gw.count(gw.names.job_submit) == await gw.count(gw.names.job_cancel) == 0
    # bob (and an admin) see them
    theirs = await gw.client.get("/v1/jobs/arr", headers=bearer(BOB))
    assert "GET /v1/jobs?array=arr" in (await theirs.json())["error"]
    job = {"name": "x", "tenant": "bob", "gpus": 4, "dependency": "afterok:arr,afterany:bob1"}
    assert (await gw.client.post("/v1/jobs", json=job, headers=bearer(BOB))).status == 202
    assert (await gw.client.delete("/v1/jobs/arr", headers=bearer(ADMIN))).status == 202


async def test_only_an_admin_drains(gw: Gw) -> None:
    user = await gw.client.post("/v1/nodes/n1/drain", headers=bearer(ALICE))
    assert user.status == 403 and (await user.json())["error"]
    admin = await gw.client.post("/v1/nodes/n1/drain", headers=bearer(ADMIN), json={"reason": "tray swap"})
    assert admin.status == 200, await admin.text()
    assert await admin.json() == {"node": "n1", "state": "draining"}
    assert (await gw.client.post("/v1/nodes/n1/undrain", headers=bearer(BOB))).status == 403


async def test_the_cluster_view_hides_other_tenants_jobs(gw: Gw) -> None:
    from shared.schemas import NodeRecord

    await gw.deps.store.put_node(NodeRecord(name="n1", domain="d0"))
    await gw.job("a1", "alice")
    await gw.job("b1", "bob")
    for job_id, gpus in (("a1", [0, 1]), ("b1", [2, 3])):
        rec = AllocationRecord(job_id=job_id, attempt=1, nodes=[NodeGpus(node="n1", gpus=gpus)], committed_at=0.0)
        assert (await gw.deps.store.commit(rec)).ok

    async def owners(token: str) -> tuple[list[Any], set[str]]:
        view = await (await gw.client.get("/v1/cluster", headers=bearer(token))).json()
        gpus = [g["job"] for d in view["domains"] for n in d["nodes"] for g in n["gpus"]]
        return gpus, {a["job_id"] for a in view["allocations"]}

    assert await owners(ALICE) == (["a1", "a1", OTHER_TENANT, OTHER_TENANT], {"a1"})
    assert await owners(ADMIN) == (["a1", "a1", "b1", "b1"], {"a1", "b1"})


async def test_events_carry_only_the_callers_tenant(gw: Gw) -> None:
    from shared.schemas import JobEvent

    got: list[bytes] = []

    async def listen() -> None:
        async with gw.client.get("/v1/events", headers=bearer(ALICE)) as resp:
            assert resp.status == 200
            async for line in resp.content:
                got.append(line)
                if b"alice-done" in line:
                    return

    task = asyncio.create_task(listen())
    await asyncio.sleep(0.3)  # subscribed (the stream flushes before it answers)
    for job_id, tenant in (("bob-x", "bob"), ("alice-done", "alice")):
        ev = JobEvent(job_id=job_id, state=JobState.RUNNING, reason="", at=0.0, attempt=1, nodes=[], tenant=tenant)
        await gw.deps.bus.publish(gw.names.job_event(job_id), ev)
    try:
        await asyncio.wait_for(task, 5)
    except (TimeoutError, nats.errors.Error):
        task.cancel()
        raise
    text = b"".join(got)
    assert b"alice-done" in text and b"bob-x" not in text


# -- the dashboard: public static files, and ?token= for the EventSource alone ---------------------------------


async def test_the_dashboards_files_need_no_token_and_carry_a_strict_policy(gw: Gw) -> None:
    for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"):
        resp = await gw.client.get(path)
        assert resp.status == 200, path
        assert "script-src 'self'" in resp.headers["Content-Security-Policy"], path
        assert resp.headers["Referrer-Policy"] == "no-referrer", path
    page = await (await gw.client.get("/dashboard")).text()
    assert '<meta name="rackscale-jaeger-ui" content="http://localhost:16686">' in page
    root = await gw.client.get("/", params={"token": ALICE}, allow_redirects=False)
    assert root.status == 302 and root.headers["Location"] == f"/dashboard?token={ALICE}"


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/cluster"), ("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/metrics"), ("DELETE", "/v1/jobs/x")],
)
async def test_a_query_token_opens_only_the_event_stream(gw: Gw, method: str, path: str) -> None:
    body = {"name": "x", "tenant": "ops", "gpus": 4}
    resp = await gw.client.request(method, path, params={"token": ADMIN}, json=body)
    assert resp.status == 401, await resp.text()
    for token in ("not-a-token-of-ours-at-all", ""):
        resp = await gw.client.get("/v1/events", params={"token": token})
        assert resp.status == 401 and (await resp.json())["error"]


async def test_a_query_token_stream_is_filtered_like_a_header_one(gw: Gw) -> None:
    """Another tenant's job event becomes a bare `event: cluster` (the cluster view changed), never its id."""
    from shared.schemas import JobEvent

    got: list[bytes] = []

    async def listen() -> None:
        async with gw.client.get("/v1/events", params={"token": ALICE}) as resp:
            assert resp.status == 200
            async for line in resp.content:
                got.append(line)
                if b"alice-done" in line:
                    return

    task = asyncio.create_task(listen())
    await asyncio.sleep(0.3)  # subscribed (the stream flushes before it answers)
    for job_id, tenant in (("bob-x", "bob"), ("bob-y", "bob"), ("alice-done", "alice")):
        ev = JobEvent(job_id=job_id, state=JobState.RUNNING, reason="", at=0.0, attempt=1, nodes=[], tenant=tenant)
        await gw.deps.bus.publish(gw.names.job_event(job_id), ev)
    try:
        await asyncio.wait_for(task, 5)
    except (TimeoutError, nats.errors.Error):
        task.cancel()
        raise
    text = b"".join(got)
    assert b"alice-done" in text and b"bob-" not in text
    assert b"event: cluster\ndata: {}\n" in text
