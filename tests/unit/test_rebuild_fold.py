"""The view's rebuild folds the log (services/queue/rebuild.py `LogFold`): records, allocations, and the events
the handlers didn't get to publish.

One job of 2 nodes (n0, n1); its log is cut at different points, as an outage cuts a handler short: the inputs
are in the inbox, their JobEvents may not be.
"""

from __future__ import annotations

import pytest

from services.queue.rebuild import LogFold
from shared import lifecycle
from shared.schemas import (
    Committed,
    JobBody,
    JobState,
    JobSubmitted,
    NodeGpus,
    RankExited,
    RankStarted,
)

HERE = [NodeGpus("n0", [0, 1, 2, 3]), NodeGpus("n1", [0, 1, 2, 3])]
SPEC = JobBody(name="j", tenant="t", gpus=8)


def fold(log: list[lifecycle.Logged]) -> LogFold:
    f = LogFold({}, {"n0": "d0", "n1": "d0"})
    f.submitted(JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0), "", 1.0)
    for msg in log:
        f.logged(msg)
    return f


def submitted_event() -> lifecycle.Logged:
    return lifecycle.event_of(lifecycle.submitted(JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0), 1.0))


COMMIT = Committed(job_id="j", attempt=1, nodes=HERE, at=2.0)
STARTS = [RankStarted(job_id="j", attempt=1, node=f"n{r}", rank=r, pid=r, at=3.0) for r in (0, 1)]
EXITS = [RankExited(job_id="j", attempt=1, node=f"n{r}", rank=r, exit_code=0, at=4.0) for r in (0, 1)]


def logged_states(f: LogFold) -> list[tuple[str, int]]:
    return [(str(e.state), e.attempt) for e in f.unlogged()]


@pytest.mark.parametrize(
    ("log", "state", "unlogged", "holds"),
    [
        # the inputs are in, none of their events: the placed event first, then the state it is in
        ([COMMIT], JobState.PLACED, [("placed", 1)], True),
        ([COMMIT, *STARTS], JobState.RUNNING, [("placed", 1), ("running", 1)], True),
        ([COMMIT, *STARTS, *EXITS], JobState.SUCCEEDED, [("placed", 1), ("succeeded", 1)], False),
        # the queue's events are in up to running; the exits' handler was cut short before its event
        ("running-logged", JobState.SUCCEEDED, [("succeeded", 1)], False),
        # everything logged: nothing to publish again
        ("all-logged", JobState.SUCCEEDED, [], False),
    ],
    ids=["committed", "started", "ended", "end-unlogged", "all-logged"],
)
def test_the_fold_publishes_what_only_the_inbox_said(
    log: list[lifecycle.Logged] | str, state: JobState, unlogged: list[tuple[str, int]], holds: bool
) -> None:
    if isinstance(log, str):
        rec = lifecycle.submitted(JobSubmitted(job_id="j", spec=SPEC, submitted_at=1.0), 1.0)
        placed = lifecycle.placed(rec, COMMIT, ["d0"], 2.0)
        assert placed is not None
        running = lifecycle.started(lifecycle.started(placed, STARTS[0], 3.0) or placed, STARTS[1], 3.0)
        assert running is not None and running.state is JobState.RUNNING
        log = [COMMIT, lifecycle.event_of(placed), *STARTS, lifecycle.event_of(running), *EXITS]
        if unlogged == []:
            ended = lifecycle.exited(lifecycle.exited(running, EXITS[0], 4.0) or running, EXITS[1], 4.0)
            assert ended is not None
            log.append(lifecycle.event_of(ended))
    f = fold([submitted_event(), *log])
    assert f.records["j"].state is state
    assert logged_states(f) == unlogged
    assert ("j" in f.allocations()) is holds
    if holds:
        assert f.allocations()["j"].nodes == HERE and f.allocations()["j"].committed_at == 2.0


def test_messages_of_jobs_the_log_never_submitted_are_counted_not_applied() -> None:
    f = LogFold({})
    f.logged(COMMIT)
    assert f.records == {} and f.skipped == 1 and f.unlogged() == []


def test_an_array_submit_folds_into_its_tasks_and_their_events_apply() -> None:
    """The log holds one submit for the array; the fold makes every task, as the queue's intake did, and each
    task's events apply to it alone."""
    f = LogFold({}, {"n0": "d0", "n1": "d0"})
    body = JobBody(name="sweep", tenant="t", gpus=8, array="0-2%1")
    f.submitted(JobSubmitted(job_id="a", spec=body, submitted_at=1.0), "", 1.0)
    f.logged(Committed(job_id="a_1", attempt=1, nodes=HERE, at=2.0))
    assert sorted(f.records) == ["a_0", "a_1", "a_2"]
    assert [(r.array_id, r.array_index) for r in (f.records[t] for t in ("a_0", "a_1", "a_2"))] == [
        ("a", 0),
        ("a", 1),
        ("a", 2),
    ]
    assert f.records["a_1"].state is JobState.PLACED and f.records["a_0"].state is JobState.PENDING
    assert set(f.allocations()) == {"a_1"}
