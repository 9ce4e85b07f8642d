"""The job's state machine (shared/lifecycle.py): every state x every input, as a table.

A job of 2 nodes x 4 GPUs (checkpointable, `on_node_failure: requeue` unless a column says otherwise), in
attempt 2 of it; attempt 1 was placed and is over (floor 1). Each cell is what the input does to a record in
that state:

    -          no change (stale, a duplicate, or nothing new)
    wait       NotYet: it came before an input it depends on (redelivered later)
    STATE@N    the new record's state and attempt

Inputs are of attempt 2 unless named `stale` (attempt 1, the floor).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from shared import lifecycle
from shared.lifecycle import NotYet
from shared.schemas import (
    Committed,
    JobBody,
    JobCancel,
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
)

NOW = 100.0
HERE = [NodeGpus("n0", [0, 1, 2, 3]), NodeGpus("n1", [0, 1, 2, 3])]
THERE = [NodeGpus("n2", [0, 1, 2, 3]), NodeGpus("n3", [0, 1, 2, 3])]
SPEC = JobBody(name="j", tenant="t", gpus=8, checkpointable=True)


def _rec(state: JobState, **kw: object) -> JobRecord:
    return JobRecord(id="j", spec=SPEC, state=state, attempt=2, floor=1, submitted_at=1.0, updated_at=50.0, **kw)


STATES: dict[str, JobRecord] = {
    "pending": _rec(JobState.PENDING, reason="waiting"),
    "inflight": _rec(JobState.PENDING, inflight_since=90.0, allocation=HERE, reason="placing"),
    "placed": _rec(JobState.PLACED, allocation=HERE, domains=["d0"]),
    "running": _rec(JobState.RUNNING, allocation=HERE, domains=["d0"], started_ranks=[0, 1], started_at=60.0),
    "migrating": _rec(
        JobState.MIGRATING,
        allocation=HERE,
        domains=["d0"],
        started_ranks=[0, 1],
        move=MoveTicket(migration_id="m1", target=THERE, reason="defrag", since=95.0),
    ),
    "preempted": _rec(JobState.PREEMPTED, allocation=HERE, domains=["d0"]),
    "succeeded": _rec(JobState.SUCCEEDED, allocation=HERE, ended_at=70.0),
    "failed": _rec(JobState.FAILED, allocation=HERE, ended_at=70.0),
    "cancelled": _rec(JobState.CANCELLED, ended_at=70.0),
}


def _fail_on_loss(rec: JobRecord) -> JobRecord:
    return msgspec.structs.replace(rec, spec=msgspec.structs.replace(SPEC, on_node_failure="fail"))


def _exit(rank: int, code: int, attempt: int = 2) -> RankExited:
    return RankExited(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, exit_code=code, at=NOW)


Transition = Callable[[JobRecord], JobRecord | None]
INPUTS: dict[str, Transition] = {
    "cancel": lambda r: lifecycle.cancelled(r, JobCancel(job_id="j", at=NOW), NOW),
    "ordered": lambda r: lifecycle.ordered(r, 2, THERE, NOW),
    "timed-out": lambda r: lifecycle.order_timed_out(r, 2, NOW),
    "reason": lambda r: lifecycle.pending_reason(r, "no room", NOW),
    "preempt": lambda r: lifecycle.preempted(r, "big", NOW),
    "requeue": lambda r: lifecycle.requeued(r, 2, "big", NOW),
    "commit": lambda r: lifecycle.placed(r, Committed(job_id="j", attempt=2, nodes=HERE, at=NOW), ["d0"], NOW),
    "commit-stale": lambda r: lifecycle.placed(r, Committed(job_id="j", attempt=1, nodes=HERE, at=NOW), ["d0"], NOW),
    "reject": lambda r: lifecycle.rejected(r, Rejected(job_id="j", attempt=2, reason="taken", at=NOW), NOW),
    "start": lambda r: lifecycle.started(r, RankStarted(job_id="j", attempt=2, node="n0", rank=0, pid=7, at=NOW), NOW),
    "start-stale": lambda r: lifecycle.started(
        r, RankStarted(job_id="j", attempt=1, node="n0", rank=0, pid=7, at=NOW), NOW
    ),
    "exit-0": lambda r: lifecycle.exited(r, _exit(0, 0), NOW),
    "exit-1": lambda r: lifecycle.exited(r, _exit(0, 1), NOW),
    "exit-stale": lambda r: lifecycle.exited(r, _exit(0, 1, attempt=1), NOW),
    "lost": lambda r: lifecycle.node_lost(r, 2, "node n0 went down", NOW),
    "lost-fail": lambda r: lifecycle.node_lost(_fail_on_loss(r), 2, "node n0 went down", NOW),
    "move": lambda r: lifecycle.migrating(
        r, MoveOrder(migration_id="m1", job_id="j", attempt=2, target=THERE, reason="defrag", at=NOW), NOW
    ),
    "ckpt-ack": lambda r: lifecycle.checkpointed(
        r, RankExited(**{**msgspec.structs.asdict(_exit(0, 0)), "checkpointed": True}), NOW
    ),
    "abort": lambda r: lifecycle.move_aborted(r, MoveAbort(migration_id="m1", job_id="j", reason="slow", at=NOW), NOW),
}

# fmt: off
TABLE = """
input        pending    inflight   placed     running    migrating  preempted  succeeded  failed     cancelled
cancel       cancelled@2 cancelled@2 cancelled@2 cancelled@2 cancelled@2 cancelled@2 -    -          -
ordered      pending@3  -          -          -          -          -          -          -          -
timed-out    -          pending@2  -          -          -          -          -          -          -
reason       pending@2  -          -          -          -          -          -          -          -
preempt      -          -          preempted@2 preempted@2 -        -          -          -          -
requeue      -          -          -          -          -          pending@3  -          -          -
commit       placed@2   placed@2   -          -          -          -          -          -          -
commit-stale -          -          -          -          -          -          -          -          -
reject       -          pending@2  -          -          -          -          -          -          -
start        wait       wait       placed@2   -          -          -          -          -          -
start-stale  -          -          -          -          -          -          -          -          -
exit-0       wait       wait       wait       running@2  migrating@2 -         succeeded@2 failed@2  -
exit-1       wait       wait       failed@2   failed@2   failed@2   -          succeeded@2 failed@2  -
exit-stale   -          -          -          -          -          -          -          -          -
lost         -          -          pending@3  pending@3  pending@3  -          -          -          -
lost-fail    -          -          failed@2   failed@2   failed@2   -          -          -          -
move         -          -          -          migrating@2 -         -          -          -          -
ckpt-ack     -          -          -          -          migrating@2 -         -          -          -
abort        -          -          -          -          pending@3  -          -          -          -
"""
# fmt: on


def _cells() -> list[tuple[str, str, str]]:
    rows = [line.split() for line in TABLE.strip().splitlines()]
    header = rows[0][1:]
    assert header == list(STATES), "the table's columns are the states"
    assert [r[0] for r in rows[1:]] == list(INPUTS), "the table's rows are the inputs"
    return [(row[0], state, cell) for row in rows[1:] for state, cell in zip(header, row[1:], strict=True)]


def _outcome(transition: Transition, rec: JobRecord) -> str:
    before = msgspec.msgpack.encode(rec)
    try:
        new = transition(rec)
    except NotYet:
        return "wait"
    finally:
        assert msgspec.msgpack.encode(rec) == before, "a transition changed the record it was given"
    return "-" if new is None else f"{new.state.value}@{new.attempt}"


@pytest.mark.parametrize(("input_", "state", "expected"), _cells(), ids=lambda v: str(v))
def test_every_state_by_every_input(input_: str, state: str, expected: str) -> None:
    assert _outcome(INPUTS[input_], STATES[state]) == expected


@pytest.mark.parametrize(("input_", "state"), [(i, s) for i, s, _ in _cells()])
def test_an_input_applied_twice_changes_nothing_the_second_time(input_: str, state: str) -> None:
    """At-least-once delivery: a redelivered input finds its own effect and leaves the record as it is."""
    try:
        first = INPUTS[input_](STATES[state])
    except NotYet:
        return
    if first is None:
        return
    again = INPUTS[input_](first)
    # a rank's start or exit, a checkpoint's ack, and the reason are per-rank or per-value: all idempotent; so
    # is every state change (its guard no longer holds). Only a new attempt can be ordered again.
    assert again is None or (input_ == "ordered" and again.attempt == first.attempt + 1)


def test_a_start_before_its_commit_waits_and_then_counts() -> None:
    """Out of order (a commit handed to a process that died comes back after its ack wait): the start of an
    attempt above the floor waits while the job is pending, also when a newer attempt is in flight (the
    older order went through after a timeout, its commit is taken), and counts once the commit is in."""
    start = RankStarted(job_id="j", attempt=2, node="n0", rank=0, pid=7, at=NOW)
    for pending in (STATES["pending"], STATES["inflight"], msgspec.structs.replace(STATES["inflight"], attempt=3)):
        with pytest.raises(NotYet):
            lifecycle.started(pending, start, NOW)
    newer_in_flight = msgspec.structs.replace(STATES["inflight"], attempt=3, allocation=THERE)
    committed = lifecycle.placed(newer_in_flight, Committed(job_id="j", attempt=2, nodes=HERE, at=NOW), ["d0"], NOW)
    assert committed is not None and (committed.state, committed.attempt, committed.allocation) == (
        JobState.PLACED,
        2,
        HERE,
    )
    after = lifecycle.started(committed, start, NOW)
    assert after is not None and after.started_ranks == [0] and after.inflight_since is None


def test_a_gangs_starts_heard_together_make_the_record_one_at_a_time_would() -> None:
    """The inbox hands a gang's rank starts over together (`started_all`): the same record as one by one, a
    repeat among them counted once, nothing new (None) when every one was already in."""

    def start(rank: int, attempt: int = 2) -> RankStarted:
        return RankStarted(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, pid=7, at=NOW)

    placed = STATES["placed"]
    one_by_one = placed
    for ev in (start(1), start(0)):
        one_by_one = lifecycle.started(one_by_one, ev, NOW) or one_by_one
    together = lifecycle.started_all(placed, [start(1), start(1), start(0)], NOW)
    assert together == one_by_one and together is not None and together.state is JobState.RUNNING
    assert lifecycle.started_all(together, [start(0), start(1)], NOW) is None
    assert lifecycle.started_all(placed, [start(0, attempt=1)], NOW) is None  # an older attempt's
    part = lifecycle.started_all(placed, [start(0)], NOW)
    assert part is not None and (part.state, part.started_ranks) == (JobState.PLACED, [0])


def test_an_exit_before_its_start_waits() -> None:
    placed = STATES["placed"]
    with pytest.raises(NotYet):
        lifecycle.exited(placed, _exit(1, 0), NOW)
    s1 = lifecycle.started(placed, RankStarted(job_id="j", attempt=2, node="n1", rank=1, pid=8, at=NOW), NOW)
    assert s1 is not None
    after = lifecycle.exited(s1, _exit(1, 0), NOW)
    assert after is not None and after.exit_codes == {"n1/1": 0} and after.state is JobState.PLACED


def test_a_rank_stopped_at_the_time_limit_fails_the_job_with_that_reason() -> None:
    running = STATES["running"]
    limited = RankExited(**{**msgspec.structs.asdict(_exit(0, -15)), "time_limit": True, "reason": "stopped"})
    after = lifecycle.exited(running, limited, NOW)
    assert after is not None and (after.state, after.reason) == (JobState.FAILED, lifecycle.TIME_LIMIT)
    assert after.exit_codes == {"n0/0": -15} and after.ended_at == NOW
    # the other node's rank, stopped by the release: its exit is recorded, the job's end stays
    stopped = RankExited(**{**msgspec.structs.asdict(_exit(1, -15)), "cause": "time limit"})
    later = lifecycle.exited(after, stopped, NOW + 1)
    assert later is not None and (later.state, later.reason, later.end, later.ended_at) == (
        JobState.FAILED,
        lifecycle.TIME_LIMIT,
        lifecycle.TIME_LIMIT,
        NOW,
    )
    assert later.exit_causes == {"n0/0": "time limit", "n1/1": "time limit"}
    assert lifecycle.exited(later, stopped, NOW + 2) is None  # once
    assert lifecycle.exited(later, _exit(2, -15), NOW) is None  # not a node of the job


def test_why_each_rank_exited_and_why_the_job_ended() -> None:
    running = STATES["running"]
    one = lifecycle.exited(running, _exit(0, 0), NOW)
    assert one is not None and one.exit_causes == {"n0/0": "completed"} and one.end == ""
    both = lifecycle.exited(one, _exit(1, 0), NOW)
    assert both is not None and (both.state, both.end) == (JobState.SUCCEEDED, "completed")
    failed = lifecycle.exited(running, _exit(1, 3), NOW)
    assert failed is not None and (failed.end, failed.exit_causes) == ("failed", {"n1/1": "failed"})
    stopped = RankExited(**{**msgspec.structs.asdict(_exit(0, -15)), "cause": "preempted"})
    assert lifecycle.rank_cause(stopped) == "preempted"
    assert lifecycle.rank_cause(RankExited(**{**msgspec.structs.asdict(_exit(0, -9)), "lost": True})) == "node lost"
    cancelled = lifecycle.cancelled(running, JobCancel(job_id="j", at=NOW), NOW)
    assert cancelled is not None and cancelled.end == "cancelled" and lifecycle.stop_cause(cancelled) == "cancelled"
    lost = lifecycle.node_lost(_fail_on_loss(running), 2, "node n0 went down", NOW)
    assert lost is not None and (lost.state, lost.end) == (JobState.FAILED, "node lost")
    requeued = lifecycle.node_lost(running, 2, "node n0 went down", NOW)
    assert requeued is not None and requeued.end == "" and requeued.exit_causes == {}
    assert lifecycle.stop_cause(STATES["preempted"]) == "preempted"
    assert lifecycle.stop_cause(STATES["migrating"]) == "moved"
    # the end rides on the terminal event, so a record rebuilt from the log says it too
    rebuilt = lifecycle.recorded(running, lifecycle.event_of(cancelled))
    assert rebuilt is not None and rebuilt.end == "cancelled"


def _replay(rec: JobRecord, steps: list[Transition]) -> JobRecord:
    for step in steps:
        rec = step(rec) or rec
    return rec


def test_replaying_a_jobs_inputs_rebuilds_its_record_duplicates_and_all() -> None:
    """From the submit to the end through a preemption and a move: the record the inputs give is the same
    when every input is delivered twice."""
    submit = JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0)

    def start(attempt: int, rank: int) -> Transition:
        return lambda r: lifecycle.started(
            r, RankStarted(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, pid=rank, at=NOW), NOW
        )

    def ack(attempt: int, rank: int) -> Transition:
        ev = RankExited(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, exit_code=0, at=NOW, checkpointed=True)
        return lambda r: lifecycle.checkpointed(r, ev, NOW)

    def commit(attempt: int, nodes: list[NodeGpus]) -> Transition:
        return lambda r: lifecycle.placed(r, Committed(job_id="j", attempt=attempt, nodes=nodes, at=NOW), ["d"], NOW)

    move = MoveOrder(migration_id="m", job_id="j", attempt=2, target=THERE, reason="defrag", at=NOW)
    steps: list[Transition] = [
        lambda r: lifecycle.ordered(r, 0, HERE, NOW),
        commit(1, HERE),
        start(1, 0),
        start(1, 1),
        lambda r: lifecycle.preempted(r, "big", NOW),
        lambda r: lifecycle.requeued(r, 1, "big", NOW),
        lambda r: lifecycle.ordered(r, 1, HERE, NOW),
        commit(2, HERE),
        start(2, 0),
        start(2, 1),
        lambda r: lifecycle.migrating(r, move, NOW),
        ack(2, 0),
        ack(2, 1),
        commit(3, THERE),
        start(3, 0),
        start(3, 1),
        lambda r: lifecycle.exited(r, _exit(0, 0, attempt=3), NOW),
        lambda r: lifecycle.exited(r, _exit(1, 0, attempt=3), NOW),
    ]
    once = _replay(lifecycle.submitted(submit, 0.0), steps)
    twice = _replay(lifecycle.submitted(submit, 0.0), [s for s in steps for _ in range(2)])
    assert once == twice
    assert (once.state, once.attempt, once.floor, once.allocation) == (JobState.SUCCEEDED, 3, 2, THERE)
    assert once.checkpoint == "j:2" and once.exit_codes == {"n0/0": 0, "n1/1": 0}
    # stale inputs of the earlier attempts change nothing at the end
    assert _replay(once, [commit(1, HERE), start(2, 0), lambda r: lifecycle.exited(r, _exit(0, 1, 2), NOW)]) == once


# -- the log replayed: a record rebuilt from the log is the record the handlers built ----------------------
class Queue:
    """The queue's handlers in miniature: each input through its transition, the JobEvent logged whenever the
    state changes (as the handlers emit it), and the inputs that come through the job's inbox logged too."""

    def __init__(self) -> None:
        submit = JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0)
        self.rec = lifecycle.submitted(submit, 1.0)
        self.log: list[lifecycle.Logged] = [lifecycle.event_of(self.rec)]
        self.t = 1.0

    def apply(self, step: Callable[[JobRecord, float], JobRecord | None], logged: object = None) -> None:
        self.t += 1.0
        if logged is not None:
            self.log.append(logged)  # type: ignore[arg-type]
        new = step(self.rec, self.t)
        if new is not None:
            if new.state is not self.rec.state:
                self.log.append(lifecycle.event_of(new))
            self.rec = new

    # inputs that come through the inbox (logged) and decisions that don't (only their JobEvent is)
    # every attempt laid out in segments of one node (as a flexible job's smaller layout would be): the
    # layout goes out with the order and comes back with its commit
    SEGMENT = 1

    def commit(self, attempt: int, nodes: list[NodeGpus]) -> None:
        ev = Committed(job_id="j", attempt=attempt, nodes=nodes, at=self.t + 1, segment=self.SEGMENT)
        self.apply(lambda r, t: lifecycle.placed(r, ev, ["d0"], t), ev)

    def start(self, attempt: int, rank: int) -> None:
        ev = RankStarted(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, pid=rank, at=self.t + 1)
        self.apply(lambda r, t: lifecycle.started(r, ev, t), ev)

    def exit(self, attempt: int, rank: int, code: int = 0, **kw: object) -> None:
        ev = RankExited(job_id="j", attempt=attempt, node=f"n{rank}", rank=rank, exit_code=code, at=self.t + 1, **kw)  # type: ignore[arg-type]
        if ev.checkpointed:
            self.apply(lambda r, t: lifecycle.checkpointed(r, ev, t), ev)
        elif ev.lost:
            self.apply(lambda r, t: lifecycle.node_lost(r, ev.attempt, f"the agent on {ev.node} stopped", t), ev)
        else:
            self.apply(lambda r, t: lifecycle.exited(r, ev, t), ev)

    def decide(self, nodes: list[NodeGpus]) -> None:
        attempt = self.rec.attempt
        self.apply(lambda r, t: lifecycle.ordered(r, attempt, nodes, t, self.SEGMENT))


