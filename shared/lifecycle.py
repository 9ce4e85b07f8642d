"""A job's state machine: every transition a named pure function of (record, input, now).

Each returns the new record, or None for "no change" (the input is stale, a duplicate, or says nothing new),
and never changes the record it is given. The queue's handlers are read → transition → compare-and-set →
publish (`Store.update_job` runs the transition again on the stored record when a CAS loses), so replaying a
job's inputs through these functions rebuilds its record. `NotYet` says an input arrived before one it
depends on (a rank's start before its attempt's commit, a clean exit before the rank's start): the queue has
it redelivered later.

    pending ──ordered──▶ (in flight) ──placed──▶ placed ──started (every rank)──▶ running
       ▲                    │ rejected / order_timed_out                           │
       └────────────────────┘                          every rank exits 0 ──exited──▶ succeeded
    preempted ──requeued──▶ pending (attempt + 1)        a rank fails ──exited──▶ failed
    node_lost ──▶ pending (attempt + 1), or failed by the job's on_node_failure
    cancelled ◀── any state that isn't terminal (its GPUs are released at once)
    running ──migrating──▶ migrating (ranks checkpoint) ──checkpointed (every rank)──▶ pending (attempt + 1,
        its pinned order in flight, restoring) ──placed──▶ placed ──▶ running;   move_aborted ──▶ pending

Stale inputs: an attempt's inputs count only while it is the job's current attempt; `floor` marks the last
attempt that was placed and is over, so its late commits and starts are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from shared.core.arrays import ArraySyntaxError, parse_array, task_id
from shared.schemas import (
    HOLDING,
    TERMINAL,
    Committed,
    JobCancel,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    MoveAbort,
    MoveOrder,
    MoveTicket,
    NodeGpus,
    RankExited,
    RankStarted,
    Rejected,
    Released,
)

INTAKE_REASON = "waiting for the next scheduling cycle"


class NotYet(Exception):
    """The input depends on one not seen yet (a rank's start before its attempt's commit): apply it later."""


def _copy(rec: JobRecord) -> JobRecord:
    """A copy to change (the fields below are replaced, never changed in place, so a shallow one will do)."""
    return msgspec.structs.replace(rec)


def _next_attempt(r: JobRecord, reason: str, now: float, allocation: list[NodeGpus] | None = None) -> None:
    """Back to pending as a new attempt (on a copy). The current one is over: `floor` makes its late commits
    and starts stale. `allocation`: where the new attempt's order already goes (a move's target)."""
    r.floor = r.attempt
    r.state, r.attempt, r.allocation, r.domains = JobState.PENDING, r.attempt + 1, allocation or [], []
    r.started_ranks, r.exit_codes, r.move, r.reason, r.updated_at = [], {}, None, reason, now
    r.exit_causes = {}


def commit_seen(rec: JobRecord, attempt: int) -> None:
    """A rank's report of an attempt that isn't over, on a job still pending: its commit hasn't been applied
    yet (agents start only committed attempts, and the queue's inbox has the commit first, but a commit handed
    out to a process that died comes back only after its ack wait). It waits (NotYet), never dropped."""
    if rec.state is JobState.PENDING and attempt > rec.floor:
        raise NotYet(f"job {rec.id} attempt {attempt}: commit not seen yet")


# -- intake ------------------------------------------------------------------------------------------------
def submitted(msg: JobSubmitted, now: float, trace: str = "") -> JobRecord:
    """A new job's first record (a redelivered submit finds it stored and changes nothing)."""
    return JobRecord(
        id=msg.job_id,
        spec=msg.spec,
        state=JobState.PENDING,
        reason=INTAKE_REASON,
        submitted_at=msg.submitted_at,
        updated_at=now,
        trace=trace,
    )


def submitted_jobs(msg: JobSubmitted, now: float, trace: str = "") -> list[JobRecord]:
    """The records a submit makes: the job's, or for an array (`spec.array`) one per task, `<id>_<index>`, each
    with the array's id and its index and otherwise the array's body. The queue's intake and the log's replay
    both expand a submit so, so a rebuilt view holds the very same tasks. None for an array that doesn't parse
    (the gateway refuses one: only a message from elsewhere can carry it)."""
    if msg.spec.array is None:
        return [submitted(msg, now, trace)]
    try:
        indices = parse_array(msg.spec.array).indices
    except ArraySyntaxError:
        return []
    first = submitted(msg, now, trace)
    return [
        msgspec.structs.replace(first, id=task_id(msg.job_id, i), array_id=msg.job_id, array_index=i) for i in indices
    ]


