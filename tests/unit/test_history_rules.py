"""The history checker's array and dependency properties (tests/history_rules.py) on small hand-made logs: each
catches what it must and passes what is sound."""

from __future__ import annotations

from shared.schemas import JobEvent, JobState, NodeGpus
from tests.history_rules import array_caps, dependencies, most_running

P, R, S, F, C, Q = (
    JobState.PLACED,
    JobState.RUNNING,
    JobState.SUCCEEDED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.PENDING,
)


def ev(job: str, state: JobState, reason: str = "") -> JobEvent:
    held = [NodeGpus("n0", [0])] if state in (P, R) else []
    return JobEvent(job_id=job, state=state, reason=reason, at=0.0, attempt=1, nodes=held)


def life(job: str, end: JobState = S) -> list[JobEvent]:
    return [ev(job, P), ev(job, R), ev(job, end)]


def test_an_arrays_cap_is_counted_over_the_whole_log() -> None:
    # a_0 and a_1 together, then a_2 once a_0 ended: at most 2
    log = [ev("a_0", P), ev("a_1", P), ev("a_0", S), ev("a_2", P), ev("a_1", S), ev("a_2", S)]
    assert array_caps(log, {"a": 2}) == []
    assert array_caps(log, {"a": 1}) == ["array a: 2 tasks running at once at event #1, more than its %1"]
    # a requeue (back to pending) frees the slot; other arrays and jobs don't count
    log = [ev("a_0", P), ev("a_0", Q), ev("a_1", P), ev("b_0", P), ev("x", P)]
    assert array_caps(log, {"a": 1, "b": 1}) == []
    assert most_running(log, {"a_0": "a", "a_1": "a"}) == {"a": (1, 0)}


def test_a_dependant_placed_before_its_condition_held_is_caught() -> None:
    sound = [*life("x"), *life("d")]
    assert dependencies(sound, {"d": "afterok:x"}) == []
    early = [ev("x", P), ev("d", P), ev("x", R), ev("x", S)]
    [v] = dependencies(early, {"d": "afterok:x"})
    assert v.startswith("(f) d placed at event #1 before afterok:x held (logged so far: x placed)")
    # afterany is met by a failure, afternotok only by one
    failed = [*life("x", F), *life("d")]
    assert dependencies(failed, {"d": "afterany:x"}) == []
    assert dependencies(failed, {"d": "afternotok:x"}) == []
    assert len(dependencies(failed, {"d": "afterok:x"})) == 1


def test_a_dependency_on_an_array_waits_for_every_task() -> None:
    tasks = {"a": ["a_0", "a_1"]}
    assert dependencies([*life("a_0"), *life("a_1"), *life("d")], {"d": "afterok:a"}, tasks) == []
    assert len(dependencies([*life("a_0"), *life("d"), *life("a_1")], {"d": "afterok:a"}, tasks)) == 1


def test_a_doomed_cancel_needs_the_end_that_dooms_it_in_the_log() -> None:
    doomed = ev("d", C, "dependency can never be met: afterok:x failed")
    assert dependencies([*life("x", F), doomed], {"d": "afterok:x"}) == []
    [v] = dependencies([ev("x", P), doomed, ev("x", F)], {"d": "afterok:x"})
    assert "cancelled at event #1 as never to be met" in v


def test_singletons_one_at_a_time_in_submit_order() -> None:
    group = {"t/n": ["s1", "s2", "s3"]}
    flags = {"s1": "singleton", "s2": "singleton", "s3": "singleton"}
    assert dependencies([*life("s1"), *life("s2"), *life("s3")], flags, singletons=group) == []
    overlap = [ev("s1", P), ev("s2", P), ev("s1", S), ev("s2", S), *life("s3")]
    got = dependencies(overlap, flags, singletons=group)
    assert "(g) s2 placed at event #1 while s1 ran" in got
    out_of_order = [*life("s2"), *life("s1"), *life("s3")]
    assert dependencies(out_of_order, flags, singletons=group) == [
        "(g) s2 placed at event #0 while s1 of t/n, submitted before it, had not ended"
    ]