def _run(steps: str) -> Queue:
    """A scenario in words: o=order on HERE, O=order on THERE, cN=commit of attempt N (HERE), CN on THERE,
    s=both ranks start, x=both exit 0, f=rank 0 fails, p=preempt+requeue, l=node lost, m=move to THERE,
    a=both ranks acknowledge the checkpoint, k=cancel."""
    q = Queue()
    for step in steps.split():
        attempt = q.rec.attempt
        if step == "o":
            q.decide(HERE)
        elif step == "O":
            q.decide(THERE)
        elif step[0] in "cC":
            q.commit(int(step[1:]), HERE if step[0] == "c" else THERE)
        elif step == "s":
            q.start(attempt, 0)
            q.start(attempt, 1)
        elif step == "x":
            q.exit(attempt, 0)
            q.exit(attempt, 1)
        elif step == "f":
            q.exit(attempt, 0, 3)
        elif step == "l":
            q.exit(attempt, 1, -9, lost=True)
        elif step == "p":
            q.apply(lambda r, t: lifecycle.preempted(r, "big", t))
            q.apply(lambda r, t, a=attempt: lifecycle.requeued(r, a, "big", t))
        elif step == "m":
            move = MoveOrder(migration_id="m1", job_id="j", attempt=attempt, target=THERE, reason="defrag", at=q.t)
            q.apply(lambda r, t, m=move: lifecycle.migrating(r, m, t))
        elif step == "a":
            q.exit(attempt, 0, checkpointed=True, ran_s=5.0)
            q.exit(attempt, 1, checkpointed=True, ran_s=6.0)
        elif step == "k":
            q.apply(lambda r, t: lifecycle.cancelled(r, JobCancel(job_id="j", at=t), t))
        else:
            raise AssertionError(f"unknown step {step!r}")
    return q


