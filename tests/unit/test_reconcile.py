"""Agents reconciled with the job records (shared/reconcile.py), on an injected clock.

Two nodes; job `a` (2 nodes) runs ranks 0 on n0 and 1 on n1, attempt 3 (attempts up to 2 are over):

    n0 [a0 . . .]   n1 [a1 . . .]        grace 5 s; a verdict needs 2 reports that disagree, 5 s apart
"""

from __future__ import annotations

import msgspec
import pytest

from shared.reconcile import MIN_REPORTS, LostRank, Reconciler, StrayRank, expected_ranks
from shared.schemas import JobBody, JobRecord, JobState, MoveTicket, NodeGpus, RunningRank

GRACE = 5.0
ALLOC = [NodeGpus("n0", [0]), NodeGpus("n1", [0])]


def job(state: JobState = JobState.RUNNING, **kw: object) -> JobRecord:
    fields: dict[str, object] = {"id": "a", "attempt": 3, "floor": 2, "allocation": ALLOC, "started_ranks": [0, 1]}
    fields.update(kw)
    return JobRecord(spec=JobBody(name="a", tenant="t", gpus=2, gpus_per_node=1), state=state, **fields)  # type: ignore[arg-type]


def rank(r: int, attempt: int = 3, job_id: str = "a") -> RunningRank:
    return RunningRank(job_id, attempt, r, [0])


def rounds(rec: Reconciler, jobs: dict[str, JobRecord], reports: list[tuple[float, dict[str, list[RunningRank]]]]):
    """Each (time, {node: ranks}): those reports come in at that time, then a round of verdicts."""
    out = []
    for at, by_node in reports:
        for node, ranks in by_node.items():
            rec.observe(node, ranks, at)
        out.append(rec.verdicts(jobs, at))
    return out


def test_a_rank_reported_is_never_doubted() -> None:
    r = Reconciler(GRACE)
    verdicts = rounds(r, {"a": job()}, [(t, {"n0": [rank(0)], "n1": [rank(1)]}) for t in range(0, 30, 1)])
    assert all(v == ([], []) for v in verdicts) and not r.missing


@pytest.mark.parametrize(
    ("reports", "lost_at"),
    [
        # left out from t=0 on, a report a second: lost once 5 s passed (and 2 reports)
        ([(float(t), {"n1": []}) for t in range(0, 8)], 5.0),
        # one report at t=0, the next only at t=6: two reports, 6 s: lost at 6
        ([(0.0, {"n1": []}), (6.0, {"n1": []})], 6.0),
        # reported again at t=3: the doubt starts over at t=4
        (
            [(0.0, {"n1": []}), (1.0, {"n1": []}), (3.0, {"n1": [rank(1)]})]
            + [(float(t), {"n1": []}) for t in range(4, 12)],
            9.0,
        ),
    ],
    ids=["steady", "sparse", "seen-again"],
)
def test_a_rank_left_out_is_lost_after_the_grace(reports: list, lost_at: float | None) -> None:
    r = Reconciler(GRACE)
    r.observe("n0", [rank(0)], 0.0)
    times = [at for at, _ in reports]
    verdicts = rounds(r, {"a": job()}, reports)
    first = next((t for t, (lost, _) in zip(times, verdicts, strict=True) if lost), None)
    assert first == lost_at
    lost, stray = verdicts[times.index(lost_at)]
    assert lost == [LostRank("n1", "a", 3, 1, "its agent on n1 no longer runs it")] and stray == []


def test_rounds_without_a_new_report_count_no_more_reports() -> None:
    """Nothing is judged from silence: one report that left the rank out, then nothing but time."""
    r = Reconciler(GRACE)
    r.observe("n1", [], 0.0)
    assert all(r.verdicts({"a": job()}, float(t)) == ([], []) for t in range(0, 60))
    assert r.missing[("n1", "a", 3, 1)].reports == 1 < MIN_REPORTS


def test_a_node_that_never_reported_is_not_judged() -> None:
    r = Reconciler(GRACE)
    verdicts = rounds(r, {"a": job()}, [(float(t), {"n0": [rank(0)]}) for t in range(0, 30)])
    assert all(v == ([], []) for v in verdicts)


@pytest.mark.parametrize(
    "rec",
    [
        job(exit_codes={"n1/1": 0}),  # rank 1 exited (its exit reached the queue)
        job(JobState.MIGRATING, move=MoveTicket(migration_id="m", target=[], reason="r", since=0.0, acked=[1])),
        job(JobState.PENDING, allocation=[], started_ranks=[]),  # requeued: nothing expected any more
        job(JobState.SUCCEEDED),
    ],
    ids=["exited", "checkpoint-acked", "requeued", "ended"],
)
def test_ranks_that_ended_are_not_expected(rec: JobRecord) -> None:
    assert ("a", 3, 1) not in expected_ranks([rec]).get("n1", set())
    r = Reconciler(GRACE)
    assert all(lost == [] for lost, _ in rounds(r, {"a": rec}, [(float(t), {"n1": []}) for t in range(0, 30)]))