def cancelled(rec: JobRecord, msg: JobCancel, now: float) -> JobRecord | None:
    if rec.state in TERMINAL:
        return None
    r = _copy(rec)
    r.state, r.reason, r.updated_at, r.ended_at, r.end = JobState.CANCELLED, msg.reason, now, now, CANCELLED
    r.inflight_since = None
    return r


# -- the cycle's decisions -----------------------------------------------------------------------------------
def ordered(
    rec: JobRecord, decided_on: int, nodes: list[NodeGpus], now: float, segment: int | None = None
) -> JobRecord | None:
    """The cycle decided the job's next attempt on `nodes`, laid out in segments of `segment` nodes, from the
    record of attempt `decided_on`: its order is in flight."""
    if rec.state is not JobState.PENDING or rec.inflight_since is not None or rec.attempt != decided_on:
        return None  # committed already, cancelled or decided by someone else meanwhile
    r = _copy(rec)
    r.attempt, r.inflight_since, r.allocation = decided_on + 1, now, list(nodes)
    r.reason, r.updated_at, r.segment = "placing", now, segment
    return r


def order_timed_out(rec: JobRecord, attempt: int, now: float) -> JobRecord | None:
    """Placement never answered the order of `attempt` (and holds nothing for it): decide again."""
    if rec.state is not JobState.PENDING or rec.attempt != attempt or rec.inflight_since is None:
        return None
    r = _copy(rec)
    r.inflight_since, r.reason, r.updated_at = None, "placement did not answer; deciding again", now
    return r


def pending_reason(rec: JobRecord, reason: str, now: float) -> JobRecord | None:
    """Why an undecided job still waits, as the cycle says it."""
    if rec.state is not JobState.PENDING or rec.inflight_since is not None or rec.reason == reason:
        return None
    r = _copy(rec)
    r.reason, r.updated_at = reason, now
    return r


def preempted(rec: JobRecord, for_job: str, now: float) -> JobRecord | None:
    """A placed or running attempt gives way to a higher-priority job (its GPUs are released next)."""
    if rec.state not in (JobState.PLACED, JobState.RUNNING):
        return None
    r = _copy(rec)
    r.state, r.reason, r.updated_at = JobState.PREEMPTED, f"preempted for job {for_job}", now
    return r


def requeued(rec: JobRecord, attempt: int, for_job: str, now: float) -> JobRecord | None:
    """A preempted attempt, its release sent, waits again as the next attempt."""
    if rec.state is not JobState.PREEMPTED or rec.attempt != attempt:
        return None
    r = _copy(rec)
    _next_attempt(r, f"requeued after preemption for job {for_job}", now)
    return r


# -- placement's answers -------------------------------------------------------------------------------------
def placed(rec: JobRecord, ev: Committed, domains: list[str], now: float) -> JobRecord | None:
    """Placement committed an attempt. Taken even for an older attempt than the one in flight (its order
    went through after a timeout; the newer order is refused, as the job holds GPUs); an attempt that was
    placed and is over stays over."""
    if rec.state is not JobState.PENDING or ev.attempt <= rec.floor:
        return None  # (an attempt that was placed and is over: a redelivered commit)
    r = _copy(rec)
    r.state, r.attempt, r.allocation = JobState.PLACED, ev.attempt, list(ev.nodes)
    r.segment = ev.segment or None
    r.domains, r.reason, r.updated_at, r.inflight_since = list(domains), "", now, None
    r.started_ranks, r.exit_codes = [], {}
    return r


def rejected(rec: JobRecord, ev: Rejected, now: float) -> JobRecord | None:
    """Placement refused the order in flight (a GPU was taken meanwhile): decide again."""
    if rec.state is not JobState.PENDING or rec.attempt != ev.attempt or rec.inflight_since is None:
        return None
    r = _copy(rec)
    r.inflight_since, r.reason, r.updated_at = None, f"placement retry: {ev.reason}", now
    return r


