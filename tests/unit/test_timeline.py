"""The timeline's snapshots hold what a copy built from scratch would: the live state less its holds and the
running jobs that end by then (a borrower at once), whatever changed in the live state in between."""

from __future__ import annotations

from dataclasses import replace

from shared.core import Allocation, ClusterState
from shared.core.policies import Context, get_policy
from shared.core.shape import request
from shared.core.timeline import Timeline
from tests.unit.cycle_builders import Run, fleet, job

ROWS = ["AAAAAABBBBBB CCC...", "DDDDDDDDD EEEEEEE .."]
RUNS = {"A": Run(end=100.0), "B": Run(end=300.0), "C": Run(end=200.0), "D": Run(end=200.0), "E": Run(end=400.0)}


def _scratch(live: ClusterState, lent: set[str], t: float) -> ClusterState:
    """The state at t, built the slow way."""
    out = live.copy()
    out.release_many([j for j, a in live.allocs.items() if a.hold or j in lent or a.expected_end <= t])
    return out


def _same(a: ClusterState, b: ClusterState) -> None:
    assert a.free == b.free and a.nfree == b.nfree and a.count == b.count and a.usable == b.usable
    assert a.pins == b.pins and a.pinned_in == b.pinned_in and set(a.allocs) == set(b.allocs)
    assert [bool(j) for j in a.node_jobs] == [bool(j) for j in b.node_jobs]


def test_snapshots_follow_the_live_state() -> None:
    live = fleet(ROWS, RUNS)
    tl = Timeline()
    lent: set[str] = set()
    for t in (300.0, 100.0, 200.0, 400.0):
        _same(tl.at(live, lent, 0.0, t), _scratch(live, lent, t))
    # a hold, a started job, a shrunk job, a borrower and an ended job: every snapshot learns them
    live.allocate(Allocation("resv:X", (15, 16), (0b1111, 0b1111), hold=True))
    live.allocate(Allocation("F", (17,), (0b1111,), expected_end=250.0))
    e = live.release("E")
    live.allocate(replace(e, nodes=e.nodes[:4], masks=e.masks[:4], gpus=0, expected_end=150.0))
    lent.add("B")
    live.release("A")
    for t in (100.0, 250.0, 300.0, 400.0, 1000.0):
        _same(tl.at(live, lent, 50.0, t), _scratch(live, lent, t))


def test_a_memo_is_forgotten_when_its_snapshot_changes() -> None:
    live = fleet(ROWS, RUNS)
    policy = get_policy("rackscale")
    req = request(job("X", 64), live.topo)
    tl = Timeline()
    ctx = Context(now=300.0, job_end=1300.0)
    assert tl.place(policy, req, ctx, set(), live, set(), 0.0) is not None  # A, B, C gone: d00 free
    live.release("A")  # ended early, and F starts in its place for long: d00 has 12 nodes free by 300
    live.allocate(Allocation("F", tuple(range(6)), (0b1111,) * 6, expected_end=1e4))
    assert tl.place(policy, req, ctx, set(), live, set(), 0.0) is None
    assert policy.place(_scratch(live, set(), 300.0), req, ctx) is None
