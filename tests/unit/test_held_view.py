"""The queue's allocation view: a full read must not undo events that came while it was on its way."""

from __future__ import annotations

from shared.held_view import HeldView
from shared.schemas import AllocationRecord, Committed, NodeGpus, Released


def _held(view: HeldView) -> list[AllocationRecord]:
    return list(view.by_job().values())


def _alloc(job: str, attempt: int = 1) -> AllocationRecord:
    return AllocationRecord(job_id=job, attempt=attempt, nodes=[NodeGpus("n0", [0])], committed_at=0.0)


def _committed(job: str, attempt: int = 1) -> Committed:
    return Committed(job_id=job, attempt=attempt, nodes=[NodeGpus("n0", [0])], at=0.0)


def test_events_during_a_full_read_win_over_it() -> None:
    view = HeldView()
    view.replace([_alloc("old")], view.mark())
    since = view.mark()
    # while the read is on its way: "a" is committed, "old" released; the read saw neither
    view.committed(_committed("a"))
    view.released(Released(job_id="old", reason="done", at=0.0, attempt=1))
    view.replace([_alloc("old"), _alloc("b")], since)
    assert sorted(a.job_id for a in _held(view)) == ["a", "b"]
    # the next read is the truth again for them
    view.replace([_alloc("b")], view.mark())
    assert [a.job_id for a in _held(view)] == ["b"]


def test_a_late_release_of_an_older_attempt_keeps_the_newer_one() -> None:
    view = HeldView()
    view.replace([], view.mark())
    view.committed(_committed("j", 2))
    view.released(Released(job_id="j", reason="stale", at=0.0, attempt=1))
    assert [(a.job_id, a.attempt) for a in _held(view)] == [("j", 2)]
    view.released(Released(job_id="j", reason="done", at=0.0, attempt=2))
    assert _held(view) == []


def test_a_full_read_keeps_the_objects_of_records_that_did_not_change() -> None:
    """The queue's HeldState compares allocations by identity: an equal record read again must not look new."""
    view = HeldView()
    view.replace([_alloc("a"), _alloc("b")], view.mark())
    a, b = _held(view)
    view.replace([_alloc("a"), _alloc("b", attempt=2)], view.mark())
    again_a, new_b = _held(view)
    assert again_a is a
    assert new_b is not b and new_b.attempt == 2


def test_every_change_of_an_allocation_is_noted_once_for_the_cycle() -> None:
    view = HeldView()
    view.replace([_alloc("a"), _alloc("b")], view.mark())
    assert view.take_dirty() == {"a", "b"} and view.take_dirty() == set()
    view.committed(_committed("c"))
    view.released(Released(job_id="a", reason="done", at=0.0, attempt=1))
    assert view.take_dirty() == {"a", "c"}
    # a full read notes only what it changed: b unchanged, c gone, d new
    view.replace([_alloc("b"), _alloc("d")], view.mark())
    assert view.take_dirty() == {"c", "d"}
    assert dict(view.by_job()).keys() == {"b", "d"}
