"""The queue's gate (services/queue/gate.py) against a real JetStream log and Redis: what the eligibility rules are
told, and that a job's end counts only once its last JobEvent in the log says it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.queue.gate import Gate
from shared import lifecycle
from shared.runtime import Deps
from shared.schemas import JobBody, JobCancel, JobRecord, JobState, JobSubmitted
from tests.integration.conftest import service_deps

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def deps(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Deps]:
    async with service_deps(nats_url, redis_url, namespace, {}, time.time) as d:
        await d.bus.ensure_streams()
        yield d


def job(job_id: str, dependency: str = "", name: str = "j", state: JobState = JobState.PENDING) -> JobRecord:
    body = JobBody(name=name, tenant="t", gpus=4, dependency=dependency)
    return JobRecord(id=job_id, spec=body, state=state, submitted_at=1.0)


async def test_an_end_counts_once_the_log_says_it(deps: Deps) -> None:
    gate = Gate(deps.store, deps.bus.js, deps.names)
    dep = job("d", "afterany:x")
    ended = job("x", state=JobState.CANCELLED)
    await deps.store.put_job(ended, new=True)  # the record says it ended; its event isn't out yet
    await deps.bus.publish(deps.names.job_event("x"), lifecycle.event_of(job("x")))  # its pending event is
    out = await gate.sift({"d": dep}, {"d": dep}, set())
    assert out.eligible == [] and out.held == {"d": "waits for afterany: x (not ended)"}
    assert "x" not in gate.ends
    await deps.bus.publish(deps.names.job_event("x"), lifecycle.event_of(ended))
    out = await gate.sift({"d": dep}, {"d": dep}, set())
    assert out.eligible == ["d"] and gate.ends["x"] == "cancelled"
    # kept: no more reads for it (a record changed behind its back is not looked at again)
    await deps.store.r.delete(deps.names.job_key("x"))
    assert (await gate.sift({"d": dep}, {"d": dep}, set())).eligible == ["d"]


async def test_an_unknown_id_dooms_and_an_array_id_means_its_tasks(deps: Deps) -> None:
    gate = Gate(deps.store, deps.bus.js, deps.names)
    body = JobBody(name="sweep", tenant="t", gpus=4, array="0-1")
    tasks = lifecycle.submitted_jobs(JobSubmitted(job_id="arr", spec=body, submitted_at=1.0), 1.0)
    for rec in tasks:
        await deps.store.put_job(rec, new=True)
    await deps.store.index_array("arr", [r.id for r in tasks])
    on_array, on_nothing = job("a", "afterok:arr"), job("n", "afterok:ghost")
    candidates = {"a": on_array, "n": on_nothing}
    # the tasks are active (in what the queue keeps): waiting
    out = await gate.sift(candidates, {**candidates, **{r.id: r for r in tasks}}, set())
    assert out.held == {"a": "waits for afterok: arr (array: 0 of 2 tasks ended)"}
    assert out.doomed == {"n": "dependency can never be met: afterok:ghost is no job"}
    assert gate.arrays == {"arr": ("arr_0", "arr_1")}
    # one task cancelled (and logged so): afterok on the array can never be met
    cancelled = lifecycle.cancelled(tasks[1], JobCancel(job_id="arr_1", at=2.0), 2.0)
    assert cancelled is not None
    await deps.store.put_job(cancelled)
    await deps.bus.publish(deps.names.job_event("arr_1"), lifecycle.event_of(cancelled))
    out = await gate.sift({"a": on_array}, {"a": on_array, "arr_0": tasks[0]}, set())
    assert out.doomed == {"a": "dependency can never be met: afterok:arr (its task arr_1 cancelled)"}


async def test_a_job_holding_an_allocation_counts_as_running(deps: Deps) -> None:
    """An ended singleton whose GPUs aren't released yet (its record gone from what the queue keeps) still holds
    the next one of its name: its end's event goes out before the release, so the next starts after it in the log."""
    gate = Gate(deps.store, deps.bus.js, deps.names)
    done = job("s1", "singleton", name="nightly", state=JobState.SUCCEEDED)
    await deps.store.put_job(done, new=True)
    nxt = job("s2", "singleton", name="nightly")
    out = await gate.sift({"s2": nxt}, {"s2": nxt}, {"s1"})
    assert out.held == {"s2": "singleton: waits for s1 (running) of name nightly"}
    assert (await gate.sift({"s2": nxt}, {"s2": nxt}, set())).eligible == ["s2"]


async def test_jobs_without_rules_pass_without_a_look(deps: Deps) -> None:
    gate = Gate(deps.store, deps.bus.js, deps.names)
    plain = {f"p{i}": job(f"p{i}") for i in range(3)}
    await deps.store.close_view()  # any read would refuse now: none is made
    out = await gate.sift(plain, plain, {"elsewhere"})
    assert out.eligible == ["p0", "p1", "p2"] and not out.held and not out.doomed
