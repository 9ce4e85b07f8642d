"""SIGKILL a service in the middle of an elastic job's resize, under a burst (issue 21's fault harness on issue
23's elastic gangs).

One NVL72 domain of 18 four-GPU nodes. B holds 56 GPUs for a few seconds, so E (elastic: 8-32 GPUs, one real
process per node, checkpointable) starts on the 16 left. A burst of small ordinary jobs then queues behind B;
when B ends they run, and the migration service grows E to 32 (a move of kind "grow": checkpoint, release,
restore on 8 nodes). Then R (48 GPUs, a higher priority than E) can't fit beside it: the queue's cycle shrinks E
(a `Resize`: a move of E onto the nodes it keeps) to make R's room. R comes once the burst's jobs have ended
(with some still running, R would preempt them rather than wait for E's shrink alone); the burst's readers
keep reading through the shrink.

In each case one service runs as a child process and is frozen (SIGSTOP) the moment the chosen resize is in
flight (E's view shows its checkpoint under way, or its next attempt on its way to its new GPUs), then killed
(SIGKILL) and started again, as in test_service_kill. What was delivered to it while frozen is in its hands,
unacked, when it dies: JetStream delivers it again to the restarted process.

The history checker (tests/history.py) proves the run sound (every accepted job readable and terminal, no job
on two allocations at once, no GPU in two live allocations, no 5xx outside the fault window). On top: every job
succeeded (E ends on its own once the test lets it); E was really grown and really shrunk (the job's events say
so, and its attempts ran at those sizes); in no allocation interval did E hold fewer GPUs than its least or more
than its most; and the checker is not blind here: a restore planted on E's new GPUs before its old ones were
released is caught, as is a GPU double-booked, and the size check catches a planted oversized allocation.
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.schemas import HOLDING, JobEvent, JobState, NodeGpus
from tests import streams
from tests.e2e.conftest import E2E, StackFactory, service_errors
from tests.faults.burst import OK_CMD, TENANTS, Burst
from tests.faults.harness import (
    assert_sound,
    freeze_kill_restart,
    plant_double_booking,
    settled,
    victim_process,
    wait_ready,
)
from tests.history import History, Logged, Recorder, check, reruns

pytestmark = pytest.mark.asyncio

DOMAINS, NODES = 1, 18
BURST = 40  # small ordinary jobs around the resizes
FROZEN_S = 1.0  # frozen this long mid-move (what it is delivered then dies with it)
DOWN_S = 0.5  # dead this long before it starts again
LEAST, MOST = 8, 32  # E's sizes (GPUs): 2 to 8 nodes
FAST_MOVES = {"checkpoint_s": 0.3, "restore_s": 0.3, "migration_interval_s": 0.5, "max_migrations": 8}

# One rank of E: checkpoints on SIGTERM (exit 0), and ends on its own (exit 0) once the file argv[1] exists.
RANK = r"""
import os, signal, sys, time
def stop(*_):
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""

CASES = [
    ("migration", "grow"),  # the service that decided the move dies with it: it reads its record back
    ("queue", "grow"),  # the move's carrier dies with the checkpoint acks in its hands
    ("queue", "shrink"),  # the shrink is the queue's own decision: no migration record to fall back on
    ("placement", "shrink"),  # the release and the pinned restore order die with it
]


