"""The queue's event handlers against real NATS and Redis, on races the end-to-end runs hit only under load.

A rank's start follows its commit in the queue's inbox, but a commit handed to a process that died comes
back only after its ack wait, so a start can still come first, also after the job's order timed out and the
job was decided again. It must wait for the commit (redelivered later) and then count, with the placed event
logged before the running one, and never be dropped (the job would stay placed for ever).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import nats
import nats.js.errors
import pytest
import pytest_asyncio

from services.placement.service import PlacementService
from services.queue.service import INFLIGHT_TIMEOUT_S, QueueService, RankStarts, _starts
from shared import lifecycle
from shared.bus import Retry
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import (
    EVENTS,
    ORDERS,
    AllocationRecord,
    CheckpointOrder,
    Committed,
    JobBody,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    MoveTicket,
    NodeGpus,
    PlaceOrder,
    RankExited,
    RankStarted,
    ReleaseOrder,
)
from shared.settings import Settings
from tests.integration.conftest import service_deps

pytestmark = pytest.mark.asyncio

NOW = 1000.0


@pytest_asyncio.fixture
async def queue(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[QueueService]:
    async with service_deps(nats_url, redis_url, namespace, {"n0": "d0", "n1": "d0"}, clock=lambda: NOW) as deps:
        yield QueueService(deps)


async def _events(q: QueueService, job: str) -> list[tuple[str, int]]:
    """The job's events as stored in the stream, in order: (state, attempt)."""
    return [(str(ev.state), ev.attempt) for ev in await _logged(q, job)]


async def _logged(q: QueueService, job: str) -> list[JobEvent]:
    """The job's events as stored in the stream, in order."""
    sub = await q.bus.js.subscribe(q.names.job_event(job), ordered_consumer=True)
    out: list[JobEvent] = []
    try:
        while True:
            ev = EVENTS.decode((await sub.next_msg(timeout=0.5)).data)
            assert isinstance(ev, JobEvent)
            out.append(ev)
    except TimeoutError:
        return out
    finally:
        await sub.unsubscribe()


async def _migrating(q: QueueService, migration_id: str, target: list[NodeGpus], since: float) -> JobRecord:
    """Store job j, checkpointable, running attempt 1 on n0's GPU 0 (committed) and now migrating to `target`."""
    old = [NodeGpus("n0", [0])]
    assert (await q.store.commit(AllocationRecord(job_id="j", attempt=1, nodes=old, committed_at=NOW))).ok
    move = MoveTicket(migration_id=migration_id, target=target, reason="shrunk", since=since)
    body = JobBody(name="j", tenant="t", gpus=1, gpus_per_node=1, checkpointable=True)
    rec = JobRecord(
        id="j", spec=body, state=JobState.MIGRATING, attempt=1, allocation=old, started_ranks=[0], move=move
    )
    await q.store.put_job(rec, new=True)
    return rec


def _job(**kw: object) -> JobRecord:
    return JobRecord(id="j", spec=JobBody(name="j", tenant="t", gpus=1, gpus_per_node=1), **kw)  # type: ignore[arg-type]


def _started(attempt: int) -> RankStarted:
    return RankStarted(job_id="j", attempt=attempt, node="n0", rank=0, pid=1, at=NOW)


async def test_a_start_before_its_commit_waits_for_it(queue: QueueService) -> None:
    order = [NodeGpus("n0", [0])]
    await queue.store.put_job(_job(attempt=1, inflight_since=NOW, allocation=order), new=True)
    before = await queue.store.get_job("j")
    with pytest.raises(Retry):
        await queue.on_started(_started(1))
    assert (await queue.store.get_job("j")) == before
    await queue.on_committed(Committed(job_id="j", attempt=1, nodes=order, at=NOW), {})
    await queue.on_started(_started(1))  # redelivered
    rec = await queue.store.get_job("j")
    assert rec is not None and (rec.state, rec.attempt, rec.allocation) == (JobState.RUNNING, 1, order)
    assert rec.inflight_since is None and rec.domains == ["d0"]
    assert await _events(queue, "j") == [("placed", 1), ("running", 1)]


