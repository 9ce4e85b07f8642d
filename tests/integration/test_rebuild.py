"""The view rebuilt from a real JetStream log into a real Redis (services/queue/rebuild.py `rebuild_view`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.queue import rebuild
from shared import lifecycle
from shared.joblog import LogEntry
from shared.runtime import Deps
from shared.schemas import (
    Committed,
    JobBody,
    JobCancel,
    JobState,
    JobSubmitted,
    NodeGpus,
    RankExited,
    RankStarted,
    TopologyBody,
)
from tests.integration.conftest import service_deps

pytestmark = pytest.mark.asyncio

NODES = {"n0": "d0", "n1": "d0"}
HERE = [NodeGpus("n0", [0, 1, 2, 3]), NodeGpus("n1", [0, 1, 2, 3])]


async def _log_one_job(deps: Deps, job: str) -> None:
    """A job's whole life as it is logged: its submit; placement's commit and the agents' messages in the inbox."""
    n, bus = deps.names, deps.bus
    submit = JobSubmitted(job_id=job, spec=JobBody(name=job, tenant="t", gpus=8), submitted_at=1.0)
    await bus.publish(n.job_submit, submit)
    await bus.publish(n.job_event(job), lifecycle.event_of(lifecycle.submitted(submit, 1.0)))
    await bus.publish(n.placement_events, Committed(job_id=job, attempt=1, nodes=HERE, at=2.0))
    for r in (0, 1):
        await bus.publish(n.agent_events, RankStarted(job_id=job, attempt=1, node=f"n{r}", rank=r, pid=r, at=3.0))
    for r in (0, 1):
        await bus.publish(n.agent_events, RankExited(job_id=job, attempt=1, node=f"n{r}", rank=r, exit_code=0, at=4.0))


@pytest_asyncio.fixture
async def deps(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Deps]:
    async with service_deps(nats_url, redis_url, namespace, NODES, time.time) as d:
        await d.bus.ensure_streams()
        yield d


async def test_an_empty_view_is_rebuilt_from_the_log(deps: Deps) -> None:
    await _log_one_job(deps, "j1")
    await deps.store.close_view()
    done = await rebuild.rebuild_view(deps.bus, deps.store, None, time.time())
    rec = await deps.store.get_job("j1")
    assert rec is not None and (rec.state, rec.attempt) == (JobState.SUCCEEDED, 1)
    assert done.jobs == 1 and done.allocations == 0
    assert (await deps.store.view_status())[0] == "ready"


async def test_a_running_flexible_elastic_job_keeps_its_layout_and_gpus_through_a_rebuild(deps: Deps) -> None:
    """A flexible (segments of 2 or 1 node) elastic (4-8 GPUs) job, placed on its smaller layout and running: the
    view rebuilt from the log has it running on the same GPUs, with the layout it got (issue 23)."""
    n, bus = deps.names, deps.bus
    body = JobBody(
        name="fx", tenant="t", gpus=8, min_gpus=4, checkpointable=True, topology=TopologyBody(segment=[2, 1])
    )
    submit = JobSubmitted(job_id="fx", spec=body, submitted_at=1.0)
    await bus.publish(n.job_submit, submit)
    await bus.publish(n.job_event("fx"), lifecycle.event_of(lifecycle.submitted(submit, 1.0)))
    await bus.publish(n.placement_events, Committed(job_id="fx", attempt=1, nodes=HERE, at=2.0, segment=1))
    for r in (0, 1):
        await bus.publish(n.agent_events, RankStarted(job_id="fx", attempt=1, node=f"n{r}", rank=r, pid=r, at=3.0))
    await deps.store.close_view()
    done = await rebuild.rebuild_view(deps.bus, deps.store, None, time.time())
    rec = await deps.store.get_job("fx")
    assert rec is not None and (rec.state, rec.attempt, rec.segment) == (JobState.RUNNING, 1, 1), rec
    assert rec.allocation == HERE and rec.spec.min_gpus == 4
    held = await deps.store.allocation("fx")
    assert held is not None and held.nodes == HERE
    assert done.jobs == 1 and done.allocations == 1


