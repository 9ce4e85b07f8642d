"""The queue's dry-run responder against real NATS and Redis: only the leader answers, from the state its cycle
uses, and answering changes nothing (no record, no event, no order; its scheduler's memory and views as they were).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import nats.js.errors
import pytest
import pytest_asyncio

from services.queue.service import QueueService
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import (
    DRY_RUN_REPLY,
    DRY_RUN_REQUEST,
    AllocationRecord,
    DryRunReply,
    DryRunRequest,
    JobBody,
    JobRecord,
    JobState,
    NodeGpus,
    TopologyBody,
    encode,
)
from shared.settings import Settings
from tests.integration.conftest import service_deps

pytestmark = pytest.mark.asyncio

NOW = 1000.0
NODES = {f"d0-n{i}": "d0" for i in range(4)} | {f"d1-n{i}": "d1" for i in range(4)}  # two domains of 4 nodes


@pytest_asyncio.fixture
async def queue(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[QueueService]:
    async with service_deps(nats_url, redis_url, namespace, NODES, clock=lambda: NOW) as deps:
        yield QueueService(deps)


async def _running(q: QueueService, job_id: str, nodes: list[str], end: float) -> None:
    """A job running on every GPU of `nodes` (committed), expected to end at `end`."""
    placed = [NodeGpus(n, [0, 1, 2, 3]) for n in nodes]
    body = JobBody(name=job_id, tenant="t", gpus=4 * len(nodes), expected_runtime_s=end - NOW)
    rec = JobRecord(
        id=job_id, spec=body, state=JobState.RUNNING, attempt=1, allocation=placed, started_at=NOW, domains=["d0"]
    )
    await q.store.put_job(rec, new=True)
    assert (await q.store.commit(AllocationRecord(job_id=job_id, attempt=1, nodes=placed, committed_at=NOW))).ok


def _ask(gpus: int, **topology: object) -> DryRunRequest:
    body = JobBody(name="c", tenant="t", gpus=gpus, topology=TopologyBody(**topology))  # type: ignore[arg-type]
    return DryRunRequest(job_id="candidate", spec=body, submitted_at=NOW)


async def _answers(q: QueueService, ask: DryRunRequest, wait_s: float = 0.5) -> list[DryRunReply]:
    """Every reply to one request within `wait_s` (several replicas may hear it)."""
    inbox = q.bus.nc.new_inbox()
    sub = await q.bus.nc.subscribe(inbox)
    await q.bus.nc.publish(q.names.dry_run, encode(ask), reply=inbox)
    replies: list[DryRunReply] = []
    try:
        while True:
            replies.append(DRY_RUN_REPLY.decode((await sub.next_msg(timeout=wait_s)).data))
    except TimeoutError:
        return replies
    finally:
        await sub.unsubscribe()


async def test_the_leader_answers_where_a_job_would_go_and_a_follower_stays_silent(
    queue: QueueService, nats_url: str, redis_url: str, namespace: str
) -> None:
    leader = queue
    names = Names(prefix=namespace)
    deps = await Deps.connect(Settings(prefix=namespace), "queue", nats_url, redis_url, names, clock=lambda: NOW)
    try:
        follower = QueueService(deps)
        assert await leader._lead() and not await follower._lead()
        for q in (leader, follower):
            await q.bus.subscribe(names.dry_run, DRY_RUN_REQUEST, q._on_dry_run)
            await q.bus.nc.flush()
        await _running(leader, "a", ["d0-n0", "d0-n1", "d0-n2"], end=NOW + 600)
        await leader.run_cycle(full=True)  # the leader's view is complete
        scheduler_memory = dict(vars(leader.scheduler))
        jobs_before = await leader.store.list_jobs(limit=100)
        streams_before = [await _count(leader, s) for s in _streams(names)]

        # 8 GPUs (2 nodes) in one domain: d0 has one node left, d1 is free: it starts now in d1
        (now,) = await _answers(leader, _ask(8))
        assert now.ok and now.start == "now" and now.domains == ["d1"] and now.gpus == 8, now
        assert len(now.allocation) == 2 and all(ng.node.startswith("d1-") for ng in now.allocation), now
        # two segments of 4 nodes: one domain is free, the other is job a's until its expected end
        (later,) = await _answers(leader, _ask(32, segment=4))
        assert later.ok and later.start == "later" and later.reserved, later
        assert later.forecast_start == NOW + 600 and sorted(later.domains) == ["d0", "d1"] and later.gpus == 32
        assert later.reason.startswith("needs 2 segments of 4 nodes") and "reserved to start in ~10 min" in later.reason

        # nothing changed: no record, no submit, event or order; the leader's memory as it was
        assert await leader.store.get_job("candidate") is None
        assert await leader.store.list_jobs(limit=100) == jobs_before
        assert "candidate" not in leader.jobs.ids()
        assert dict(vars(leader.scheduler)) == scheduler_memory
        assert [await _count(leader, s) for s in _streams(names)] == streams_before

        # a leader whose view is being rebuilt says nothing either: the gateway answers 503
        leader._view_ready = False
        assert await _answers(leader, _ask(8), wait_s=0.3) == []
    finally:
        await deps.close()


def _streams(names: Names) -> tuple[str, ...]:
    return (names.job_submit, names.events_all, names.orders)


async def _count(q: QueueService, subject: str) -> int:
    """Messages the stream of `subject` holds (0 while it doesn't exist)."""
    try:
        info = await q.bus.js.stream_info(q.names.stream_for(subject))
    except nats.js.errors.NotFoundError:
        return 0
    return int(info.state.messages)


async def test_a_dry_run_waits_for_a_cycle_under_way(queue: QueueService) -> None:
    # the answer is decided between cycles, never on a state a cycle is half way through writing
    assert await queue._lead()
    await queue.run_cycle(full=True)
    async with queue._deciding:  # a cycle holds it while it decides and writes
        asked = asyncio.ensure_future(queue.dry_run(_ask(4)))
        await asyncio.sleep(0.05)
        assert not asked.done()
    reply = await asyncio.wait_for(asked, 5)
    assert reply.ok and reply.start == "now"


async def test_a_dry_run_is_held_by_its_dependency_as_the_cycle_would_hold_it(queue: QueueService) -> None:
    """The gate's rules come before the core's decision, in a dry run as in the cycle: a job waiting for another
    one's end would wait (its reason the gate's), one whose dependency can never be met would never start."""
    assert await queue._lead()
    await _running(queue, "a", ["d0-n0"], end=NOW + 600)
    ended = JobRecord(
        id="f", spec=JobBody(name="f", tenant="t", gpus=4), state=JobState.FAILED, attempt=1, submitted_at=NOW
    )
    await queue.store.put_job(ended, new=True)
    await queue.run_cycle(full=True)

    def ask(dependency: str) -> DryRunRequest:
        body = JobBody(name="c", tenant="t", gpus=4, dependency=dependency)
        return DryRunRequest(job_id="candidate", spec=body, submitted_at=NOW)

    free = await queue.dry_run(ask(""))
    assert free.ok and free.start == "now", free
    waits = await queue.dry_run(ask("afterok:a"))
    assert waits.ok and (waits.start, waits.allocation) == ("later", []) and "afterok: a" in waits.reason, waits
    assert waits.reason == "waits for afterok: a (not ended)"
    # f failed (no event of it in the log: the record's word stands), so afterok on it can never be met
    never = await queue.dry_run(ask("afterok:f"))
    assert never.ok and never.start == "never" and never.reason == "dependency can never be met: afterok:f failed"
    assert await queue.store.get_job("candidate") is None and "candidate" not in queue.jobs.ids()