async def test_a_gangs_starts_heard_together_run_it_with_one_running_event(queue: QueueService) -> None:
    order = [NodeGpus("n0", [0]), NodeGpus("n1", [0]), NodeGpus("n2", [0])]
    await queue.store.put_job(_job(attempt=1, inflight_since=NOW, allocation=order), new=True)
    await queue.on_committed(Committed(job_id="j", attempt=1, nodes=order, at=NOW), {})
    starts = [RankStarted(job_id="j", attempt=1, node=f"n{r}", rank=r, pid=1, at=NOW) for r in range(3)]
    merged = _starts(_starts(starts[0], starts[1]), starts[2])
    assert merged == RankStarts(tuple(starts))
    other = RankStarted(job_id="j", attempt=2, node="n1", rank=1, pid=1, at=NOW)
    assert _starts(starts[0], other) is None  # another attempt's
    await queue.on_event(merged, {})
    rec = await queue.store.get_job("j")
    assert rec is not None and (rec.state, rec.started_ranks) == (JobState.RUNNING, [0, 1, 2])
    assert await _events(queue, "j") == [("placed", 1), ("running", 1)]


async def test_a_start_of_an_attempt_that_timed_out_waits_for_its_late_commit(queue: QueueService) -> None:
    # attempt 1's order timed out and attempt 2's is in flight, but placement committed attempt 1 after all
    held = [NodeGpus("n0", [0])]
    await queue.store.put_job(_job(attempt=2, inflight_since=NOW, allocation=[NodeGpus("n1", [0])]), new=True)
    assert (await queue.store.commit(AllocationRecord(job_id="j", attempt=1, nodes=held, committed_at=NOW))).ok
    with pytest.raises(Retry):
        await queue.on_started(_started(1))
    await queue.on_committed(Committed(job_id="j", attempt=1, nodes=held, at=NOW), {})
    await queue.on_started(_started(1))
    rec = await queue.store.get_job("j")
    assert rec is not None and (rec.state, rec.attempt, rec.allocation) == (JobState.RUNNING, 1, held)
    assert await _events(queue, "j") == [("placed", 1), ("running", 1)]


@pytest.mark.parametrize("released", [True, False])
async def test_a_late_start_of_a_preempted_attempt_is_dropped(queue: QueueService, released: bool) -> None:
    # attempt 1 was placed, then preempted and requeued as attempt 2; its release may not have reached
    # placement yet (its allocation still there): attempt 1's late start or commit must not revive it
    held = [NodeGpus("n0", [0])]
    await queue.store.put_job(_job(attempt=2, floor=1, reason="requeued"), new=True)
    assert (await queue.store.commit(AllocationRecord(job_id="j", attempt=1, nodes=held, committed_at=NOW))).ok
    if released:
        assert await queue.store.release("j")
    await queue.on_started(_started(1))
    await queue.on_committed(Committed(job_id="j", attempt=1, nodes=held, at=NOW), {})
    rec = await queue.store.get_job("j")
    assert rec is not None and (rec.state, rec.attempt, rec.reason) == (JobState.PENDING, 2, "requeued")
    assert await _events(queue, "j") == []


async def test_a_release_for_one_attempt_keeps_a_newer_attempts_gpus(queue: QueueService) -> None:
    # the queue gives back a stale commit's GPUs by attempt: the job may hold a newer attempt's by then
    placement = PlacementService(queue.deps)
    held = [NodeGpus("n0", [0, 1])]
    assert (await queue.store.commit(AllocationRecord(job_id="j", attempt=2, nodes=held, committed_at=NOW))).ok
    await placement.release(ReleaseOrder(job_id="j", reason="job is cancelled", only_attempt=1), {})
    assert await queue.store.gpu_owners("n0") == {0: "j", 1: "j"}
    await placement.release(ReleaseOrder(job_id="j", reason="job is cancelled", only_attempt=2), {})
    assert await queue.store.gpu_owners("n0") == {}