# -- the agents' reports -------------------------------------------------------------------------------------
def started(rec: JobRecord, ev: RankStarted, now: float) -> JobRecord | None:
    """A rank started; with every rank, the job runs."""
    commit_seen(rec, ev.attempt)
    if (
        rec.attempt != ev.attempt
        or rec.state not in (JobState.PLACED, JobState.RUNNING)
        or ev.rank in rec.started_ranks
    ):
        return None
    r = _copy(rec)
    r.started_ranks = sorted([*rec.started_ranks, ev.rank])
    if len(r.started_ranks) == len(r.allocation) and r.state is JobState.PLACED:
        r.state, r.started_at, r.updated_at = JobState.RUNNING, now, now
    return r


def started_all(rec: JobRecord, evs: Sequence[RankStarted], now: float) -> JobRecord | None:
    """Several ranks started (a gang's, heard together): `started` for each in turn, one record."""
    out = rec
    for ev in evs:
        out = started(out, ev, now) or out
    return None if out is rec else out


# Why a rank exited, or a job ended (a job: the first five; a rank: any).
COMPLETED, FAILED, TIME_LIMIT, CANCELLED, NODE_LOST, PREEMPTED, MOVED = (
    "completed",
    "failed",
    "time limit",  # also a failed job's reason when its agents stopped it at its `time_limit_s`
    "cancelled",
    "node lost",
    "preempted",
    "moved",
)
CAUSES = (COMPLETED, FAILED, TIME_LIMIT, CANCELLED, NODE_LOST, PREEMPTED, MOVED)


def exit_cause(code: int, *, time_limit: bool = False, lost: bool = False, stopped_for: str | None = None) -> str:
    """Why a rank exited: its time limit, its agent's shutdown, the cause it was stopped for ("" unknown: failed),
    or, none of those, its own exit code."""
    if time_limit:
        return TIME_LIMIT
    if lost:
        return NODE_LOST
    if stopped_for is not None:
        return stopped_for or FAILED
    return COMPLETED if code == 0 else FAILED


def rank_cause(ev: RankExited) -> str:
    """Why a rank exited: what its agent said, else its exit code's word (an agent that predates causes, or
    inventory speaking for a lost one)."""
    return exit_cause(ev.exit_code, time_limit=ev.time_limit, lost=ev.lost, stopped_for=ev.cause or None)


def stop_cause(rec: JobRecord) -> str:
    """Why a job's ranks are stopped now: its end, or the state that stops them."""
    if rec.end:
        return rec.end
    return {JobState.CANCELLED: CANCELLED, JobState.PREEMPTED: PREEMPTED, JobState.MIGRATING: MOVED}.get(
        rec.state, FAILED
    )


def exited(rec: JobRecord, ev: RankExited, now: float) -> JobRecord | None:
    """A rank ended by itself: the job fails with its first failing rank (or at its time limit), succeeds when
    every rank exited 0. A rank of the job's attempt that ends after the job did (stopped by a cancel, another
    rank's failure, the time limit) has its exit recorded too; the job's state and end stay."""
    commit_seen(rec, ev.attempt)
    key = f"{ev.node}/{ev.rank}"
    if rec.attempt != ev.attempt or key in rec.exit_codes:
        return None
    late = rec.state in TERMINAL  # the job ended before this rank did
    if late and not any(a.node == ev.node for a in rec.allocation):
        return None
    if not late and rec.state not in HOLDING:
        return None
    if not late and ev.exit_code == 0 and ev.rank not in rec.started_ranks:
        # a clean exit always follows the rank's start event; both may have been redelivered out of order,
        # and the job must pass through running
        raise NotYet(f"job {rec.id} rank {ev.rank}: exit before its start")
    r = _copy(rec)
    r.exit_codes = {**rec.exit_codes, key: ev.exit_code}
    r.exit_causes = {**rec.exit_causes, key: rank_cause(ev)}
    if late:
        return r
    r.updated_at = now
    if ev.time_limit:
        r.state, r.ended_at, r.reason, r.end = JobState.FAILED, now, TIME_LIMIT, TIME_LIMIT
    elif ev.exit_code != 0:
        r.state, r.ended_at, r.end = JobState.FAILED, now, FAILED
        r.reason = f"rank {ev.rank} on {ev.node} exited with {ev.exit_code}" + (f" ({ev.reason})" if ev.reason else "")
    elif len(r.exit_codes) == len(r.allocation):
        r.state, r.ended_at, r.reason, r.end = JobState.SUCCEEDED, now, "", COMPLETED
    if r.state in TERMINAL:
        r.move = None  # it ended before its checkpoint: nothing left to move
    return r


