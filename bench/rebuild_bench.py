#!/usr/bin/env python3
"""Rebuilding the queue's view from the log: how long `rebuild_view` takes on a full log (issue 21's bound:
10,000 jobs on 64 domains in 10 s or less), and a catch-up from a recent position.

    python bench/rebuild_bench.py [--jobs 10000] [--domains 64] [--repeats 5] [--catch-up 0.01] [--seed 1]
                                  [--phases] [--profile FILE.prof] [--json]

The log is filled as the running system would have written it. A fleet of `--domains` NVL72 domains (18
nodes x 4 GPUs) is registered in Redis as inventory writes it (`Store.put_node`), with each node's
`NodeChanged`. Then a discrete-event simulation of `--jobs` jobs on that fleet drives every job's record
through `shared.lifecycle`, the transitions the queue's handlers apply, with the messages each step puts in
the log, in the order the system stores them:

- JOBS: the gateway's `JobSubmitted` (`names.job_submit`), a user's `JobCancel`, migration's `MoveOrder`;
- EVENTS: the queue's `JobEvent`s (`lifecycle.event_of` of the driven record, the queue's msg ids), placement's
  `Committed` / `Rejected` / `Released` and the agents' (or inventory's, for a lost rank) `RankStarted` /
  `RankExited` on the inbox subjects, and the nodes' `NodeChanged`.

The mix: 1-4 GPU jobs on one node and 8-72 GPU jobs on whole nodes of one domain (one rank per node); most
end (succeeded, failed, cancelled, some after a rejected order, a preemption and requeue, a lost node or a
move by checkpoint), some run or are placed, some wait. GPUs come from a pool, so no two attempts ever hold
a GPU at once. The simulation stops at the last submission; orders still in flight then get their answer.

Measured (the fill is not): `rebuild_view(bus, store, None, now)` on an empty view (every key of the cell
but the nodes' deleted, the view closed), `--repeats` times; and a catch-up: the view as it stood after the
first `1 - --catch-up` of the log's messages (rebuilt then, copied with DUMP, put back with RESTORE before
each repeat) brought up to the end (`rebuild_view(bus, store, mark, now)`). After each kind the rebuilt
records are checked against the driven ones (state, attempt and allocation; floor, domains, ranks, exit
codes and checkpoint reported too) and the allocations for GPUs held twice and against the holding records.
A job whose record carries an order the log doesn't show (the cycle's in-flight mark has no event, nor has
a rejection of it) is reported apart. The exit status is 1 when a check fails.

Embedded nats-server (`sync_interval: always`) and Valkey, unless RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL
name servers (the bench's streams and keys are deleted after); the CPU each rebuild took in this process and
in the embedded servers is counted. Figures on stdout; `--json` prints one JSON document instead.
`--phases` also times a full rebuild's parts one at a time (reading the two streams with `read_log`,
decoding and folding in memory, writing the view), and the same read with an ordered push consumer instead.
`--profile FILE` runs cProfile over one more full rebuild, writes FILE and prints the hottest functions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import heapq
import io
import json
import logging
import os
import pstats
import random
import statistics
import sys
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from bench.e2e_bench import cpu_seconds
from services.queue.rebuild import INBOX_TYPES, LogFold, Rebuilt, rebuild_view
from shared import lifecycle
from shared.bus import Bus
from shared.embedded import EmbeddedNats, EmbeddedValkey
from shared.joblog import read_log
from shared.names import Names
from shared.schemas import (
    EVENTS,
    HOLDING,
    JOB_INTAKE,
    TERMINAL,
    Committed,
    JobBody,
    JobCancel,
    JobRecord,
    JobState,
    JobSubmitted,
    MoveOrder,
    NodeChanged,
    NodeGpus,
    NodeRecord,
    RankExited,
    RankStarted,
    Rejected,
    Released,
    TopologyBody,
    encode,
)
from shared.store import Store, ViewMark

NODES_PER_DOMAIN = 18
GPUS_PER_NODE = 4
BOUND_S = 10.0  # issue 21: 10,000 jobs on 64 domains rebuilt in 10 s or less
PUBLISH_BATCH = 2000  # messages whose acks are awaited together while filling
RESTORE_CHUNK = 1000  # keys per pipeline when the view's copy is put back

# the workload: (GPUs, weight); 8 and more take whole nodes of one domain (4 GPUs a node, one rank each)
SIZES = ((1, 30), (2, 15), (4, 20), (8, 15), (16, 10), (32, 6), (72, 4))
MEAN_GPUS = sum(g * w for g, w in SIZES) / sum(w for _, w in SIZES)
MEAN_DURATION_S = 1800.0
LOAD = 1.25  # offered GPU load over the fleet's GPUs: a little more than it holds, so some jobs wait
CYCLE_S = 5.0  # the queue's full cycle, when waiting jobs are decided
CYCLE_SCAN = 64  # waiting jobs a cycle looks at, in submit order (those that fit are ordered)
ORDER_S = 0.02  # order → commit (or rejection)
START_S = (1.0, 30.0)  # commit → every rank started (the image pulled, the ranks up), uniform
CHECKPOINT_S = 0.5  # a move's checkpoint, order → every rank's acknowledgement
# per job, drawn at submission
P_FAIL = 0.12  # a rank fails (exit 1) part way through
P_CANCEL = 0.10  # the user cancels it some time after submitting (waiting or running)
P_REJECT = 0.03  # its first order is rejected (a GPU taken meanwhile) and it is decided again
P_PREEMPT = 0.06  # its first running attempt is preempted for another job and requeued
P_LOSE = 0.02  # a node under its first running attempt is lost (requeued, or failed by on_node_failure)
P_MOVE = 0.06  # a checkpointable job's first running attempt is moved (checkpoint, pinned place, restore)
P_PLACED_LATE = 0.3  # the placed event is stored after the first rank's start (the two consumers race)


@dataclass(frozen=True, slots=True)
class Out:
    """One message the running system stores, in the order it stores them."""

    subject: str
    msg: msgspec.Struct
    msg_id: str
    headers: dict[str, str]


@dataclass(slots=True)
class Job:
    rec: JobRecord  # as the queue holds it (every transition applied)
    trace: str
    fail: bool
    cancel_at: float | None
    reject: bool
    preempt: bool
    lose: bool
    move: bool
    order: list[NodeGpus] = field(default_factory=list)  # GPUs an order in flight takes
    held: list[NodeGpus] = field(default_factory=list)  # GPUs placement holds for the job
    target: list[NodeGpus] = field(default_factory=list)  # a move's target, kept for it until its commit
    waiting: bool = False
    # the record carries an order the log doesn't show: the cycle's in-flight mark (attempt + 1, the order's GPUs)
    # has no event, and neither does a rejection of it; a commit puts the record back on the log's footing
    untraced: bool = False
    history: set[str] = field(default_factory=set)  # what happened to it: rejected, preempted, lost, moved


class Pool:
    """Free GPUs of the fleet: a job of up to 4 GPUs takes the fullest node it fits on, a larger one whole
    free nodes of the domain with the fewest that still has enough."""

    def __init__(self, domains: int) -> None:
        self.names = [f"d{d:02d}-n{k:02d}" for d in range(domains) for k in range(NODES_PER_DOMAIN)]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.free = [set(range(GPUS_PER_NODE)) for _ in self.names]
        self.by_free: list[dict[int, None]] = [{} for _ in range(GPUS_PER_NODE + 1)]  # count → nodes (ordered)
        self.whole: list[dict[int, None]] = [{} for _ in range(domains)]  # domain → its wholly free nodes
        for i in range(len(self.names)):
            self.by_free[GPUS_PER_NODE][i] = None
            self.whole[i // NODES_PER_DOMAIN][i] = None

    def _set(self, i: int, gpus: set[int], before: int) -> None:
        del self.by_free[before][i]
        self.free[i] = gpus
        self.by_free[len(gpus)][i] = None
        if len(gpus) == GPUS_PER_NODE:
            self.whole[i // NODES_PER_DOMAIN][i] = None
        else:
            self.whole[i // NODES_PER_DOMAIN].pop(i, None)

    def take(self, gpus: int) -> list[NodeGpus] | None:
        if gpus <= GPUS_PER_NODE:
            for count in range(gpus, GPUS_PER_NODE + 1):
                if self.by_free[count]:
                    i = next(iter(self.by_free[count]))
                    have = sorted(self.free[i])
                    self._set(i, set(have[gpus:]), count)
                    return [NodeGpus(self.names[i], have[:gpus])]
            return None
        want = gpus // GPUS_PER_NODE
        fits = [d for d, nodes in enumerate(self.whole) if len(nodes) >= want]
        if not fits:
            return None
        domain = min(fits, key=lambda d: len(self.whole[d]))
        taken = sorted(self.whole[domain])[:want]
        for i in taken:
            self._set(i, set(), GPUS_PER_NODE)
        return [NodeGpus(self.names[i], list(range(GPUS_PER_NODE))) for i in taken]

    def give(self, nodes: Iterable[NodeGpus]) -> None:
        for ng in nodes:
            i = self.index[ng.node]
            now = self.free[i]
            if now & set(ng.gpus):
                raise AssertionError(f"GPUs {ng.gpus} of {ng.node} given back twice")
            self._set(i, now | set(ng.gpus), len(now))


class World:
    """The running system, simulated: every job's record driven through `shared.lifecycle` as the queue's
    handlers drive it, and the messages each step stores (`out`, in order)."""

    def __init__(self, names: Names, domains: int, jobs: int, seed: int) -> None:
        self.names = names
        self.rng = random.Random(seed)
        self.pool = Pool(domains)
        self.domain_of = {n: n[:3] for n in self.pool.names}
        self.jobs: dict[str, Job] = {}
        self.out: list[Out] = []
        self.waiting: deque[str] = deque()
        self._heap: list[tuple[float, int, str, str, int]] = []
        self._seq = 0
        self.n_jobs = jobs
        gpus = len(self.pool.names) * GPUS_PER_NODE
        self.rate = LOAD * gpus / (MEAN_GPUS * MEAN_DURATION_S)  # submissions a second
        self.t0 = 1_780_000_000.0  # a day in 2026, so times look like the system's

    # -- the log ------------------------------------------------------------------------------------------
    def _put(self, subject: str, msg: msgspec.Struct, msg_id: str, trace: str) -> None:
        self.out.append(Out(subject, msg, msg_id, {"traceparent": trace}))

    def _emit(self, job: Job, rec: JobRecord | None = None) -> None:
        """The queue's JobEvent of the record (its own msg id: `{job}:{state}:{attempt}`)."""
        rec = rec or job.rec
        ev = lifecycle.event_of(rec)
        self._put(self.names.job_event(rec.id), ev, f"{rec.id}:{rec.state}:{rec.attempt}", job.trace)

    def _inbox(self, job: Job, msg: msgspec.Struct, msg_id: str) -> None:
        placement = isinstance(msg, Committed | Rejected | Released)
        self._put(self.names.placement_events if placement else self.names.agent_events, msg, msg_id, job.trace)

    def _released(self, job: Job, attempt: int, t: float, reason: str) -> None:
        ev = Released(job_id=job.rec.id, reason=reason, at=t, attempt=attempt)
        self._inbox(job, ev, f"{job.rec.id}:{attempt or 'none'}:released")

    def _stopped(self, job: Job, nodes: list[NodeGpus], attempt: int, t: float, reason: str, skip: int = -1) -> None:
        """The ranks a release stopped report their exit (stale by then: the record has moved on)."""
        for rank, ng in enumerate(nodes):
            if rank == skip:
                continue
            ev = RankExited(
                job_id=job.rec.id,
                attempt=attempt,
                node=ng.node,
                rank=rank,
                exit_code=-15,
                at=t,
                reason=f"stopped ({reason}): killed by SIGTERM",
                ran_s=max(0.0, t - (job.rec.started_at or t)),
            )
            self._apply(job, ev)
            self._inbox(job, ev, f"{job.rec.id}:{attempt}:{rank}:exit")

    # -- the record ---------------------------------------------------------------------------------------
    def _set(self, job: Job, new: JobRecord | None) -> bool:
        if new is None:
            return False
        job.rec = new
        return True

    def _apply(self, job: Job, ev: msgspec.Struct) -> bool:
        """An inbox message through the transition its handler applies (`services/queue/service.py`)."""
        rec, t = job.rec, ev.at  # type: ignore[attr-defined]
        try:
            if isinstance(ev, Committed):
                domains = list(dict.fromkeys(self.domain_of[ng.node] for ng in ev.nodes))
                return self._set(job, lifecycle.placed(rec, ev, domains, t))
            if isinstance(ev, Rejected):
                return self._set(job, lifecycle.rejected(rec, ev, t))
            if isinstance(ev, RankStarted):
                return self._set(job, lifecycle.started(rec, ev, t))
            if isinstance(ev, RankExited):
                if ev.checkpointed:
                    return self._set(job, lifecycle.checkpointed(rec, ev, t))
                if ev.lost and ev.exit_code != 0:
                    lifecycle.commit_seen(rec, ev.attempt)
                    reason = ev.reason or f"the agent on {ev.node} stopped"
                    return self._set(job, lifecycle.node_lost(rec, ev.attempt, reason, t))
                return self._set(job, lifecycle.exited(rec, ev, t))
        except lifecycle.NotYet as e:
            raise AssertionError(f"the simulation sent {ev!r} too early") from e
        return False

    # -- the clock ----------------------------------------------------------------------------------------
    def _at(self, t: float, job_id: str, action: str, attempt: int = -1) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, job_id, action, attempt))

    def run(self) -> None:
        t = self.t0
        for i in range(self.n_jobs):
            t += self.rng.expovariate(self.rate)
            self._at(t, f"{self.rng.getrandbits(128):032x}", "submit", i)
        end = t
        cycle = self.t0 + CYCLE_S
        while self._heap:
            t, _, job_id, action, attempt = self._heap[0]
            if cycle <= min(t, end):
                self._cycle(cycle)
                cycle += CYCLE_S
                continue
            heapq.heappop(self._heap)
            if t > end and action not in ("commit", "reject"):
                continue  # the log ends here; only orders already out still get their answer
            getattr(self, "_" + action)(t, job_id, attempt)

    # -- intake -------------------------------------------------------------------------------------------
    def _submit(self, t: float, job_id: str, _: int) -> None:
        rng = self.rng
        gpus = rng.choices([g for g, _ in SIZES], [w for _, w in SIZES])[0]
        multi = gpus > GPUS_PER_NODE
        body = JobBody(
            name=f"train-{len(self.jobs)}",
            tenant=rng.choice(("research", "prod", "batch", "eval")),
            gpus=gpus,
            gpus_per_node=GPUS_PER_NODE if multi else None,
            topology=TopologyBody(nvlink="required"),
            priority=rng.choice((0, 0, 0, 10, 100)),
            checkpointable=rng.random() < 0.5,
            command=["python", "train.py", "--config", f"cfg/{gpus}gpu.yaml"],
            duration_s=round(rng.lognormvariate(0.0, 1.0) * MEAN_DURATION_S / 1.6487, 1),  # mean MEAN_DURATION_S
            on_node_failure=rng.choice(("requeue", "requeue", "fail")),
        )
        trace = f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01"
        msg = JobSubmitted(job_id=job_id, spec=body, submitted_at=t)
        rec = lifecycle.submitted(msg, t, trace)
        cancel_at = t + rng.uniform(10.0, MEAN_DURATION_S) if rng.random() < P_CANCEL else None
        job = Job(
            rec=rec,
            trace=trace,
            fail=rng.random() < P_FAIL,
            cancel_at=cancel_at,
            reject=rng.random() < P_REJECT,
            preempt=rng.random() < P_PREEMPT,
            lose=rng.random() < P_LOSE,
            move=body.checkpointable and rng.random() < P_MOVE,
        )
        self.jobs[job_id] = job
        self._put(self.names.job_submit, msg, job_id, trace)  # the gateway's
        self._emit(job)  # the queue's on_submit: pending
        job.waiting = True
        self.waiting.append(job_id)
        if cancel_at is not None:
            self._at(cancel_at, job_id, "cancel")

    def _cancel(self, t: float, job_id: str, _: int) -> None:
        job = self.jobs[job_id]
        before = job.rec
        if before.state in TERMINAL:
            return  # the gateway answers 409: nothing is published
        msg = JobCancel(job_id=job_id, at=t)
        self._put(self.names.job_cancel, msg, f"{job_id}:cancel", job.trace)
        self._set(job, lifecycle.cancelled(before, msg, t))
        self._emit(job)
        if job.waiting:
            job.waiting = False
            self.waiting.remove(job_id)
        if job.target:  # a move's target, not committed: the migration service lets it go
            self.pool.give(job.target)
            job.target = []
        held, job.held = job.held, []
        self._released(job, before.attempt if held else 0, t + 0.001, msg.reason)
        if held:
            self.pool.give(held)
            if before.started_ranks:
                self._stopped(job, held, before.attempt, t + 0.01, msg.reason)
        # an order in flight is committed anyway and given back when its Committed finds the job cancelled

    # -- the cycle and placement ------------------------------------------------------------------------
    def _cycle(self, t: float) -> None:
        for job_id in list(self.waiting)[:CYCLE_SCAN]:
            job = self.jobs[job_id]
            nodes = self.pool.take(job.rec.spec.gpus)
            if nodes is None:
                continue
            self.waiting.remove(job_id)
            job.waiting = False
            if not self._set(job, lifecycle.ordered(job.rec, job.rec.attempt, nodes, t)):
                raise AssertionError(f"job {job_id} waits but can't be ordered: {job.rec!r}")
            job.order, job.untraced = nodes, True
            rejected = job.reject and "rejected" not in job.history
            self._at(t + ORDER_S, job_id, "reject" if rejected else "commit", job.rec.attempt)

    def _reject(self, t: float, job_id: str, attempt: int) -> None:
        job = self.jobs[job_id]
        job.history.add("rejected")
        self.pool.give(job.order)
        job.order = []
        ev = Rejected(job_id=job_id, attempt=attempt, reason="GPU 2 of a node is taken", at=t)
        self._inbox(job, ev, f"{job_id}:{attempt}:rejected")
        if self._apply(job, ev):
            job.waiting = True
            self.waiting.appendleft(job_id)

    def _commit(self, t: float, job_id: str, attempt: int) -> None:
        job = self.jobs[job_id]
        nodes, job.order = job.order, []
        ev = Committed(job_id=job_id, attempt=attempt, nodes=nodes, at=t)
        self._inbox(job, ev, f"{job_id}:{attempt}:committed")
        if not self._apply(job, ev):  # cancelled while the order was out: the queue gives the GPUs back
            self.pool.give(nodes)
            self._released(job, attempt, t + 0.001, f"job is {job.rec.state}")
            return
        job.held, job.target, job.untraced = nodes, [], False
        if self.rng.random() >= P_PLACED_LATE:
            self._emit(job)  # on_committed's placed event
        else:
            job.history.add("placed-late")
        self._at(t + self.rng.uniform(*START_S), job_id, "start", attempt)

    # -- the agents ---------------------------------------------------------------------------------------
    def _start(self, t: float, job_id: str, attempt: int) -> None:
        job = self.jobs[job_id]
        if job.rec.attempt != attempt or job.rec.state is not JobState.PLACED:
            return
        late = "placed-late" in job.history
        job.history.discard("placed-late")
        for rank, ng in enumerate(job.held):
            ev = RankStarted(job_id=job_id, attempt=attempt, node=ng.node, rank=rank, pid=10_000 + rank, at=t)
            self._inbox(job, ev, f"{job_id}:{attempt}:{rank}:start")
            before = job.rec
            self._apply(job, ev)
            if late and rank == 0:  # on_committed's event came after the first start
                self._emit(job, before if job.rec.state is JobState.RUNNING else job.rec)
        # on_started's: the running event (its placed event, when not seen acked, deduplicated by msg id)
        self._emit(job)
        left = job.rec.spec.duration_s - job.rec.ran_s
        rng = self.rng
        if job.preempt and "preempted" not in job.history:
            self._at(t + left * rng.uniform(0.1, 0.9), job_id, "preempt", attempt)
        elif job.lose and "lost" not in job.history:
            self._at(t + left * rng.uniform(0.1, 0.9), job_id, "lose", attempt)
        elif job.move and "moved" not in job.history:
            self._at(t + left * rng.uniform(0.1, 0.9), job_id, "move", attempt)
        self._at(t + left * (rng.uniform(0.05, 0.95) if job.fail else 1.0), job_id, "end", attempt)

    def _running(self, job_id: str, attempt: int) -> Job | None:
        job = self.jobs[job_id]
        return job if job.rec.attempt == attempt and job.rec.state is JobState.RUNNING else None

    def _end(self, t: float, job_id: str, attempt: int) -> None:
        if (job := self._running(job_id, attempt)) is None:
            return
        nodes = job.held
        ran = t - (job.rec.started_at or t)
        if job.fail:
            bad = self.rng.randrange(len(nodes))
            ev = RankExited(
                job_id=job_id,
                attempt=attempt,
                node=nodes[bad].node,
                rank=bad,
                exit_code=1,
                at=t,
                reason="exited with code 1",
                ran_s=ran,
            )
            self._inbox(job, ev, f"{job_id}:{attempt}:{bad}:exit")
            self._apply(job, ev)
            self._emit(job)  # failed
            self._released(job, attempt, t + 0.001, "job failed")
            self.pool.give(nodes)
            job.held = []
            self._stopped(job, nodes, attempt, t + 0.01, "job failed", skip=bad)
            return
        for rank, ng in enumerate(nodes):
            ev = RankExited(
                job_id=job_id, attempt=attempt, node=ng.node, rank=rank, exit_code=0, at=t, reason="exited 0", ran_s=ran
            )
            self._inbox(job, ev, f"{job_id}:{attempt}:{rank}:exit")
            self._apply(job, ev)
        self._emit(job)  # succeeded
        self._released(job, attempt, t + 0.001, "job succeeded")
        self.pool.give(nodes)
        job.held = []

    # -- the queue's own decisions, and the moves -------------------------------------------------------------
    def _preempt(self, t: float, job_id: str, attempt: int) -> None:
        if (job := self._running(job_id, attempt)) is None:
            return
        job.history.add("preempted")
        for_job = self.waiting[0] if self.waiting else "a higher-priority job"
        self._set(job, lifecycle.preempted(job.rec, for_job, t))
        self._emit(job)
        self._set(job, lifecycle.requeued(job.rec, attempt, for_job, t))
        self._emit(job)  # pending, the next attempt
        nodes, job.held = job.held, []
        self._released(job, attempt, t + 0.001, f"preempted for job {for_job}")
        self.pool.give(nodes)
        self._stopped(job, nodes, attempt, t + 0.01, f"preempted for job {for_job}")
        job.waiting = True
        self.waiting.append(job_id)

    def _lose(self, t: float, job_id: str, attempt: int) -> None:
        if (job := self._running(job_id, attempt)) is None:
            return
        job.history.add("lost")
        nodes, lost = job.held, len(job.held) - 1
        ev = RankExited(  # inventory's report of a rank its agent no longer reports
            job_id=job_id,
            attempt=attempt,
            node=nodes[lost].node,
            rank=lost,
            exit_code=-9,
            at=t,
            reason=f"rank lost: {nodes[lost].node} stopped reporting it",
            lost=True,
        )
        self._inbox(job, ev, f"{job_id}:{attempt}:{lost}:exit")
        self._apply(job, ev)
        self._emit(job)  # pending (the next attempt) or failed
        job.held = []
        self._released(job, attempt, t + 0.001, f"node {nodes[lost].node} lost")
        self.pool.give(nodes)
        self._stopped(job, nodes, attempt, t + 0.01, f"node {nodes[lost].node} lost", skip=lost)
        if job.rec.state is JobState.PENDING:
            job.waiting = True
            self.waiting.append(job_id)

    def _move(self, t: float, job_id: str, attempt: int) -> None:
        if (job := self._running(job_id, attempt)) is None:
            return
        target = self.pool.take(job.rec.spec.gpus)
        if target is None:
            return  # nowhere to go: the migration service doesn't ask
        job.history.add("moved")
        m = MoveOrder(
            migration_id=uuid.UUID(int=self.rng.getrandbits(128)).hex,
            job_id=job_id,
            attempt=attempt,
            target=target,
            reason="defragment: free a domain",
            at=t,
        )
        self._put(self.names.job_move, m, f"move:{job_id}", job.trace)
        self._set(job, lifecycle.migrating(job.rec, m, t))
        self._emit(job)  # migrating
        job.target = target
        self._at(t + CHECKPOINT_S, job_id, "checkpoint", attempt)

    def _checkpoint(self, t: float, job_id: str, attempt: int) -> None:
        job = self.jobs[job_id]
        if job.rec.attempt != attempt or job.rec.state is not JobState.MIGRATING:
            return
        nodes = job.held
        for rank, ng in enumerate(nodes):
            ev = RankExited(
                job_id=job_id,
                attempt=attempt,
                node=ng.node,
                rank=rank,
                exit_code=-15,
                at=t,
                reason="stopped (migrating: checkpoint): killed by SIGTERM",
                checkpointed=True,
                ran_s=t - (job.rec.started_at or t),
            )
            self._inbox(job, ev, f"{job_id}:{attempt}:{rank}:exit")
            self._apply(job, ev)
        self._emit(job)  # pending, the next attempt's pinned order in flight
        job.held = []
        self._released(job, attempt, t + 0.001, "migrating: checkpoint written")
        self.pool.give(nodes)
        job.order, job.target = job.target, []
        self._at(t + ORDER_S, job_id, "commit", job.rec.attempt)


