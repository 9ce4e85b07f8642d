"""Which waiting jobs a cycle may consider (shared/core/eligibility.py): dependencies, singletons, arrays' %N."""

from __future__ import annotations

import pytest

from shared.core.dependencies import parse_dependency
from shared.core.eligibility import Busy, Status, Waiting, named_jobs, sift


def waiting(job: str, dependency: str = "", *, order: float = 0.0, name: str = "n", tenant: str = "t") -> Waiting:
    return Waiting(id=job, tenant=tenant, name=name, order=order, conditions=parse_dependency(dependency))


@pytest.mark.parametrize(
    ("dependency", "states", "verdict", "words"),
    [
        # afterok
        ("afterok:a", {"a": "succeeded"}, "eligible", ""),
        ("afterok:a", {"a": "waiting"}, "held", "waits for afterok: a (not ended)"),
        ("afterok:a", {}, "held", "waits for afterok: a (not known yet)"),
        ("afterok:a", {"a": "failed"}, "doomed", "dependency can never be met: afterok:a failed"),
        ("afterok:a", {"a": "cancelled"}, "doomed", "dependency can never be met: afterok:a cancelled"),
        ("afterok:a", {"a": "unknown"}, "doomed", "dependency can never be met: afterok:a is no job"),
        # one failed is enough, whatever the others do
        ("afterok:a:b", {"a": "waiting", "b": "failed"}, "doomed", "dependency can never be met: afterok:b failed"),
        ("afterok:a:b", {"a": "succeeded", "b": "waiting"}, "held", "waits for afterok: b (not ended)"),
        # afternotok
        ("afternotok:a", {"a": "failed"}, "eligible", ""),
        ("afternotok:a", {"a": "cancelled"}, "eligible", ""),
        ("afternotok:a", {"a": "succeeded"}, "doomed", "dependency can never be met: afternotok:a succeeded"),
        ("afternotok:a", {"a": "waiting"}, "held", "waits for afternotok: a (not ended)"),
        # afterany: any end
        ("afterany:a", {"a": "failed"}, "eligible", ""),
        ("afterany:a", {"a": "succeeded"}, "eligible", ""),
        ("afterany:a", {"a": "cancelled"}, "eligible", ""),
        ("afterany:a", {"a": "waiting"}, "held", "waits for afterany: a (not ended)"),
        # every condition must hold; each that waits is said
        (
            "afterok:a,afterany:b",
            {"a": "succeeded", "b": "waiting"},
            "held",
            "waits for afterany: b (not ended)",
        ),
        (
            "afterok:a,afterany:b",
            {"a": "waiting", "b": "waiting"},
            "held",
            "waits for afterok: a (not ended); afterany: b (not ended)",
        ),
        ("afterok:a,afternotok:b", {"a": "succeeded", "b": "succeeded"}, "doomed", "afternotok:b succeeded"),
    ],
)
def test_dependencies(dependency: str, states: dict[str, Status], verdict: str, words: str) -> None:
    out = sift([waiting("j", dependency)], [], states)
    got = "eligible" if out.eligible == ["j"] else "held" if "j" in out.held else "doomed"
    assert got == verdict
    if verdict != "eligible":
        assert words in {**out.held, **out.doomed}["j"]
    assert len(out.eligible) + len(out.held) + len(out.doomed) == 1


def test_a_reason_names_three_jobs_and_counts_the_rest() -> None:
    out = sift([waiting("j", "afterok:a:b:c:d:e")], [], {x: "waiting" for x in "abcde"})
    assert out.held["j"] == "waits for afterok: a (not ended), b (not ended), c (not ended), and 2 more"


ARRAY = {"arr": ["arr_0", "arr_1", "arr_2"]}


@pytest.mark.parametrize(
    ("dependency", "tasks", "verdict", "words"),
    [
        ("afterok:arr", ("succeeded", "succeeded", "succeeded"), "eligible", ""),
        ("afterok:arr", ("succeeded", "waiting", "waiting"), "held", "afterok: arr (array: 1 of 3 tasks ended)"),
        # one task failed: never, even with tasks still running
        ("afterok:arr", ("succeeded", "failed", "waiting"), "doomed", "afterok:arr (its task arr_1 failed)"),
        ("afterany:arr", ("succeeded", "failed", "cancelled"), "eligible", ""),
        ("afterany:arr", ("succeeded", "failed", "waiting"), "held", "(array: 2 of 3 tasks ended)"),
        # afternotok on an array (Slurm's): once all ended, met unless every one succeeded
        ("afternotok:arr", ("succeeded", "failed", "succeeded"), "eligible", ""),
        ("afternotok:arr", ("succeeded", "succeeded", "succeeded"), "doomed", "afternotok:arr (every task succeeded)"),
        ("afternotok:arr", ("failed", "waiting", "waiting"), "held", "(array: 1 of 3 tasks ended)"),
    ],
)
def test_a_dependency_on_an_array_is_on_all_its_tasks(
    dependency: str, tasks: tuple[Status, ...], verdict: str, words: str
) -> None:
    states: dict[str, Status] = dict(zip(ARRAY["arr"], tasks, strict=True))
    out = sift([waiting("j", dependency)], [], states, ARRAY)
    got = "eligible" if out.eligible == ["j"] else "held" if "j" in out.held else "doomed"
    assert got == verdict
    if words:
        assert words in {**out.held, **out.doomed}["j"]


def test_named_jobs_are_what_the_caller_looks_up() -> None:
    assert named_jobs([waiting("j", "afterok:a:b,afterany:c,singleton"), waiting("k")]) == {"a", "b", "c"}