@pytest.mark.parametrize("stop_ranks", [True, False])
async def test_a_release_stops_the_ranks_unless_they_all_exited(queue: QueueService, stop_ranks: bool) -> None:
    # a job that ended on its own (every rank exited) has nothing left to stop: no StopRank goes out
    placement = PlacementService(queue.deps)
    held = [NodeGpus("n0", [0]), NodeGpus("n1", [0])]
    assert (await queue.store.commit(AllocationRecord(job_id="j", attempt=1, nodes=held, committed_at=NOW))).ok
    commands = await queue.bus.nc.subscribe(queue.names.agent_cmd_all)
    await placement.release(ReleaseOrder(job_id="j", reason="job succeeded", stop_ranks=stop_ranks), {})
    await queue.bus.nc.flush()
    got: list[str] = []
    with contextlib.suppress(TimeoutError, nats.errors.TimeoutError):
        while True:
            got.append((await commands.next_msg(timeout=0.3)).subject)
    assert sorted(got) == ([queue.names.agent_cmd("n0"), queue.names.agent_cmd("n1")] if stop_ranks else [])
    assert await queue.store.gpu_owners("n0") == {} and await queue.store.allocation("j") is None


async def test_a_job_whose_ranks_all_exited_is_released_without_stopping_them(queue: QueueService) -> None:
    alloc = [NodeGpus("n0", [0]), NodeGpus("n1", [0])]
    await queue.store.put_job(
        _job(state=JobState.RUNNING, attempt=1, allocation=alloc, started_ranks=[0, 1], exit_codes={"n0/0": 0}),
        new=True,
    )
    orders = await queue.bus.nc.subscribe(queue.names.orders)
    await queue.on_exited(RankExited(job_id="j", attempt=1, node="n1", rank=1, exit_code=0, at=NOW))
    order = ORDERS.decode((await orders.next_msg(timeout=2)).data)
    assert isinstance(order, ReleaseOrder) and not order.stop_ranks, order


async def test_a_job_another_replica_took_in_reaches_the_leaders_kicked_cycle(
    queue: QueueService, nats_url: str, redis_url: str, namespace: str
) -> None:
    # the leader's kicked cycles decide on what it wrote itself; a job another replica stored is in no memory
    # of the leader's until that replica's kick (queue.kick) makes the leader ask for the undecided ids
    leader = queue
    names = Names(prefix=namespace)
    deps = await Deps.connect(Settings(prefix=namespace), "queue", nats_url, redis_url, names, clock=lambda: NOW)
    try:
        other = QueueService(deps)
        assert await leader._lead() and not await other._lead()
        await leader.bus.nc.subscribe(names.cycle_kick, cb=leader._on_kick)
        await leader.bus.nc.flush()  # the server has the subscription before anyone kicks (core NATS: no replay)
        await leader.run_cycle(full=True)  # the leader's view is complete; nothing foreign since
        await other.store.create_job(_job(state=JobState.PENDING))

        await leader.run_cycle(full=False)
        assert "j" not in leader.jobs.records()  # not asked: no kick from the other replica yet

        other.wake()  # what its intake does after storing the job
        await leader.bus.nc.flush()
        for _ in range(200):
            if leader._foreign:
                break
            await asyncio.sleep(0.01)
        assert leader._foreign, "the other replica's kick did not reach the leader"
        await leader.run_cycle(full=False)
        assert "j" in leader.jobs.records()
    finally:
        await deps.close()


