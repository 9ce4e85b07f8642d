"""Where a job would go if it were submitted now: the cycle's own decision with the job added. Pure.

`dry_run` takes what a cycle takes — the state of held GPUs, the pending jobs, the `Scheduler` with its memory
(sticky reservations' domains, the jobs it reserved, the borrowers of reserved nodes, last cycle's forecasts) and
`now` — plus the candidate, runs one cycle with the candidate among the pending jobs on copies (the state, and a twin
of the scheduler with the same memory), and reports what that cycle decided for the candidate. There is no second
placement algorithm: what it reports is the decision the next cycle makes after a real submit on the same inputs,
and nothing the caller holds changes (tests/unit/test_dry_run.py checks both over random fleets and queues).

A job the cycle leaves waiting without a reservation only because the reservations ahead of it used up the cycle's
depth (`CycleConfig.reservations`) gets an estimate of its start: the same cycle again with the depth reaching it,
every blocked job ahead of it reserved first (`ESTIMATE_AHEAD` of them at most: each costs a forecast).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from shared.core.cycle import CycleResult, Scheduler
from shared.core.decisions import Allocate, Pending, PendingCode, Preempt, Reserve, Resize
from shared.core.shape import JobSpec
from shared.core.state import ClusterState, mask_indices
from shared.core.timeline import Timeline
from shared.core.topology import Topology

ESTIMATE_AHEAD = 32  # blocked jobs ahead of the candidate a start estimate reserves first, at most


class Start(StrEnum):
    NOW = "now"  # the cycle would start it now (perhaps after preempting or shrinking others: `DryRun.preempts`)
    LATER = "later"  # it would wait: with a reservation, or pending for the reason given
    NEVER = "never"  # it can't run on this fleet as it is (its shape, or health and drains)


NEVER_CODES = frozenset({PendingCode.NEVER_FITS, PendingCode.INVALID})


@dataclass(frozen=True, slots=True)
class DryRun:
    """What the cycle decided for the candidate."""

    start: Start
    decision: Allocate | Reserve | Pending
    nodes: tuple[int, ...]  # where it starts now, or its reserved (or estimated) layout; () when neither
    masks: tuple[int, ...]  # aligned with nodes
    segment: int | None  # the layout's segment (a flexible job's may be smaller than its first)
    forecast_start: float | None  # a reservation's (or the estimate's) start; None when it starts now or none is known
    reason: str  # the pending reason the queue would record; when it starts now, whom it displaces ("" nobody)
    reserved: bool  # the cycle holds a reservation for it (False for an estimate)
    preempts: tuple[str, ...] = ()  # jobs preempted to start it now (checkpointed when they can be)
    shrinks: tuple[str, ...] = ()  # elastic jobs shrunk to start it (it starts once they gave their GPUs back)

    @property
    def gpus(self) -> int:
        return sum(m.bit_count() for m in self.masks)

    def gpus_by_node(self, topo: Topology) -> dict[str, tuple[int, ...]]:
        return {topo.node_names[n]: mask_indices(m) for n, m in zip(self.nodes, self.masks, strict=True)}

    def domains(self, topo: Topology) -> tuple[str, ...]:
        """The NVLink domains of its layout, in first-use order."""
        dom = topo.domain
        return tuple(dict.fromkeys(topo.group_names[dom][topo.node_group[dom][n]] for n in self.nodes))


def twin(sched: Scheduler) -> Scheduler:
    """A scheduler with `sched`'s memory whose cycles leave `sched` as it was: a cycle replaces its memory whole
    (shared here until then) except the borrowers, which it changes in place (copied); the timeline is a cache of
    the same forecasts (a fresh one gives the same answers)."""
    other = copy.copy(sched)
    other.lent = dict(sched.lent)
    other.timeline = Timeline()
    return other


def dry_run(
    sched: Scheduler,
    state: ClusterState,
    pending: Sequence[JobSpec],
    job: JobSpec,
    now: float,
    usage: Mapping[str, float] | None = None,
    *,
    reuse_forecasts: bool = False,
) -> DryRun:
    """What `sched.cycle(state, [*pending, job], now, usage, reuse_forecasts=...)` decides for `job`, with neither
    `sched` nor `state` changed. `pending` must not hold `job` (its id)."""
    if any(p.id == job.id for p in pending):
        raise ValueError(f"job {job.id} is pending already: a dry run is of a job not submitted")
    result, after = _cycle(sched, sched.config.reservations, state, pending, job, now, usage, reuse_forecasts)
    decided = result.by_job()[job.id]
    preempts = tuple(d.job_id for d in result.of(Preempt) if d.for_job == job.id)
    shrinks = tuple(d.job_id for d in result.of(Resize) if d.for_job == job.id)
    if isinstance(decided, Allocate):
        why = _making_room(preempts, shrinks)
        return DryRun(
            Start.NOW, decided, decided.nodes, decided.masks, decided.segment, None, why, False, preempts, shrinks
        )
    if isinstance(decided, Reserve):
        placement = after.forecasts[job.id].placement
        return DryRun(
            Start.LATER, decided, placement.nodes, placement.masks, job.segment, decided.start, decided.reason, True
        )
    assert isinstance(decided, Pending)
    if decided.code in NEVER_CODES:
        return DryRun(Start.NEVER, decided, (), (), None, None, decided.reason, False)
    if decided.code is PendingCode.NO_FIT:
        estimate = _estimate(sched, state, pending, job, now, usage, reuse_forecasts, result)
        if estimate is not None:
            return replace(estimate, decision=decided, reason=decided.reason)
    return DryRun(Start.LATER, decided, (), (), None, None, decided.reason, False)


def _making_room(preempts: tuple[str, ...], shrinks: tuple[str, ...]) -> str:
    """What a job that starts now costs others ("" when nothing)."""
    if shrinks:  # the queue starts it once they gave their GPUs back (a checkpoint and a restore each)
        return f"starts once {len(shrinks)} elastic job(s) of lower priority shrink to make room"
    if preempts:
        return f"starts now, preempting {len(preempts)} job(s) of lower priority (or borrowers of reserved nodes)"
    return ""


def _cycle(
    sched: Scheduler,
    depth: int,
    state: ClusterState,
    pending: Sequence[JobSpec],
    job: JobSpec,
    now: float,
    usage: Mapping[str, float] | None,
    reuse_forecasts: bool,
) -> tuple[CycleResult, Scheduler]:
    """One cycle of a twin of `sched` (reserving for `depth` blocked jobs) on a copy of `state`."""
    other = twin(sched)
    if depth != other.config.reservations:
        other.config = replace(other.config, reservations=depth)
    result = other.cycle(state.copy(), [*pending, job], now, usage, reuse_forecasts=reuse_forecasts)
    return result, other


def _estimate(
    sched: Scheduler,
    state: ClusterState,
    pending: Sequence[JobSpec],
    job: JobSpec,
    now: float,
    usage: Mapping[str, float] | None,
    reuse_forecasts: bool,
    result: CycleResult,
) -> DryRun | None:
    """The candidate's start were the cycle's reservations deep enough to reach it (see the module doc); None when
    it isn't behind a full depth (it has no forecast: jobs without an expected end), too far back, or the deeper
    cycle forecasts no start either."""
    decided = result.by_job()
    reserved = blocked = 0  # of the jobs ahead of it: reserved, and left without a reservation
    for job_id in result.order:
        if job_id == job.id:
            break
        d = decided.get(job_id)
        reserved += isinstance(d, Reserve)
        blocked += isinstance(d, Pending) and d.code is PendingCode.NO_FIT
    if reserved < sched.config.reservations or blocked > ESTIMATE_AHEAD:
        return None  # a reservation was open to it (its forecast failed on its own), or it is too far back
    deeper, after = _cycle(sched, reserved + blocked + 1, state, pending, job, now, usage, reuse_forecasts)
    got = deeper.by_job()[job.id]
    if isinstance(got, Reserve):
        placement = after.forecasts[job.id].placement
        return DryRun(Start.LATER, got, placement.nodes, placement.masks, job.segment, got.start, got.reason, False)
    if isinstance(got, Pending) and got.code in NEVER_CODES:
        return DryRun(Start.NEVER, got, (), (), None, None, got.reason, False)
    return None