SCENARIOS = [
    "o c1 s x",
    "o c1 s f",
    "o c1 p o c3 s x",
    "o c1 s l o c3 s x",
    "o c1 s m a C2 s x",
    "o c1 s m a C2 s k",
    "o o c1 s x",  # an order timed out (decided twice) and the first one committed after all
    "o c1 k",
]


def _fold(log: list[lifecycle.Logged]) -> JobRecord:
    rec = lifecycle.submitted(JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0), 1.0)
    for msg in log:
        rec = lifecycle.replayed(rec, msg, ["d0"]) or rec
    return rec


def _settled(rec: JobRecord) -> dict[str, object]:
    """What a rebuild keeps: all of the record but an order in flight (it commits, or is decided again)."""
    out = msgspec.structs.asdict(rec)
    for key in ("updated_at", "reason", "inflight_since", "trace"):
        out.pop(key)
    return out


@pytest.mark.parametrize("steps", SCENARIOS)
def test_a_record_rebuilt_from_its_log_is_the_record_the_handlers_built(steps: str) -> None:
    """At every point of the scenario where no order is in flight, the log folded gives the record."""
    q = Queue()
    words = steps.split()
    checked = 0
    for i in range(len(words) + 1):
        q = _run(" ".join(words[:i]))
        if q.rec.inflight_since is not None:
            continue
        assert _settled(_fold(q.log)) == _settled(q.rec), f"after {words[:i]}"
        # and folded twice over (a catch-up from an earlier position replays what is there already)
        assert _settled(_fold(q.log + q.log)) == _settled(q.rec), f"twice, after {words[:i]}"
        checked += 1
    assert checked >= 3


def test_an_array_submit_is_one_record_per_task() -> None:
    body = JobBody(name="sweep", tenant="t", gpus=4, array="0-4:2,9%2", dependency="afterok:x")
    recs = lifecycle.submitted_jobs(JobSubmitted(job_id="a", spec=body, submitted_at=5.0), NOW, "tp")
    assert [(r.id, r.array_id, r.array_index) for r in recs] == [
        ("a_0", "a", 0),
        ("a_2", "a", 2),
        ("a_4", "a", 4),
        ("a_9", "a", 9),
    ]
    assert all((r.state, r.submitted_at, r.trace, r.spec) == (JobState.PENDING, 5.0, "tp", body) for r in recs)
    plain = lifecycle.submitted_jobs(JobSubmitted(job_id="p", spec=SPEC, submitted_at=5.0), NOW)
    assert [(r.id, r.array_id, r.array_index) for r in plain] == [("p", "", None)]
    # an array that doesn't parse (the gateway refuses it) makes nothing, rather than a job of the array's id
    bad = msgspec.structs.replace(body, array="3-1")
    assert lifecycle.submitted_jobs(JobSubmitted(job_id="b", spec=bad, submitted_at=5.0), NOW) == []