async def test_an_arrays_task_is_announced_before_a_cycle_can_decide_on_it(queue: QueueService) -> None:
    # A cycle runs while an array's later tasks are still being written. Every task it can decide on (in what
    # the queue keeps) must have its pending event logged already, or its placed event could come first.
    body = JobBody(name="sweep", tenant="t", gpus=1, gpus_per_node=1, array="0-3")
    create = queue.store.create_job
    seen: dict[str, list[tuple[str, int]]] = {}

    async def slow_after_the_first(rec: JobRecord) -> tuple[JobRecord, bool]:
        if rec.array_index:
            await asyncio.sleep(0.3)  # the first task is stored (and its cycle may run) while these wait
        return await create(rec)

    async def a_cycle_meanwhile() -> None:
        await asyncio.sleep(0.15)
        for job in queue.jobs.pending():  # what the stream holds at this instant (no waiting for more)
            subject = queue.names.job_event(job)
            try:
                last = await queue.bus.js.get_last_msg(queue.names.stream_for(subject), subject)
            except nats.js.errors.NotFoundError:
                seen[job] = []
                continue
            ev = EVENTS.decode(last.data)
            assert isinstance(ev, JobEvent)
            seen[job] = [(str(ev.state), ev.attempt)]

    queue.store.create_job = slow_after_the_first  # type: ignore[method-assign]
    await asyncio.gather(
        queue.on_submit(JobSubmitted(job_id="arr", spec=body, submitted_at=NOW), {}), a_cycle_meanwhile()
    )
    assert list(seen) == ["arr_0"], seen  # only the first was decidable then
    assert seen["arr_0"] == [("pending", 0)]
    assert [await _events(queue, f"arr_{i}") for i in range(4)] == [[("pending", 0)]] * 4


@pytest.mark.parametrize("rule", ["singleton", "array"])
async def test_a_job_whose_order_timed_out_keeps_its_turn(
    nats_url: str, redis_url: str, namespace: str, rule: str
) -> None:
    # The first of two singletons (or of an array's tasks under %1) is ordered, and placement never answers
    # (frozen, then killed; it may still commit that order late). The cycle that takes the order back must not
    # start the second in its place: the first is pending again, ahead of it.
    now = [NOW]
    async with service_deps(nats_url, redis_url, namespace, {"n0": "d0"}, clock=lambda: now[0]) as deps:
        queue = QueueService(deps)
        if rule == "singleton":
            body = JobBody(name="nightly", tenant="t", gpus=1, gpus_per_node=1, dependency="singleton")
            for i, job in enumerate(["first", "second"]):
                await queue.on_submit(JobSubmitted(job_id=job, spec=body, submitted_at=NOW + i), {})
            ids, waits = ["first", "second"], "singleton: waits for first (pending) of name nightly"
        else:
            body = JobBody(name="sweep", tenant="t", gpus=1, gpus_per_node=1, array="0-1%1")
            await queue.on_submit(JobSubmitted(job_id="arr", spec=body, submitted_at=NOW), {})
            ids, waits = ["arr_0", "arr_1"], "array arr: 0 of %1 running, 1 next"
        await queue.run_cycle(full=True)
        first, second = await queue.store.get_jobs(ids)
        assert first.inflight_since is not None and second.inflight_since is None
        assert second.reason == waits  # as the gate saw it before the order

        now[0] += INFLIGHT_TIMEOUT_S + 1  # no answer from placement
        await queue.run_cycle(full=True)  # takes the first's order back
        first, second = await queue.store.get_jobs(ids)
        assert (first.state, first.inflight_since) == (JobState.PENDING, None)
        assert second.inflight_since is None, "the second was ordered while the first waits ahead of it"
        assert second.reason == waits
        await queue.run_cycle(full=True)  # the first's turn again, a new attempt
        first, second = await queue.store.get_jobs(ids)
        assert (first.inflight_since, first.attempt) == (now[0], 2) and second.inflight_since is None
        assert await _events(queue, second.id) == [("pending", 0)]