# -- the bench ------------------------------------------------------------------------------------------------


def describe(world: World) -> dict[str, Any]:
    jobs = world.jobs.values()
    states = Counter(str(j.rec.state) for j in jobs)
    history = Counter(h for j in jobs for h in j.history if h != "placed-late")
    kinds = Counter(
        "jobs" if o.subject.startswith(f"{world.names.prefix}.jobs.") else type(o.msg).__name__ for o in world.out
    )
    return {
        "jobs": len(world.jobs),
        "end_states": dict(sorted(states.items())),
        "multi_node": sum(j.rec.spec.gpus > GPUS_PER_NODE for j in jobs),
        "history": dict(sorted(history.items())),
        "gpus_held_at_end": sum(len(ng.gpus) for j in jobs if j.rec.state in HOLDING for ng in j.rec.allocation),
        "untraced_order_at_end": sum(j.untraced for j in jobs),
        "messages": len(world.out),
        "messages_by_type": dict(sorted(kinds.items())),
    }


async def publish(bus: Bus, out: list[Out]) -> int:
    """Store the messages in order (one connection's messages reach a stream in the order sent); returns how
    many the streams dropped as duplicates."""
    dup = 0
    js = bus.js
    for i in range(0, len(out), PUBLISH_BATCH):
        acks = []
        for o in out[i : i + PUBLISH_BATCH]:
            hdrs = {**o.headers, "Nats-Msg-Id": o.msg_id}
            acks.append(await js.publish_async(o.subject, encode(o.msg), headers=hdrs))
        dup += sum(bool(a.duplicate) for a in await asyncio.wait_for(asyncio.gather(*acks), 60))
    return dup