def lost_reason(ev: RankExited) -> str:
    """Why a rank's `lost` exit loses its node: what inventory said of it, else its agent's own shutdown."""
    return ev.reason or f"the agent on {ev.node} stopped"


def node_lost(rec: JobRecord, attempt: int, reason: str, now: float) -> JobRecord | None:
    """A placed, running or migrating attempt lost a node under it: requeued, or failed by on_node_failure."""
    if rec.attempt != attempt or rec.state not in HOLDING:
        return None
    r = _copy(rec)
    if r.spec.on_node_failure == "fail":
        r.state, r.ended_at, r.reason, r.move, r.updated_at = JobState.FAILED, now, reason, None, now
        r.end = NODE_LOST
    else:
        _next_attempt(r, f"requeued: {reason}", now)
    return r


# -- moves: checkpoint → ack → release → place (pinned) → restore ------------------------------------------
def migrating(rec: JobRecord, m: MoveOrder, now: float) -> JobRecord | None:
    """The migration service's move of a running attempt: its ranks checkpoint, its GPUs stay held. An
    empty target stops the ranks to requeue the attempt (any job, checkpointable or not)."""
    if rec.state is not JobState.RUNNING or rec.attempt != m.attempt or not (rec.spec.checkpointable or not m.target):
        return None  # ended, moved or requeued meanwhile: the migration service sees it and gives up
    r = _copy(rec)
    r.state, r.reason, r.updated_at = JobState.MIGRATING, f"migrating: {m.reason}", now
    r.move = MoveTicket(
        migration_id=m.migration_id, target=list(m.target), reason=m.reason, since=now, segment=m.segment
    )
    return r


def checkpointed(rec: JobRecord, ev: RankExited, now: float) -> JobRecord | None:
    """A rank's checkpoint is written (the agent's ack). With every rank's, the next attempt's pinned order
    on the move's target is in flight, restoring from the checkpoint; with no target, the job is requeued
    (or failed by on_node_failure) without a restore."""
    mv = rec.move
    if rec.state is not JobState.MIGRATING or rec.attempt != ev.attempt or mv is None or ev.rank in mv.acked:
        return None
    r = _copy(rec)
    acks, ran = sorted([*mv.acked, ev.rank]), max(mv.ran_s, ev.ran_s)
    r.updated_at = now
    if len(acks) < len(r.allocation):
        r.move = msgspec.structs.replace(mv, acked=acks, ran_s=ran)
        return r
    if not mv.target:
        if r.spec.on_node_failure == "fail":
            r.allocation, r.domains, r.started_ranks, r.exit_codes, r.move = [], [], [], {}, None
            r.state, r.ended_at, r.reason = JobState.FAILED, now, f"evacuated: {mv.reason}"
        else:
            _next_attempt(r, f"requeued: evacuated: {mv.reason}", now)
        return r
    checkpoint = f"{r.id}:{r.attempt}"
    _next_attempt(r, "migrating: restoring on " + ", ".join(ng.node for ng in mv.target), now, list(mv.target))
    r.inflight_since, r.ran_s, r.checkpoint = now, r.ran_s + ran, checkpoint
    r.segment = mv.segment or r.segment  # the pinned order lays the target out so
    return r


def restoring_from(rec: JobRecord, attempt: int) -> bool:
    """The record is where the last checkpoint ack of a move of `attempt` left it: the next attempt's pinned
    order in flight, restoring from that attempt's checkpoint (not committed yet, as far as the queue knows)."""
    return (
        rec.state is JobState.PENDING
        and rec.attempt == attempt + 1
        and rec.floor == attempt
        and rec.inflight_since is not None
        and rec.checkpoint == f"{rec.id}:{attempt}"
    )


def move_aborted(rec: JobRecord, m: MoveAbort, now: float) -> JobRecord | None:
    """A move whose checkpoint never completed: requeued from the last complete checkpoint."""
    if rec.state is not JobState.MIGRATING or rec.move is None or rec.move.migration_id != m.migration_id:
        return None
    r = _copy(rec)
    _next_attempt(r, f"requeued: move aborted ({m.reason})", now)
    return r