async def test_kicks_that_keep_coming_dont_put_the_full_cycle_off(queue: QueueService) -> None:
    # A busy system kicks the cycle many times a second. The full cycle (every active job and allocation read,
    # the reservations forecast anew) must still come every period, not only after a period without kicks.
    t = [0.0]
    queue.timer_clock = lambda: t[0]
    asked: list[bool] = []

    async def cycle(*, full: bool = True) -> None:  # which cycles the loop asks for is what's tested here
        asked.append(full)

    queue.run_cycle = cycle  # type: ignore[method-assign]
    loop = asyncio.ensure_future(queue.cycle_loop())
    await asyncio.sleep(0)  # the loop reads the clock at 0: the first full cycle is due at 1
    try:
        for i in range(12):  # a kick every quarter period (cycle_interval_s is 1 s)
            t[0] = 0.25 * (i + 1)
            queue.kick.set()
            for _ in range(500):
                if len(asked) > i:
                    break
                await asyncio.sleep(0.001)
        assert asked == [False, False, False, True] * 3
    finally:
        queue.stop_event.set()
        queue.kick.set()
        await loop


@pytest.mark.parametrize("redelivered", [True, False])
async def test_a_redelivered_last_checkpoint_ack_sends_the_moves_release_and_restore_again(
    queue: QueueService, redelivered: bool
) -> None:
    # A move's last checkpoint ack: the queue writes the next attempt (pending, its pinned order in flight), then
    # sends the release of the old GPUs and the restore order. A queue killed between the write and the sends
    # leaves the ack unacked: its redelivery must send them again, or the job waits for ever (the old GPUs held,
    # so no cycle decides it again). A plain redelivery after the sends re-sends them under the same msg ids.
    target = [NodeGpus("n1", [0])]
    migrating = await _migrating(queue, "resize-j-1", target, NOW)
    ack = RankExited(job_id="j", attempt=1, node="n0", rank=0, exit_code=0, at=NOW, checkpointed=True)
    if redelivered:
        written = lifecycle.checkpointed(migrating, ack, NOW)  # what the killed queue wrote before it died
        assert written is not None
        await queue.store.put_job(written)
    orders = await queue.bus.nc.subscribe(queue.names.orders)
    await queue.on_exited(ack)
    got = [ORDERS.decode((await orders.next_msg(timeout=2)).data) for _ in range(2)]
    assert isinstance(got[0], ReleaseOrder) and got[0].only_attempt == 1, got
    assert isinstance(got[1], PlaceOrder) and (got[1].attempt, got[1].nodes, got[1].restore) == (2, target, "j:1")
    rec = await queue.store.get_job("j")
    assert rec is not None and (rec.state, rec.attempt, rec.allocation) == (JobState.PENDING, 2, target)


@pytest.mark.parametrize(
    ("migration_id", "since", "resent"),
    [("resize-j-1", NOW - 600, True), ("resize-j-1", NOW - 1, False), ("m-7", NOW - 600, False)],
)
async def test_the_cycles_own_resize_gets_its_checkpoint_order_again_when_it_hangs(
    queue: QueueService, migration_id: str, since: float, resent: bool
) -> None:
    # A shrink is a move the queue starts itself (no migration service watches it): killed between writing the
    # job migrating and sending the checkpoint order, the queue leaves nobody to send it. Past the in-flight
    # timeout the full cycle sends it again (same msg id); the job stays migrating, its work kept. A fresh resize,
    # and the migration service's own moves (it watches those itself), are left alone.
    migrating = await _migrating(queue, migration_id, [NodeGpus("n0", [0])], since)
    move = migrating.move
    orders = await queue.bus.nc.subscribe(queue.names.orders)
    await queue.run_cycle(full=True)
    rec = await queue.store.get_job("j")
    assert rec is not None and rec.state is JobState.MIGRATING and rec.move == move, rec
    if not resent:
        with pytest.raises(TimeoutError):
            await orders.next_msg(timeout=0.5)
        return
    got = ORDERS.decode((await orders.next_msg(timeout=2)).data)
    assert isinstance(got, CheckpointOrder) and (got.job_id, got.attempt) == ("j", 1), got