def test_singletons_run_one_at_a_time_in_submit_order() -> None:
    # three of one name and tenant waiting, one of another name, one of another tenant: the first of each starts
    jobs = [
        waiting("s2", "singleton", order=2),
        waiting("s1", "singleton", order=1),
        waiting("s3", "singleton", order=3),
        waiting("x", "singleton", order=0, name="other"),
        waiting("y", "singleton", order=0, tenant="u"),
    ]
    out = sift(jobs, [], {})
    assert out.eligible == ["s1", "x", "y"]  # in the order given
    assert out.held["s2"] == "singleton: waits for s1 (pending) of name n"
    assert out.held["s3"] == "singleton: waits for s1 (pending), s2 (pending) of name n"
    # one of its name running (a job without the flag counts too): none starts
    out = sift(jobs, [Busy("r", "t", "n")], {})
    assert out.eligible == ["x", "y"] and out.held["s1"] == "singleton: waits for r (running) of name n"


def test_a_singleton_waits_behind_an_earlier_one_held_by_a_dependency() -> None:
    jobs = [waiting("s1", "singleton,afterok:a", order=1), waiting("s2", "singleton", order=2)]
    out = sift(jobs, [], {"a": "waiting"})
    assert out.eligible == [] and "s1 (pending)" in out.held["s2"]


def test_a_singleton_set_aside_keeps_its_place_in_line() -> None:
    # s1's order was just taken back: it isn't sifted this cycle, yet s2 (after it) still waits for it
    out = sift([waiting("s2", "singleton", order=2)], [], {}, aside=[waiting("s1", "singleton", order=1)])
    assert out.eligible == [] and out.held == {"s2": "singleton: waits for s1 (pending) of name n"}
    # one set aside after it, or of another name, holds nothing back; nor is it itself judged
    later = [waiting("s3", "singleton", order=3), waiting("o", "singleton", order=0, name="other")]
    out = sift([waiting("s2", "singleton", order=2)], [], {}, aside=later)
    assert out.eligible == ["s2"] and not out.held


def test_a_job_without_the_flag_is_not_held_by_singletons() -> None:
    out = sift([waiting("s", "singleton", order=2), waiting("p", order=3)], [Busy("r", "t", "n")], {})
    assert out.eligible == ["p"]


def task(i: int, limit: int | None = 2, array: str = "arr", dependency: str = "") -> Waiting:
    return Waiting(
        id=f"{array}_{i}",
        tenant="t",
        name="n",
        order=100 + i * 1e-6,
        conditions=parse_dependency(dependency),
        array_id=array,
        limit=limit,
    )


def test_an_arrays_cap_gives_its_free_slots_to_the_lowest_indices() -> None:
    tasks = [task(i) for i in (5, 3, 9, 4)]
    out = sift(tasks, [], {})
    assert out.eligible == ["arr_3", "arr_4"]  # (in the order given)
    assert out.held["arr_9"] == "array arr: 0 of %2 running, 2 next"
    # one running: one slot left
    out = sift(tasks, [Busy("arr_0", "t", "n", "arr")], {})
    assert out.eligible == ["arr_3"] and out.held["arr_4"] == "array arr: 1 of %2 running, 1 next"
    # as many running as the cap: none
    out = sift(tasks, [Busy("arr_0", "t", "n", "arr"), Busy("arr_1", "t", "n", "arr")], {})
    assert out.eligible == [] and out.held["arr_3"] == "array arr: 2 of %2 running"


def test_a_task_set_aside_keeps_its_slot() -> None:
    # arr_0's order was just taken back (placement may still commit it late): the free slot stays its own
    tasks = [task(1), task(2)]
    out = sift(tasks, [Busy("arr_3", "t", "n", "arr")], {}, aside=[task(0)])
    assert out.eligible == [] and out.held["arr_1"] == "array arr: 1 of %2 running, 1 next"
    # one set aside behind the waiting ones, or of another array, takes no slot before them
    out = sift(tasks, [], {}, aside=[task(7), task(0, array="other")])
    assert out.eligible == ["arr_1", "arr_2"] and not out.held


def test_tasks_held_by_a_dependency_take_no_slot_and_other_arrays_count_apart() -> None:
    tasks = [task(0, dependency="afterok:a"), task(1), task(2), task(0, array="other"), task(1, array="other")]
    out = sift(tasks, [Busy("other_7", "t", "n", "other")], {"a": "waiting"})
    assert out.eligible == ["arr_1", "arr_2", "other_0"]
    assert out.held["arr_0"].startswith("waits for afterok") and out.held["other_1"].startswith("array other: 1 of")


def test_no_cap_no_hold() -> None:
    out = sift([task(i, limit=None) for i in range(50)], [Busy(f"arr_{i}", "t", "n", "arr") for i in range(99)], {})
    assert len(out.eligible) == 50 and not out.held


def test_every_job_comes_out_once() -> None:
    jobs = [
        *[task(i, limit=3, dependency="afterany:z" if i % 4 == 0 else "") for i in range(12)],
        waiting("d", "afterok:f"),
        waiting("s1", "singleton", order=1),
        waiting("s2", "singleton", order=2),
    ]
    aside = [task(30, limit=3), waiting("s0", "singleton", order=0)]  # never judged: none comes out
    out = sift(jobs, [Busy("arr_20", "t", "n", "arr")], {"z": "waiting", "f": "failed"}, aside=aside)
    ids = [j.id for j in jobs]
    assert sorted([*out.eligible, *out.held, *out.doomed]) == sorted(ids)
    assert not set(out.eligible) & set(out.held) and not set(out.held) & set(out.doomed)
    assert out.doomed == {"d": "dependency can never be met: afterok:f failed"}
    # arr_20 (busy, of name n) holds the singletons; two of the array's three slots are free
    assert [j for j in out.eligible if j.startswith("arr_")] == ["arr_1", "arr_2"]