def test_expected_ranks_follow_the_allocation() -> None:
    assert expected_ranks([job(), job(JobState.PLACED, id="b", started_ranks=[])]) == {
        "n0": {("a", 3, 0), ("b", 3, 0)},
        "n1": {("a", 3, 1), ("b", 3, 1)},
    }


@pytest.mark.parametrize(
    ("rec", "attempt", "why"),
    [
        (job(JobState.CANCELLED), 3, "job a is cancelled"),
        (job(JobState.FAILED), 3, "job a is failed"),
        (job(), 2, "its attempt is over"),  # an attempt up to the floor
        (job(JobState.PENDING, attempt=4, floor=3, allocation=[]), 3, "its attempt is over"),
    ],
    ids=["cancelled", "failed", "old-attempt", "requeued"],
)
def test_a_rank_whose_attempt_is_over_is_stray(rec: JobRecord, attempt: int, why: str) -> None:
    r = Reconciler(GRACE)
    verdicts = rounds(r, {"a": rec}, [(float(t), {"n0": [rank(0, attempt)]}) for t in range(0, 8)])
    strays = [(t, stray) for t, (_, stray) in enumerate(verdicts) if stray]
    assert strays and strays[0] == (5, [StrayRank("n0", "a", attempt, 0, why)])


@pytest.mark.parametrize(
    "rec",
    [
        job(JobState.PENDING, attempt=3, floor=2, inflight_since=1.0, allocation=ALLOC, started_ranks=[]),
        job(JobState.PENDING, attempt=4, floor=2, inflight_since=1.0, allocation=[], started_ranks=[]),
    ],
    ids=["commit-not-seen", "late-commit-of-a-timed-out-order"],
)
def test_a_rank_of_an_attempt_not_over_is_not_stray(rec: JobRecord) -> None:
    r = Reconciler(GRACE)
    verdicts = rounds(r, {"a": rec}, [(float(t), {"n0": [rank(0)]}) for t in range(0, 30)])
    assert all(stray == [] for _, stray in verdicts)


def test_an_unknown_job_is_left_alone() -> None:
    r = Reconciler(GRACE)
    verdicts = rounds(r, {}, [(float(t), {"n0": [rank(0, job_id="zz")]}) for t in range(0, 30)])
    assert all(v == ([], []) for v in verdicts)


def test_an_agent_restarted_at_once_loses_its_ranks_as_a_slow_restart_would() -> None:
    """Its next reports (a new boot) hold nothing: both ranks of its node are lost after the grace."""
    r = Reconciler(GRACE)
    two = job(allocation=[NodeGpus("n0", [0]), NodeGpus("n0", [1])])
    rounds(r, {"a": two}, [(0.0, {"n0": [rank(0), rank(1)]})])
    verdicts = rounds(r, {"a": two}, [(float(t), {"n0": []}) for t in range(1, 10)])
    lost = next(lost for lost, _ in verdicts if lost)
    assert sorted(x.rank for x in lost) == [0, 1]


def test_forget_drops_a_nodes_doubts() -> None:
    r = Reconciler(GRACE)
    rounds(r, {"a": job()}, [(0.0, {"n1": []}), (1.0, {"n1": []})])
    r.forget("n1")
    assert not r.missing and "n1" not in r.reported
    verdicts = rounds(r, {"a": msgspec.structs.replace(job())}, [(float(t), {"n1": []}) for t in range(10, 14)])
    assert all(lost == [] for lost, _ in verdicts)  # starts afresh from t=10


def test_a_rank_no_report_ever_named_has_the_longer_start_grace() -> None:
    """Its StartRank may still be held (a JetStream leader election): lost only after `start_grace_s`; a rank
    that was reported once and then left out has the short grace."""
    r = Reconciler(GRACE, start_grace_s=30.0)
    never = rounds(r, {"a": job()}, [(float(t), {"n0": [rank(0)], "n1": []}) for t in range(0, 40)])
    first = next(t for t, (lost, _) in enumerate(never) if lost)
    assert first == 30 and [x.rank for x in never[first][0]] == [1]
    r = Reconciler(GRACE, start_grace_s=30.0)
    rounds(r, {"a": job()}, [(0.0, {"n0": [rank(0)], "n1": [rank(1)]})])
    gone = rounds(r, {"a": job()}, [(float(t), {"n0": [rank(0)], "n1": []}) for t in range(1, 40)])
    assert next(t for t, (lost, _) in enumerate(gone, start=1) if lost) == 6  # left out from t=1: 5 s later