def small_burst(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` ordinary jobs small enough to run beside E: 1, 2 or 4 GPUs (one in eight 8 GPUs over two nodes),
    0.2-1.5 s, none checkpointable, every fifth a real command."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body: dict[str, Any] = {"name": f"small-{i}", "tenant": TENANTS[i % len(TENANTS)]}
        body["gpus"] = 8 if rng.random() < 0.125 else rng.choice((1, 2, 4))
        body["duration_s"] = round(rng.uniform(0.2, 1.5), 3)
        body["on_node_failure"] = "fail" if i % 3 == 2 else "requeue"
        if i % 5 == 3:
            body["command"] = OK_CMD
        out.append(body)
    return out


def gpus_of(nodes: list[Any]) -> int:
    return sum(len(ng["gpus"] if isinstance(ng, dict) else ng.gpus) for ng in nodes)


def size_violations(history: History, job: str, least: int, most: int) -> list[str]:
    """Every allocation interval of `job` (a holding event in the log, a rank's StartRank) outside [least, most]."""
    out = [
        f"event #{le.seq}: {job} {le.event.state.value} (attempt {le.event.attempt}) on {gpus_of(le.event.nodes)} GPUs"
        for le in history.job_events
        if le.event.job_id == job and le.event.state in HOLDING and not least <= gpus_of(le.event.nodes) <= most
    ]
    launched: dict[int, int] = {}
    for c in history.starts:
        if c.job_id == job:
            launched[c.attempt] = launched.get(c.attempt, 0) + len(c.gpus)
    out += [f"{job} attempt {a} launched on {n} GPUs" for a, n in launched.items() if not least <= n <= most]
    return out


def plant_oversized(history: History, job: str) -> History:
    """The history with `job`'s first running event on one GPU more than its most allows."""
    i, le = next((i, le) for i, le in enumerate(history.job_events) if le.event.job_id == job and le.event.nodes)
    extra = [*le.event.nodes, NodeGpus("planted-node", list(range(MOST - gpus_of(le.event.nodes) + 1)))]
    planted = Logged(le.seq, le.at, msgspec.structs.replace(le.event, nodes=extra))
    events = list(history.job_events)
    events[i] = planted
    return dataclasses.replace(history, job_events=events)


def plant_early_restore(history: History, job: str, attempt: int) -> History:
    """The history with `job`'s move to `attempt` restoring before its old GPUs were given back: the events
    between its migrating event and the new attempt's placed event left out, so the new GPUs are taken while the
    old attempt still holds its own."""
    evs = history.job_events
    placed = next(
        i for i, le in enumerate(evs) if le.event.job_id == job and le.event.attempt == attempt and le.event.nodes
    )
    moving = max(
        i for i, le in enumerate(evs[:placed]) if le.event.job_id == job and le.event.state is JobState.MIGRATING
    )
    skipped = {i for i in range(moving + 1, placed) if evs[i].event.job_id == job}
    return dataclasses.replace(history, job_events=[le for i, le in enumerate(evs) if i not in skipped])


async def job_events_of(e2e: E2E, job: str) -> list[JobEvent]:
    return [ev for ev in await e2e.job_events() if ev.job_id == job]


async def wait_move_in_flight(e2e: E2E, job: str, attempt: int, timeout: float = 60.0) -> tuple[float, float]:
    """Until `job`'s move away from `attempt` is under way: checkpointing (migrating), or its next attempt on
    its way to the new GPUs (pending or placed, not running yet). When the read that saw it began and ended."""

    async def probe() -> tuple[float, float] | None:
        start = time.time()
        v = await e2e.maybe_job(job)
        if v is None:
            return None
        moving = v["attempt"] == attempt and v["state"] == "migrating"
        restoring = v["attempt"] == attempt + 1 and v["state"] in ("pending", "placed")
        return (start, time.time()) if moving or restoring else None

    # polled often: the checkpoint of E's few real processes is over in a fraction of a second
    what = f"a move of job {job} away from attempt {attempt} in flight"
    return await streams.wait_until(probe, what, timeout, poll_s=0.02)


async def queue_drained(e2e: E2E, timeout: float = 60.0) -> None:
    """Until the queue handled every message of its consumers, redeliveries included: a queue killed after a
    write and before its event went out (the view a step ahead of the log) sends the event on the redelivery,
    one ack wait after the kill. Only then are the view and the log the same to the checker."""
    js, n = e2e.nc.jetstream(), e2e.names
    subjects = {"submit": n.job_submit, "cancel": n.job_cancel, "move": n.job_move, "inbox": n.job_inbox}

    async def drained() -> bool:
        for what, subject in subjects.items():
            info = await js.consumer_info(n.stream_for(subject), n.consumer("queue", what))
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    await streams.wait_until(drained, "the queue to handle every message (redeliveries included)", timeout)


@pytest.mark.parametrize(("victim", "during"), CASES, ids=[f"{v}-{d}" for v, d in CASES])
async def test_sigkill_mid_resize_under_a_burst_loses_nothing_and_books_no_gpu_twice(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, tmp_path: Path, victim: str, during: str
) -> None:
    e2e: E2E = await open_stack(domains=DOMAINS, nodes_per_domain=NODES, settings=FAST_MOVES, **victim_process(victim))
    await wait_ready(e2e, DOMAINS * NODES)
    rec = Recorder(e2e.http, lambda: e2e.url)
    done = tmp_path / "elastic-done"

    # the attempt E's move was moving away from when the victim was frozen, and when the read that saw it ran
    killed_from: list[tuple[int, float, float]] = []

    async def kill_mid_move(attempt: int) -> None:
        """Freeze the victim as E's move away from `attempt` is in flight, kill it, start it again."""
        killed_from.append((attempt, *await wait_move_in_flight(e2e, elastic, attempt)))
        async with rec.fault(f"sigkill {victim} mid-{during}"):
            await freeze_kill_restart(e2e, victim, FROZEN_S, DOWN_S)

    blocker = await rec.submit({"name": "b", "tenant": "b", "gpus": 56, "duration_s": 3.0})
    await e2e.wait_state(blocker, {"running"})
    elastic = await rec.submit(
        {
            "name": "elastic",
            "tenant": "e",
            "gpus": MOST,
            "min_gpus": LEAST,
            "priority": 5,  # the burst's jobs (priority 0) never shrink it; R (10) does
            "checkpointable": True,
            "expected_runtime_s": 3600,
            "command": [sys.executable, "-c", RANK, str(done)],
        }
    )
    first = await e2e.wait_state(elastic, {"running"})
    assert (first["attempt"], gpus_of(first["allocation"])) == (1, 16), first  # its least that fits: all left

    async with Burst(rec, small_burst(BURST, seed=23), rate_per_s=10.0) as burst:
        # B ends, the burst runs: the migration service grows E into the room left
        if during == "grow":
            await kill_mid_move(1)
        grown = await e2e.wait_state(elastic, {"running"}, timeout=60, check=lambda v: gpus_of(v["allocation"]) == MOST)
        # R comes once the burst's jobs have ended: while some still run, shrinking E alone may not make R's room
        # and R (priority 10) would then preempt them (the cycle shrinks, then preempts), a rerun this test
        # counts as a fault's (and E would not shrink). The burst's readers go on reading through the shrink.
        await burst.wait_accepted(BURST)
        await e2e.wait_terminal(burst.accepted, timeout=60)
        # R can't fit beside E (40 GPUs free at most): the queue's cycle shrinks E by whole nodes to make its room
        reserved = await rec.submit(
            {"name": "r", "tenant": "r", "gpus": 48, "priority": 10, "expected_runtime_s": 4, "duration_s": 4.0}
        )
        if during == "shrink":
            await kill_mid_move(grown["attempt"])
        await e2e.wait_state(reserved, {"running", "succeeded"}, timeout=60)
    shrunk = await e2e.wait_state(
        elastic,
        {"running"},
        timeout=60,
        check=lambda v: v["attempt"] > grown["attempt"] and gpus_of(v["allocation"]) < MOST,
    )
    done.touch()  # E's ranks end on their own now: it succeeds
    accepted = [blocker, elastic, reserved, *burst.accepted]
    assert not burst.refused, burst.refused[:5]
    assert len(accepted) == BURST + 3

    jobs = await e2e.wait_terminal(accepted, timeout=90)
    await settled(e2e)
    await queue_drained(e2e)
    history = await rec.history(e2e.nc, e2e.names)
    assert_sound(history)

    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    assert not bad, f"{len(bad)} jobs did not succeed: {dict(list(bad.items())[:10])}"
    fixed = [j for j in accepted if j != elastic]  # none but E can be moved (nor needed requeueing: no node failed)
    twice = reruns(history, fixed)
    assert not twice, f"{len(twice)} jobs that can't be moved ran more than one attempt: {twice[:5]}"

    # E was resized both ways, by a move each time (the events say why; each attempt ran at its size)
    reasons = [ev.reason for ev in await job_events_of(e2e, elastic)]
    # (room may free in steps: a growth may go 4 → 6 → 8 nodes)
    assert any(r.startswith("migrating: grown from 4 to ") for r in reasons), reasons
    assert any(
        f"shrunk from 8 to {len(shrunk['allocation'])} nodes to make room for job {reserved}" in r for r in reasons
    ), reasons
    sizes = {c.attempt: 0 for c in history.starts if c.job_id == elastic}
    for c in history.starts:
        if c.job_id == elastic:
            sizes[c.attempt] += len(c.gpus)
    assert sizes[1] == 16 and sizes[grown["attempt"]] == MOST, sizes
    assert sizes[shrunk["attempt"]] == gpus_of(shrunk["allocation"]) < MOST, sizes
    # the victim was frozen mid-move: the read just before saw E's checkpoint begun (the record's times, taken
    # before its writes) and no later attempt running yet (the move's own attempt may never run: the kill can
    # cut off its order, and a later attempt runs instead; seen once in a full run, E's ranks ran attempts 1, 3, 4)
    ((moved, seen_from, seen_to),) = killed_from
    mine = [le.event for le in history.job_events if le.event.job_id == elastic]
    began = min(ev.at for ev in mine if ev.attempt == moved and ev.state is JobState.MIGRATING)
    ran = min(ev.at for ev in mine if ev.attempt > moved and ev.state is JobState.RUNNING)
    assert began <= seen_to and ran >= seen_from, (began, seen_from, seen_to, ran)
    # within its bounds in every allocation interval
    assert not size_violations(history, elastic, LEAST, MOST)
    # and these checks are not blind on this history
    assert size_violations(plant_oversized(history, elastic), elastic, LEAST, MOST)
    early = [v for v in check(plant_early_restore(history, elastic, grown["attempt"])) if v.startswith("(c)")]
    assert any(elastic in v and "while holding" in v for v in early), early
    caught = [v for v in check(plant_double_booking(history)) if v.startswith("(c)") and "planted" in v]
    assert len(caught) >= 2, caught
    assert not service_errors(caplog.records)