# -- the log, and the log replayed ---------------------------------------------------------------------------
def event_of(rec: JobRecord) -> JobEvent:
    """The record's state as its JobEvent: the audit log's entry, and what a rebuild takes the queue's
    decisions from (`recorded`)."""
    holding = rec.state in HOLDING
    return JobEvent(
        job_id=rec.id,
        state=rec.state,
        reason=rec.reason,
        at=rec.updated_at,
        attempt=rec.attempt,
        nodes=rec.allocation if holding else [],
        tenant=rec.spec.tenant,
        floor=rec.floor,
        domains=rec.domains if holding else [],
        move=rec.move if rec.state is JobState.MIGRATING else None,
        checkpoint=rec.checkpoint,
        ran_s=rec.ran_s,
        end=rec.end,
        segment=(rec.segment or 0) if holding else 0,
    )


# Within one attempt a job's states only move forward, in this order; a later attempt is always further on.
_PROGRESS = {
    JobState.PENDING: 0,
    JobState.PLACED: 1,
    JobState.RUNNING: 2,
    JobState.MIGRATING: 3,
    JobState.PREEMPTED: 4,
    JobState.SUCCEEDED: 5,
    JobState.FAILED: 5,
    JobState.CANCELLED: 5,
}


def recorded(rec: JobRecord, ev: JobEvent) -> JobRecord | None:
    """A state the queue logged for the job (its JobEvent), taken when it is further on than the record: how
    a record rebuilt from the log (Redis came back empty, or behind) gets the queue's own decisions, which
    no input carries (an order, a preemption, a requeue, a move). An event of the record's own state only
    fills in what its input couldn't (the domains of a commit)."""
    ahead = (ev.attempt, _PROGRESS[ev.state]) > (rec.attempt, _PROGRESS[rec.state])
    if not ahead:
        if (ev.attempt, ev.state) == (rec.attempt, rec.state) and ev.domains and not rec.domains:
            r = _copy(rec)
            r.domains = list(ev.domains)
            return r
        return None
    same = ev.attempt == rec.attempt
    r = _copy(rec)
    r.state, r.attempt, r.floor, r.reason, r.updated_at = (
        ev.state,
        ev.attempt,
        max(rec.floor, ev.floor),
        ev.reason,
        ev.at,
    )
    r.inflight_since, r.checkpoint, r.ran_s = None, ev.checkpoint or rec.checkpoint, max(rec.ran_s, ev.ran_s)
    if not same:
        r.started_ranks, r.exit_codes, r.exit_causes, r.started_at = [], {}, {}, None
        r.allocation, r.domains = [], []
    if ev.state in HOLDING:
        r.allocation, r.domains = list(ev.nodes), list(ev.domains) or r.domains
        r.segment = ev.segment or r.segment
    if ev.state is JobState.RUNNING and r.started_at is None:
        r.started_at = ev.at
    if ev.state in TERMINAL:
        r.ended_at, r.end = ev.at, ev.end or r.end
    r.move = ev.move if ev.state is JobState.MIGRATING else None
    return r


Logged = JobEvent | Committed | Rejected | Released | RankStarted | RankExited


def replayed(rec: JobRecord, msg: Logged, domains: list[str] | None = None) -> JobRecord | None:
    """One message of the job's log applied to its record, by the transition its handler applies (the queue's
    decisions by their JobEvents): what a rebuild folds the log with, in the stream's order. `domains`: the
    NVLink domains of a commit's nodes, as far as known. An input that can't apply is no change (in stream
    order it comes after what it depends on; one that doesn't is stale)."""
    try:
        if isinstance(msg, JobEvent):
            return recorded(rec, msg)
        if isinstance(msg, Committed):
            return placed(rec, msg, domains or [], msg.at)
        if isinstance(msg, Rejected):
            return rejected(rec, msg, msg.at)
        if isinstance(msg, RankStarted):
            return started(rec, msg, msg.at)
        if isinstance(msg, RankExited):
            if msg.checkpointed:
                return checkpointed(rec, msg, msg.at)
            if msg.lost and msg.exit_code != 0:
                return node_lost(rec, msg.attempt, lost_reason(msg), msg.at)
            return exited(rec, msg, msg.at)
    except NotYet:
        return None
    return None  # Released: placement's view, not the job's