def is_node_key(names: Names, key: bytes) -> bool:
    """Inventory's keys: the agents register them again after Redis comes back empty (not the rebuild's)."""
    k = key.decode()
    families = (names.node_key(""), names.node_state_key(""), names.health_state_key(""))
    return k.startswith(families) or k in (names.nodes_key, names.heartbeats_key, names.topo_gen_key)


async def view_keys(store: Store) -> list[bytes]:
    keys = store.r.scan_iter(match=store.names.key_pattern, count=2000)
    return [k async for k in keys if not is_node_key(store.names, k)]


async def wipe_view(store: Store) -> None:
    """Redis came back empty but for the nodes."""
    keys = await view_keys(store)
    for i in range(0, len(keys), 2000):
        await store.r.unlink(*keys[i : i + 2000])


async def put_back(store: Store, copy: dict[bytes, bytes]) -> None:
    """The view as it was copied (a replica that stopped there, promoted)."""
    await wipe_view(store)
    items = list(copy.items())
    for i in range(0, len(items), RESTORE_CHUNK):
        async with store.r.pipeline(transaction=False) as p:
            for key, data in items[i : i + RESTORE_CHUNK]:
                p.restore(key, 0, data, replace=True)
            await p.execute()


@dataclass(frozen=True, slots=True)
class Timed:
    done: Rebuilt
    wall: float
    cpu: dict[str, float]  # CPU seconds over the rebuild: this process's, and the embedded servers'


