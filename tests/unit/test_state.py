"""ClusterState bookkeeping and Statement checkpoint/rollback/commit/discard.

Most cases use two small domains of 4 nodes x 4 GPUs (cells as in tests/unit/builders.py)::

    d00 ....
    d01 ....

`count[level][group][k]` = usable nodes of the group with at least k free GPUs (k = 0 counts every
usable node), so a free 4-node domain has the row [4, 4, 4, 4, 4].
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared.core import Allocation, StateError, Statement
from tests.unit.builders import (
    Fleet,
    clone,
    fleet,
    from_sketch,
    hosts,
    occupy,
    sketch,
    snapshot,
)


def idx(state: Fleet, name: str) -> int:
    return state.topo.node_index[name]


def row(state: Fleet, domain: str) -> list[int]:
    topo = state.topo
    return state.count[topo.domain][topo.group_names[topo.domain].index(domain)]


# -- allocate / release keep counts right -----------------------------------------------------------------
@dataclass(frozen=True)
class Counts:
    id: str
    ops: tuple[tuple[object, ...], ...]  # ("alloc", job, "hosts", gpus|None) or ("release", job)
    sketch: str  # what the ops leave
    d00: list[int]  # count row of d00, k = 0..4
    cluster: list[int]  # count row of the root
    free_gpus: int


A = ("alloc", "a", "d00-n00..01", None)
B = ("alloc", "b", "d00-n02", (0, 1))
COUNTS = [
    Counts("empty", (), "d00 ....\nd01 ....", [4, 4, 4, 4, 4], [8, 8, 8, 8, 8], 32),
    # two whole nodes gone from every k
    Counts("whole-nodes", (A,), "d00 ##..\nd01 ....", [4, 2, 2, 2, 2], [8, 6, 6, 6, 6], 24),
    # n02 keeps 2 free: still counted for k <= 2
    Counts("partial-node", (B,), "d00 ..2.\nd01 ....", [4, 4, 4, 3, 3], [8, 8, 8, 7, 7], 30),
    Counts("whole-and-partial", (A, B), "d00 ##2.\nd01 ....", [4, 2, 2, 1, 1], [8, 6, 6, 5, 5], 22),
    Counts("release-whole", (A, B, ("release", "a")), "d00 ..2.\nd01 ....", [4, 4, 4, 3, 3], [8, 8, 8, 7, 7], 30),
    Counts("release-all", (A, B, ("release", "a"), ("release", "b")), "d00 ....\nd01 ....", [4] * 5, [8] * 5, 32),
    # one GPU on each of two domains: d00-n03 and d01-n00 keep 3 free
    Counts("across-domains", (("alloc", "c", "d00-n03 d01-n00", (3,)),), "d00 ...3\nd01 3...", [4, 4, 4, 4, 3],
           [8, 8, 8, 8, 6], 30),
]  # fmt: skip


def apply(state: Fleet, ops: tuple[tuple[object, ...], ...]) -> None:
    for op in ops:
        if op[0] == "alloc":
            _, job_id, spec, gpus = op
            occupy(state, str(job_id), hosts(str(spec)), gpus)  # type: ignore[arg-type]
        else:
            state.release(str(op[1]))


@pytest.mark.parametrize("case", COUNTS, ids=[c.id for c in COUNTS])
def test_counts_follow_allocations(case: Counts) -> None:
    state = fleet(2, nodes=4)
    apply(state, case.ops)
    state.check()
    assert sketch(state) == case.sketch
    assert row(state, "d00") == case.d00, sketch(state)
    assert state.count[0][0] == case.cluster, sketch(state)
    assert state.free_gpus() == case.free_gpus
    # a state built from the same picture counts the same
    assert from_sketch(case.sketch).count == state.count


# -- impossible changes raise and change nothing ------------------------------------------------------------
BAD_ALLOCS = [
    # (id, what to allocate on top of "a" = GPUs 0,1 of d00-n00, phrase)
    ("gpu-taken", Allocation("b", (1, 0), (0b1111, 0b0010)), "are not free"),
    ("same-job-twice", Allocation("a", (3,), (0b0001,)), "already holds GPUs"),
    ("whole-node-over-partial", Allocation("b", (0,), (0b1111,)), "are not free"),
    # one allocation naming the same free GPU twice (d00-n03 GPU 0) books it twice
    ("same-gpu-twice-in-one-allocation", Allocation("b", (3, 3), (0b0001, 0b0001)), ""),
]


@pytest.mark.parametrize(("alloc", "phrase"), [c[1:] for c in BAD_ALLOCS], ids=[c[0] for c in BAD_ALLOCS])
def test_double_allocation_raises_and_changes_nothing(alloc: Allocation, phrase: str) -> None:
    # d00 2...   (d00-n00 GPUs 0,1 held by "a")
    state = fleet(1, nodes=4)
    occupy(state, "a", ["d00-n00"], gpus=[0, 1])
    before = snapshot(state)
    with pytest.raises(StateError, match=phrase or None):
        state.allocate(alloc)
    assert snapshot(state) == before
    state.check()


def test_release_unknown_job_raises() -> None:
    state = fleet(1, nodes=4)
    occupy(state, "a", ["d00-n00"])
    before = snapshot(state)
    with pytest.raises(StateError, match="holds no GPUs"):
        state.release("nope")
    state.release("a")
    with pytest.raises(StateError, match="holds no GPUs"):
        state.release("a")  # twice
    assert snapshot(state) != before
    state.check()


def test_allocation_masks_must_match_nodes() -> None:
    with pytest.raises(StateError, match="2 nodes but 1 masks"):
        Allocation("a", (0, 1), (0b1,))


# -- health ------------------------------------------------------------------------------------------------
def test_down_gpu_never_free() -> None:
    # d00 -...   (d00-n00 GPU 0 down)
    state = fleet(1, nodes=4, gpu_down=[("d00-n00", 0)])
    n0 = idx(state, "d00-n00")
    assert state.free[n0] == 0b1110
    assert row(state, "d00") == [4, 4, 4, 4, 3]  # n00 has 3 free: not a whole-node host
    assert state.free_gpus() == 15
    with pytest.raises(StateError, match=r"GPUs \(0,\) of node d00-n00 are not free"):
        state.allocate(Allocation("a", (n0,), (0b0001,)))
    occupy(state, "a", ["d00-n00"])  # whole node = the healthy GPUs
    assert state.allocs["a"].masks == (0b1110,)
    state.release("a")
    assert state.free[n0] == 0b1110  # the down GPU did not come back
    state.check()
    assert sketch(state) == "d00 -..."


@pytest.mark.parametrize("health", ["draining", "down"])
def test_unusable_node_not_counted_but_allocation_survives(health: str) -> None:
    # d00 #...  then n00 goes draining/down while "a" runs on it
    state = fleet(1, nodes=4)
    occupy(state, "a", ["d00-n00"], gpus=[0])
    n0 = idx(state, "d00-n00")
    assert row(state, "d00") == [4, 4, 4, 4, 3]
    state.set_usable(n0, False)
    assert row(state, "d00") == [3, 3, 3, 3, 3]  # n00 no longer counted at any k
    assert state.free_gpus() == 12
    assert "a" in state.allocs and state.node_jobs[n0] == {"a": 0b0001}
    state.check()
    state.release("a")
    assert state.free[n0] == 0b1111 and row(state, "d00") == [3, 3, 3, 3, 3]
    state.set_usable(n0, True)
    assert row(state, "d00") == [4, 4, 4, 4, 4]
    state.check()


def test_pinned_nodes_follow_allocations_usability_and_copies() -> None:
    # pinned: a job the migration planner can't move holds GPUs there (no checkpoint, or ranks in two domains)
    state = fleet(2, nodes=4)
    n = [idx(state, f"d00-n0{i}") for i in range(4)] + [idx(state, f"d01-n0{i}") for i in range(4)]

    def alloc(job: str, nodes: list[int], mask: int = 0b0001, **kw: bool) -> Allocation:
        return Allocation(job, tuple(nodes), tuple(mask for _ in nodes), **kw)

    state.allocate(alloc("stays", [n[0], n[1]]))  # can't checkpoint
    state.allocate(alloc("moves", [n[2]], checkpointable=True))  # one domain, checkpointable: not pinning
    state.allocate(alloc("spans", [n[3], n[4]], checkpointable=True))  # checkpointable, but in two domains
    state.allocate(alloc("hold", [n[5]], hold=True))  # a reservation's hold never pins
    state.allocate(alloc("also", [n[0]], 0b0010))  # a second pinning job on n00
    assert state.pins[:8] == [2, 1, 0, 1, 1, 0, 0, 0] and state.pinned_in == [3, 1]
    state.check()
    copy = state.copy()
    state.set_usable(n[0], False)  # a drained or down node is no domain's pinned usable node
    assert state.pinned_in == [2, 1] and copy.pinned_in == [3, 1]
    state.release("stays")
    assert state.pins[:2] == [1, 0] and state.pinned_in == [1, 1]
    state.set_usable(n[0], True)
    assert state.pinned_in == [2, 1]
    state.release("also")
    state.release("spans")
    assert state.pins == [0] * 8 and state.pinned_in == [0, 0]
    state.check()
    copy.check()


@pytest.mark.parametrize(
    ("kw", "cells"),
    [({"draining": ["d00-n01"]}, "d00 .d.."), ({"down": ["d00-n01"]}, "d00 .x..")],
    ids=["draining", "down"],
)
def test_unusable_from_health(kw: dict[str, list[str]], cells: str) -> None:
    state = fleet(1, nodes=4, **kw)  # type: ignore[arg-type]
    assert row(state, "d00") == [3, 3, 3, 3, 3]
    assert state.free_gpus() == 12
    assert sketch(state) == cells
    # a job restored onto the node (it ran before the drain) is held and changes no count
    occupy(state, "old", ["d00-n01"])
    assert row(state, "d00") == [3, 3, 3, 3, 3]
    state.check()
    state.release("old")
    state.check()


def test_degraded_gpus_counted() -> None:
    # d00 g...   (d00-n00 GPU 0 degraded: usable, placed last)
    state = fleet(2, nodes=4, degraded=[("d00-n00", 0)])
    n0 = idx(state, "d00-n00")
    assert state.free[n0] == 0b1111
    assert state.degraded[n0] == 0b0001
    assert row(state, "d00") == [4, 4, 4, 4, 4]
    assert state.free_gpus() == 32
    dom = state.topo.domain
    assert state.degraded_in[dom] == {0: 1}  # one degraded node in domain 0
    assert state.degraded_in[0] == {0: 1}  # and in the cluster
    occupy(state, "a", ["d00-n00"])
    assert state.allocs["a"].masks == (0b1111,)
    assert sketch(state).splitlines()[0] == "d00 G..."


# -- sketch helpers round trip ------------------------------------------------------------------------------
SKETCHES = [
    "d00 ##############....\nd01 ##................",
    "d00 .21x\nd01 dg-G",
    "d00 3###\nd01 ...1",
]


@pytest.mark.parametrize("text", SKETCHES, ids=["busy-runs", "health", "partial"])
def test_sketch_round_trip(text: str) -> None:
    state = from_sketch(text)
    state.check()
    assert sketch(state) == text
    assert sketch(clone(state)) == text
    assert snapshot(clone(state)) == snapshot(state)


# -- Statement ----------------------------------------------------------------------------------------------
def base() -> Fleet:
    # d00 ##..   "pre" holds d00-n00..01
    # d01 ....
    state = fleet(2, nodes=4)
    occupy(state, "pre", ["d00-n00", "d00-n01"], expected_end=50.0, priority=3)
    return state


def alloc(state: Fleet, job_id: str, spec: str, gpus: int = 0b1111) -> Allocation:
    nodes = tuple(state.topo.node_index[n] for n in hosts(spec))
    return Allocation(job_id, nodes, (gpus,) * len(nodes))


def test_rollback_restores_exactly() -> None:
    state = base()
    before = snapshot(state)
    st = Statement(state)
    cp = st.checkpoint()
    st.allocate(alloc(state, "x", "d01-n00..01"))
    st.release("pre")
    st.allocate(alloc(state, "y", "d00-n00", 0b0011))  # reuses a GPU "pre" let go
    st.set_usable(idx(state, "d01-n03"), False)
    assert sketch(state) == "d00 2...\nd01 ##.d"
    state.check()
    st.rollback(cp)
    assert snapshot(state) == before
    restored = state.allocs["pre"]
    assert (restored.masks, restored.expected_end, restored.priority) == ((0b1111, 0b1111), 50.0, 3)
    state.check()


def test_commit_keeps_and_empties_the_log() -> None:
    state = base()
    st = Statement(state)
    st.allocate(alloc(state, "x", "d01-n00"))
    st.release("pre")
    after = snapshot(state)
    assert [kind for kind, _ in st.changes()] == ["allocate", "release"]
    st.commit()
    assert st.changes() == [] and st.checkpoint() == 0
    st.rollback(0)  # nothing to undo
    st.discard()
    assert snapshot(state) == after
    state.check()


def test_discard_undoes_everything() -> None:
    state = base()
    before = snapshot(state)
    st = Statement(state)
    st.allocate(alloc(state, "x", "d01-n00"))
    st.set_usable(idx(state, "d00-n03"), False)
    st.release("x")
    st.release("pre")
    st.discard()
    assert snapshot(state) == before
    assert st.changes() == []
    state.check()


def test_nested_checkpoints() -> None:
    state = base()
    st = Statement(state)
    s0 = snapshot(state)
    cp0 = st.checkpoint()
    st.allocate(alloc(state, "a", "d01-n00"))
    s1 = snapshot(state)
    cp1 = st.checkpoint()
    st.allocate(alloc(state, "b", "d01-n01"))
    s2 = snapshot(state)
    cp2 = st.checkpoint()
    st.release("a")
    st.set_usable(idx(state, "d01-n02"), False)
    assert sketch(state) == "d00 ##..\nd01 .#d."
    st.rollback(cp2)
    assert snapshot(state) == s2
    st.rollback(cp1)
    assert snapshot(state) == s1
    # work after a partial rollback is undone by an outer one
    st.allocate(alloc(state, "c", "d01-n03"))
    st.rollback(cp0)
    assert snapshot(state) == s0
    state.check()


def test_failed_allocate_is_not_logged() -> None:
    state = base()
    st = Statement(state)
    cp = st.checkpoint()
    before = snapshot(state)
    with pytest.raises(StateError):
        st.allocate(alloc(state, "x", "d00-n01..02"))  # d00-n01 is held by "pre"
    assert st.checkpoint() == cp
    assert snapshot(state) == before
    st.discard()
    assert snapshot(state) == before


def test_set_usable_rollback_keeps_health_state() -> None:
    # d00 x...  (down from health); the statement "ups" it and rolls back
    state = fleet(1, nodes=4, down=["d00-n00"])
    before = snapshot(state)
    st = Statement(state)
    st.set_usable(0, True)
    assert row(state, "d00") == [4, 4, 4, 4, 4]
    st.set_usable(0, True)  # no change, still logged and undone
    st.discard()
    assert snapshot(state) == before
    state.check()


def test_a_copy_is_equal_and_independent() -> None:
    import random

    from shared.core import ClusterState, GpuState, Health, NodeState

    topo = fleet(2).topo
    health = Health({topo.node_names[5]: NodeState.DOWN}, {(topo.node_names[7], 2): GpuState.DEGRADED})
    base = ClusterState(topo, health)
    copy = base.copy()
    for name in ClusterState.__slots__:
        assert getattr(copy, name) == getattr(base, name), name
    rng = random.Random(3)
    for i in range(20):  # allocations on the copy leave the original as it was built
        node = rng.choice([n for n in range(len(topo)) if copy.node_fits(n, 1, False)])
        copy.allocate(Allocation(f"j{i}", (node,), (copy.free[node] & -copy.free[node],)))
        copy.check()
    fresh = ClusterState(topo, health)
    for name in ClusterState.__slots__:
        assert getattr(base, name) == getattr(fresh, name), name
    assert copy.free != base.free and copy.allocs and not base.allocs
    # and the other way: the original changing after the copy (HeldState keeps its state and hands out
    # copies) leaves the copy as it was; node_jobs' per-node dicts are shared until one side changes a node
    before = snapshot(copy)
    taken = [n for n in range(len(topo)) if copy.node_jobs[n]]
    for i, node in enumerate(taken):
        base.allocate(Allocation(f"b{i}", (node,), (base.free[node] & -base.free[node],), tenant="t", priority=i))
    base.check()
    base.release("b0")
    assert snapshot(copy) == before and all(copy.node_jobs[n] != base.node_jobs[n] for n in taken[1:])
    copy.release("j0")
    copy.check()
    base.check()


def test_tenant_gpus_and_priorities_follow_running_jobs() -> None:
    # what a cycle reads for quotas and its preemption floor, kept without a pass over every allocation
    state = fleet(2, nodes=4)
    n0, n1 = idx(state, "d00-n00"), idx(state, "d00-n01")
    state.allocate(Allocation("a", (n0,), (0b0011,), tenant="x", priority=5))
    state.allocate(Allocation("b", (n0, n1), (0b0100, 0b1111), tenant="y", priority=1))
    state.allocate(Allocation("c", (n1 + 1,), (0b0001,), tenant="x", priority=5))
    state.allocate(Allocation("hold:z", (n1 + 2,), (0b1111,), tenant="z", priority=0, hold=True))  # no job
    assert state.tenant_gpus == {"x": 3, "y": 5} and state.priorities == {5: 2, 1: 1}
    assert state.min_priority() == 1
    state.check()
    state.release("b")
    assert state.tenant_gpus == {"x": 3} and state.min_priority() == 5
    copy = state.copy()
    state.release("a")
    state.release("c")
    assert state.tenant_gpus == {} and state.priorities == {} and state.min_priority() is None
    assert copy.tenant_gpus == {"x": 3} and copy.priorities == {5: 2}
    state.check()
    copy.tenant_gpus["x"] = 4  # drift is caught by the recount
    with pytest.raises(StateError, match="per-tenant"):
        copy.check()


def test_set_usable_many_equals_one_at_a_time() -> None:
    # the forecast takes the reserved layouts' nodes out in bulk: the same counts and pins as node by node
    import random

    from shared.core import ClusterState

    rng = random.Random(5)
    base = fleet(3, nodes=4)
    for i in range(12):
        node = rng.choice([n for n in range(len(base.topo)) if base.node_fits(n, 1, False)])
        base.allocate(Allocation(f"j{i}", (node,), (base.free[node] & -base.free[node],), checkpointable=i % 2 == 0))
    for usable in (False, True):
        bulk, single = base.copy(), base.copy()
        nodes = rng.sample(range(len(base.topo)), 7)
        nodes += nodes[:2]  # named twice: flipped once
        if usable:
            for s in (bulk, single):
                for n in nodes:
                    s.set_usable(n, False)
        bulk.set_usable_many(nodes, usable)
        for n in nodes:
            single.set_usable(n, usable)
        for name in ClusterState.__slots__:
            assert getattr(bulk, name) == getattr(single, name), name
        bulk.check()


def test_release_many_equals_one_at_a_time() -> None:
    # a forecast ends a batch of running jobs at once: the same state as releasing them one by one
    import random

    from shared.core import ClusterState

    rng = random.Random(7)
    base = fleet(3, nodes=4)
    for i in range(30):
        nodes = [n for n in range(len(base.topo)) if base.node_fits(n, 1, False)]
        picked = rng.sample(nodes, min(len(nodes), rng.randint(1, 3)))
        masks = tuple(base.free[n] & -base.free[n] for n in picked)
        base.allocate(Allocation(f"j{i}", tuple(picked), masks, checkpointable=i % 3 == 0, tenant=f"t{i % 2}"))
    base.set_usable(3, False)
    ids = rng.sample(sorted(base.allocs), 12)
    bulk, single = base.copy(), base.copy()
    bulk.release_many(ids)
    for j in ids:
        single.release(j)
    for name in ClusterState.__slots__:
        assert getattr(bulk, name) == getattr(single, name), name
    bulk.check()
    with pytest.raises(StateError):
        bulk.release_many([ids[0]])