async def test_an_arrays_tasks_and_a_doomed_dependant_come_back_from_the_log(deps: Deps) -> None:
    """One submit of an array of 3 (one task ran and succeeded) and a dependant the queue cancelled as never to be
    met: rebuilt from the log, the same three tasks (their index too, so the array lists and cancels), and the
    dependant cancelled with its reason (its JobEvent)."""
    n, bus = deps.names, deps.bus
    body = JobBody(name="sweep", tenant="t", gpus=8, array="0-4:2%1")
    submit = JobSubmitted(job_id="arr", spec=body, submitted_at=1.0)
    await bus.publish(n.job_submit, submit)
    for rec in lifecycle.submitted_jobs(submit, 1.0):
        await bus.publish(n.job_event(rec.id), lifecycle.event_of(rec))
    await bus.publish(n.placement_events, Committed(job_id="arr_2", attempt=1, nodes=HERE, at=2.0))
    for r in (0, 1):
        await bus.publish(n.agent_events, RankStarted(job_id="arr_2", attempt=1, node=f"n{r}", rank=r, pid=r, at=3.0))
    for r in (0, 1):
        exited = RankExited(job_id="arr_2", attempt=1, node=f"n{r}", rank=r, exit_code=0, at=4.0)
        await bus.publish(n.agent_events, exited)
    dep = JobSubmitted(
        job_id="d", spec=JobBody(name="d", tenant="t", gpus=4, dependency="afternotok:arr"), submitted_at=2.0
    )
    await bus.publish(n.job_submit, dep)
    doomed = lifecycle.cancelled(
        lifecycle.submitted(dep, 2.0), JobCancel(job_id="d", at=5.0, reason="dependency can never be met: x"), 5.0
    )
    assert doomed is not None
    await bus.publish(n.job_event("d"), lifecycle.event_of(doomed))

    await deps.store.close_view()
    done = await rebuild.rebuild_view(deps.bus, deps.store, None, time.time())
    assert done.jobs == 4
    assert await deps.store.array_task_ids("arr") == ["arr_0", "arr_2", "arr_4"]
    tasks = {r.id: r for r in await deps.store.get_jobs(["arr_0", "arr_2", "arr_4"])}
    assert {t: (r.state, r.array_id, r.array_index) for t, r in tasks.items()} == {
        "arr_0": (JobState.PENDING, "arr", 0),
        "arr_2": (JobState.SUCCEEDED, "arr", 2),
        "arr_4": (JobState.PENDING, "arr", 4),
    }
    assert await deps.store.get_job("arr") is None  # the array's id is no job
    rec = await deps.store.get_job("d")
    assert rec is not None and (rec.state, rec.reason) == (JobState.CANCELLED, "dependency can never be met: x")
    page, total = await deps.store.list_jobs(array="arr")
    assert [r.id for r in page] == ["arr_0", "arr_2", "arr_4"] and total == 3


async def test_a_log_read_short_writes_nothing_and_leaves_the_view_closed(
    deps: Deps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events log came back without its last messages (as a read that lost a race once did): the rebuild
    refuses to open a view that would run a finished job again."""
    await _log_one_job(deps, "j1")
    read_log = rebuild.read_log

    async def short(*args: object, **kw: object) -> AsyncIterator[LogEntry]:
        entries = [e async for e in read_log(*args, **kw)]  # type: ignore[arg-type]
        for e in entries[: len(entries) // 2] if args[2] == deps.names.events_all else entries:
            yield e

    monkeypatch.setattr(rebuild, "read_log", short)
    await deps.store.close_view()
    with pytest.raises(rebuild.LogReadShort):
        await rebuild.rebuild_view(deps.bus, deps.store, None, time.time())
    assert not await deps.store.r.exists(deps.names.job_key("j1"))  # no record written
    assert (await deps.store.view_status())[0] == "rebuilding"