async def rebuild(bus: Bus, store: Store, since: ViewMark | None, servers: dict[str, int]) -> Timed:
    await store.close_view()
    before = {name: cpu_seconds(pid) or 0.0 for name, pid in servers.items()}
    t0, c0 = time.perf_counter(), time.process_time()
    done = await rebuild_view(bus, store, since, time.time())
    wall, cpu = time.perf_counter() - t0, {"bench": time.process_time() - c0}
    cpu |= {name: (cpu_seconds(pid) or 0.0) - before[name] for name, pid in servers.items()}
    return Timed(done, wall, cpu)


CHECKED = ("state", "attempt", "allocation")
ALSO_COMPARED = ("floor", "domains", "started_ranks", "exit_codes", "checkpoint")


async def check(store: Store, world: World) -> dict[str, Any]:
    """The rebuilt records against the driven ones, and the allocations against the holding records."""
    ids = list(world.jobs)
    got: dict[str, JobRecord] = {}
    for i in range(0, len(ids), 2000):
        got |= {r.id: r for r in await store.get_jobs(ids[i : i + 2000])}
    equal = 0
    differ: Counter[str] = Counter()  # jobs whose field differs, the log showing all they did
    untraced: Counter[str] = Counter()  # the same, for jobs whose record carries an order the log doesn't show
    examples: dict[str, str] = {}
    for job_id, job in world.jobs.items():
        have, want = got.get(job_id), job.rec
        if have is None:
            differ["missing"] += 1
            continue
        fields = [f for f in (*CHECKED, *ALSO_COMPARED) if getattr(have, f) != getattr(want, f)]
        equal += not any(f in CHECKED for f in fields)
        for f in fields:
            kind = f"{want.state}, untraced order" if job.untraced else str(want.state)
            (untraced if job.untraced else differ)[f] += 1
            examples.setdefault(
                f"{f} ({kind})", f"job {job_id}: rebuilt {getattr(have, f)!r}, driven {getattr(want, f)!r}"
            )
    allocs = await store.allocations()
    owners: dict[tuple[str, int], str] = {}
    twice = 0
    for a in allocs:
        for ng in a.nodes:
            for g in ng.gpus:
                twice += (ng.node, g) in owners
                owners[(ng.node, g)] = a.job_id
    marked = wrong_marks = 0  # gpus:<node>, the commit script's view of the same
    async with store.r.pipeline(transaction=False) as p:
        for node in world.pool.names:
            p.hgetall(store.names.gpus_key(node))
        for node, raw in zip(world.pool.names, await p.execute(), strict=True):
            for g, job in raw.items():
                marked += 1
                wrong_marks += owners.get((node, int(g))) != job.decode()
    holding = {j.rec.id: (j.rec.attempt, j.rec.allocation) for j in world.jobs.values() if j.rec.state in HOLDING}
    allocs_equal = {a.job_id: (a.attempt, a.nodes) for a in allocs} == holding
    core_differ = sum(differ[f] for f in ("missing", *CHECKED))
    core_untraced = sum(untraced[f] for f in CHECKED)
    return {
        "records": len(got),
        "records_equal": equal,
        "differing": dict(differ),
        "differing_untraced_order": dict(untraced),
        "examples": examples,
        "allocations": len(allocs),
        "allocations_equal_holding_records": allocs_equal,
        "gpus_in_two_allocations": twice,
        "gpus_marked": marked,
        "gpus_marked_for_another_job": wrong_marks,
        # an order the log doesn't show can't be rebuilt: those jobs are reported, not failed
        "ok": core_differ == 0 and twice == 0 and wrong_marks == 0 and allocs_equal,
        "ok_untraced": core_untraced == 0,
    }


def seconds(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summary(runs: list[Timed]) -> dict[str, Any]:
    last = runs[-1].done
    return {
        "messages_read": last.messages,
        "records_written": last.jobs,
        "allocations_written": last.allocations,
        "seconds": seconds([r.wall for r in runs]),
        "seconds_each": [round(r.wall, 3) for r in runs],
        "cpu_s_median": {name: round(statistics.median(r.cpu[name] for r in runs), 3) for name in runs[0].cpu},
    }


async def read_pushed(js: JetStreamContext, stream: str, subject: str, upto: int) -> list[tuple[int, bytes]]:
    """What would help: the same messages from an ordered push consumer, handed to a callback (nats-py's fetch
    of n waits for each message in a task of its own)."""
    got: list[tuple[int, bytes]] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(m: Any) -> None:
        md = m.metadata
        seq = md.sequence.stream
        if seq <= upto:
            got.append((seq, m.data))
            _ = dict(m.headers or {})  # as read_log hands them out
        if (seq >= upto or md.num_pending == 0) and not done.done():
            done.set_result(None)

    config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    sub = await js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True, config=config)
    try:
        await asyncio.wait_for(done, 120)
    finally:
        await sub.unsubscribe()
    return got


async def phases(bus: Bus, store: Store, repeats: int) -> dict[str, Any]:
    """A full rebuild's parts one at a time, as `rebuild_view` does them: reading the two streams
    (`read_log`), decoding and folding in memory (`LogFold`), writing the view; and reading the same with a
    push consumer instead."""
    n, js = bus.names, bus.js
    streams = [(n.stream_for(n.job_submit), n.job_submit), (n.stream_for(n.events_all), n.events_all)]
    upto = [(await js.stream_info(stream)).state.last_seq for stream, _ in streams]
    times: dict[str, list[float]] = {"read_log": [], "decode_and_fold": [], "write": [], "read_push": []}
    for _ in range(repeats):
        t0 = time.perf_counter()
        entries: list[list[bytes]] = []
        for (stream, subject), last in zip(streams, upto, strict=True):
            entries.append([e.data async for e in read_log(js, stream, subject, 0, last)])
        times["read_log"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        pushed = []
        for (stream, subject), last in zip(streams, upto, strict=True):
            pushed.append(await read_pushed(js, stream, subject, last))
        times["read_push"].append(time.perf_counter() - t0)
        if [len(p) for p in pushed] != [len(e) for e in entries]:
            raise AssertionError(f"the push read got {[len(p) for p in pushed]}, read_log {[len(e) for e in entries]}")

        now = time.time()
        t0 = time.perf_counter()
        fold = LogFold({}, {node.name: node.domain for node in await store.nodes()})
        for data in entries[0]:
            msg = JOB_INTAKE.decode(data)
            if isinstance(msg, JobSubmitted):
                fold.submitted(msg, "", now)
        for data in entries[1]:
            ev = EVENTS.decode(data)
            if isinstance(ev, INBOX_TYPES):
                fold.logged(ev)
        changed = [fold.records[j] for j in sorted(fold.touched)]
        held = fold.allocations()
        floors = {r.id: r.floor for r in fold.records.values()}
        times["decode_and_fold"].append(time.perf_counter() - t0)

        await wipe_view(store)
        await store.close_view()
        t0 = time.perf_counter()
        await store.restore_jobs(changed)
        await store.restore_allocations(held, floors)
        await store.open_view(ViewMark(*upto), now)
        times["write"].append(time.perf_counter() - t0)
    return {name: seconds(values) for name, values in times.items()}


async def measure(nats_url: str, redis_url: str, servers: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    names = Names(prefix=f"rebuild{uuid.uuid4().hex[:6]}")
    bus = await Bus.connect(nats_url, names, "rebuild-bench")
    store = Store.from_url(redis_url, names)
    result: dict[str, Any] = {"domains": args.domains, "repeats": args.repeats, "seed": args.seed}
    try:
        await bus.ensure_streams()
        t0 = time.perf_counter()
        world = World(names, args.domains, args.jobs, args.seed)
        now = world.t0
        nodes = []
        for name in world.pool.names:
            boot = f"boot-{name}"
            rec = NodeRecord(
                name=name, domain=name[:3], gpus=GPUS_PER_NODE, boot_id=boot, last_heartbeat=time.time(), backend="sim"
            )
            await store.put_node(rec)
            ev = NodeChanged(node=name, state="up", reason="registered", at=now, boot_id=boot)
            nodes.append(Out(names.node_event(name), ev, f"{name}:{boot}:up", {}))
        world.out.extend(nodes)
        world.run()
        result["log"] = describe(world)
        result["log"]["simulated_s"] = round(time.perf_counter() - t0, 1)

        # the log up to the catch-up's position, its view, a copy of it; then the rest of the log
        split = int(len(world.out) * (1 - args.catch_up))
        t0 = time.perf_counter()
        dup = await publish(bus, world.out[:split])
        await wipe_view(store)
        head = (await rebuild(bus, store, None, servers)).done
        copy = {}
        for key in await view_keys(store):
            data = await store.r.dump(key)
            if data is not None:
                copy[key] = data
        dup += await publish(bus, world.out[split:])
        result["log"]["fill_s"] = round(time.perf_counter() - t0, 1)
        result["log"]["duplicates_dropped"] = dup
        info = {s: (await bus.js.stream_info(names.stream_for(s))).state for s in (names.job_submit, names.events_all)}
        result["log"]["jobs_stream"] = {"messages": info[names.job_submit].messages}
        result["log"]["events_stream"] = {
            "messages": info[names.events_all].messages,
            "mib": round(info[names.events_all].bytes / 2**20, 1),
        }

        runs = []
        for _ in range(args.repeats):
            await wipe_view(store)
            runs.append(await rebuild(bus, store, None, servers))
        result["full"] = summary(runs) | {
            "within_bound": statistics.median(r.wall for r in runs) <= BOUND_S,
            "check": await check(store, world),
        }

        ups = []
        for _ in range(args.repeats):
            await put_back(store, copy)
            ups.append(await rebuild(bus, store, head.mark, servers))
        result["catch_up"] = summary(ups) | {
            "from": {"jobs_seq": head.mark.jobs_seq, "events_seq": head.mark.events_seq},
            "log_fraction": args.catch_up,
            "view_keys_copied": len(copy),
            "check": await check(store, world),
        }

        if args.phases:
            result["phases"] = await phases(bus, store, args.repeats)
        if args.profile:
            await wipe_view(store)
            prof = cProfile.Profile()
            prof.enable()
            wall = (await rebuild(bus, store, None, servers)).wall
            prof.disable()
            prof.dump_stats(args.profile)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            result["profile"] = {"file": args.profile, "seconds": round(wall, 3), "top": buf.getvalue()}
        return result
    finally:
        keys = [k async for k in store.r.scan_iter(match=names.key_pattern, count=2000)]
        for i in range(0, len(keys), 2000):
            await store.r.unlink(*keys[i : i + 2000])
        for spec in names.streams:
            with contextlib.suppress(Exception):
                await bus.js.delete_stream(spec.name)
        await store.close()
        await bus.close()


def report(r: dict[str, Any]) -> str:
    log, full, up = r["log"], r["full"], r["catch_up"]
    gpus = r["domains"] * NODES_PER_DOMAIN * GPUS_PER_NODE
    lines = [
        f"log: {log['jobs']:,} jobs on {r['domains']} domains ({gpus:,} GPUs), seed {r['seed']}; "
        f"JOBS {log['jobs_stream']['messages']:,} messages, EVENTS {log['events_stream']['messages']:,} "
        f"({log['events_stream']['mib']} MiB); filled in {log['fill_s']} s, {log['duplicates_dropped']} dropped as "
        "duplicates",
        "  end states: " + ", ".join(f"{k} {v:,}" for k, v in log["end_states"].items()),
        f"  multi-node jobs {log['multi_node']:,}; at least once: "
        + ", ".join(f"{k} {v:,}" for k, v in log["history"].items())
        + f"; GPUs held at the end {log['gpus_held_at_end']:,}; jobs whose record carries an order the log "
        f"doesn't show {log['untraced_order_at_end']}",
        "  messages: " + ", ".join(f"{k} {v:,}" for k, v in log["messages_by_type"].items()),
    ]
    for title, m in (("full rebuild", full), (f"catch-up (last {up['log_fraction']:.0%} of the log)", up)):
        s, c = m["seconds"], m["check"]
        lines += [
            f"{title}, {r['repeats']} repeats: {m['messages_read']:,} messages read, {m['records_written']:,} "
            f"records and {m['allocations_written']:,} allocations written; "
            f"{s['median']} s median ({s['min']}-{s['max']}); CPU s (median): "
            + ", ".join(f"{k} {v}" for k, v in m["cpu_s_median"].items()),
            f"  check: {c['records_equal']:,} of {r['log']['jobs']:,} records equal the driven ones in state, attempt "
            f"and allocation; differing fields (jobs): {c['differing'] or 'none'}, and where the record carries an "
            f"order the log doesn't show: {c['differing_untraced_order'] or 'none'}",
            f"  {c['allocations']:,} allocations, "
            f"{'equal to' if c['allocations_equal_holding_records'] else 'NOT equal to'} the holding records; GPUs "
            f"in two allocations {c['gpus_in_two_allocations']}, {c['gpus_marked']:,} GPUs marked, "
            f"{c['gpus_marked_for_another_job']} for another job; {'ok' if c['ok'] else 'FAILED'}",
        ]
        lines += [f"    {f}: {ex}" for f, ex in c["examples"].items()]
    verdict = "met" if full["within_bound"] else "MISSED"
    lines.append(f"bound: full rebuild <= {BOUND_S:g} s: {verdict} ({full['seconds']['median']} s)")
    if "phases" in r:
        lines.append(
            "phases, s median (min-max): "
            + "; ".join(f"{k} {v['median']} ({v['min']}-{v['max']})" for k, v in r["phases"].items())
        )
    if "profile" in r:
        lines += [f"profile ({r['profile']['seconds']} s, {r['profile']['file']}):", r["profile"]["top"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--domains", type=int, default=64, help="NVL72 domains (18 nodes x 4 GPUs)")
    p.add_argument("--repeats", type=int, default=5, help="rebuilds timed, each kind")
    p.add_argument("--catch-up", type=float, default=0.01, help="fraction of the log the catch-up reads")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--phases", action="store_true", help="also time the rebuild's parts one at a time")
    p.add_argument("--profile", default=None, metavar="FILE", help="cProfile one more full rebuild into FILE")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the figures")
    a = p.parse_args(argv)
    if a.jobs < 1 or a.domains < 1 or a.repeats < 1 or not 0 < a.catch_up < 1:
        p.error("--jobs, --domains and --repeats must be >= 1, --catch-up within (0, 1)")
    logging.getLogger("rackscale").setLevel(logging.ERROR)  # the rebuild's own line, once a repeat
    with contextlib.ExitStack() as stack:
        servers: dict[str, int] = {}  # the embedded ones, whose CPU is counted
        nats_url = os.environ.get("RACKSCALE_NATS_URL")
        if not nats_url:
            nats_srv = stack.enter_context(EmbeddedNats())
            nats_url, servers["nats-server"] = nats_srv.url, nats_srv.pid or 0
        redis_url = os.environ.get("RACKSCALE_REDIS_URL")
        if not redis_url:
            valkey = stack.enter_context(EmbeddedValkey())
            redis_url, servers["valkey"] = valkey.url, valkey.pid or 0
        result = asyncio.run(measure(nats_url, redis_url, servers, a))
    print(json.dumps(result, indent=2, default=str) if a.json else report(result))
    ok = result["full"]["check"]["ok"] and result["catch_up"]["check"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
