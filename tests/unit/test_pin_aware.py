"""Rackscale keeps what the migration planner can't move together (`pin_aware`), on hand-made fleets.

A node is *pinned* when a job on it can't be moved by the planner: one that can't checkpoint, or one with
ranks in another NVLink domain. A domain whose pinned nodes leave fewer than 16 of its usable nodes can't be
emptied to a planning unit; jobs that can't move go there first (tier 0), then where the domain stays
emptiable (tier 1), and only then where they would pin a domain (tier 2). Fleets: 18 nodes x 4 GPUs per
domain; node names ``d01-n05``: domain 1, node 5.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.core import (
    Allocation,
    ClusterState,
    Context,
    CycleConfig,
    JobSpec,
    Need,
    Scheduler,
    Topology,
    get_policy,
    request,
)
from shared.core.policies.rackscale import RackscalePolicy, pinned_node

ALL = 0b1111
POLICY = RackscalePolicy()
POLICY.pin_aware = True  # as the scheduler sets it with migration on (CycleConfig.pin_aware)
CTX = Context(now=0.0, job_end=3600.0, demand=frozenset({16}))


class Fleet:
    def __init__(self, domains: int) -> None:
        self.topo = Topology.uniform(domains, 18, 4)
        self.state = ClusterState(self.topo)

    def run(
        self,
        job_id: str,
        domain: int,
        nodes: Iterable[int],
        *,
        ckpt: bool,
        spread: Iterable[tuple[int, Iterable[int]]] = (),
    ) -> None:
        idx = [domain * 18 + n for n in nodes]
        for d, ns in spread:
            idx += [d * 18 + n for n in ns]
        self.state.allocate(Allocation(job_id, tuple(idx), (ALL,) * len(idx), checkpointable=ckpt))

    def part(self, job_id: str, domain: int, node: int, mask: int, *, ckpt: bool) -> None:
        self.state.allocate(Allocation(job_id, (domain * 18 + node,), (mask,), checkpointable=ckpt))

    def place(self, spec: JobSpec, policy: object = POLICY) -> list[str]:
        placed = policy.place(self.state, request(spec, self.topo), CTX)  # type: ignore[attr-defined]
        assert placed is not None
        return [self.topo.node_names[n] for n in placed.nodes]


def two_kinds() -> Fleet:
    """d00: a checkpointable job on 15 nodes, 3 free (the best fit for 2 nodes).
    d01: a job that can't checkpoint on n00-n02 (3 pinned nodes: d01 can't be emptied to 16 anyway),
    a checkpointable one on n03-n07, 10 free."""
    f = Fleet(2)
    f.run("m", 0, range(0, 15), ckpt=True)
    f.run("p", 1, range(0, 3), ckpt=False)
    f.run("c", 1, range(3, 8), ckpt=True)
    return f


def test_scheduler_sets_pin_awareness() -> None:
    assert Scheduler(CycleConfig(policy="rackscale", pin_aware=True)).policy.pin_aware
    assert not Scheduler(CycleConfig(policy="rackscale")).policy.pin_aware


def test_pinned_nodes() -> None:
    f = two_kinds()
    f.run("s", 0, [15], ckpt=True, spread=[(1, [8])])  # checkpointable, but spans d00 and d01
    pinned = [f.topo.node_names[n] for n in range(len(f.topo)) if pinned_node(f.state, n)]
    assert pinned == ["d00-n15", "d01-n00", "d01-n01", "d01-n02", "d01-n08"]


def test_job_that_cant_move_goes_where_the_domain_is_pinned_already() -> None:
    f = two_kinds()
    # can't checkpoint: d01 (tier 0) rather than the best fit d00, which it would be the first to pin
    assert f.place(JobSpec("x", 8)) == ["d01-n08", "d01-n09"]
    # checkpointable: the best fit, as before (3 free -> 1 left in d00)
    assert f.place(JobSpec("y", 8, checkpointable=True)) == ["d00-n15", "d00-n16"]


def test_without_pin_awareness_the_best_fit_wins() -> None:
    f = two_kinds()
    plain = get_policy("rackscale")  # pin_aware off: the default without migration
    assert not plain.pin_aware
    assert f.place(JobSpec("x", 8), plain) == ["d00-n15", "d00-n16"]


def test_job_that_cant_move_keeps_a_domain_emptiable_before_pinning_it() -> None:
    """d00: 2 pinned nodes already (n00, n01) and a checkpointable job on n02-n11, 6 free: one more pinned
    node and only 15 could ever be freed (tier 2). d01: a checkpointable job on n00-n09, 8 free, no pins: it
    stays emptiable with one pinned node (tier 1), although d00 is the better fit."""
    f = Fleet(2)
    f.run("p", 0, range(0, 2), ckpt=False)
    f.run("c", 0, range(2, 12), ckpt=True)
    f.run("e", 1, range(0, 10), ckpt=True)
    assert f.place(JobSpec("x", 4, nvlink=Need.NONE)) == ["d01-n10"]
    assert f.place(JobSpec("y", 4, nvlink=Need.NONE, checkpointable=True)) == ["d00-n12"]


def test_partial_job_that_cant_move_shares_a_pinned_node() -> None:
    """d00 n00: 2 GPUs held by a job that can't checkpoint; n01: 3 GPUs held by a checkpointable one (the
    best fit for 1 GPU). A 1-GPU job that can't move joins the pinned node; a checkpointable one the best fit."""
    f = Fleet(1)
    f.part("p", 0, 0, 0b0011, ckpt=False)
    f.part("c", 0, 1, 0b0111, ckpt=True)
    assert f.place(JobSpec("x", 1, nvlink=Need.NONE)) == ["d00-n00"]
    assert f.place(JobSpec("y", 1, nvlink=Need.NONE, checkpointable=True)) == ["d00-n01"]


def test_segmented_job_that_cant_move_fills_pinned_leftovers() -> None:
    """d00 and d01 each hold a job that can't checkpoint on n00-n13 (4 free each); d02 a checkpointable
    one on n00-n09 (8 free). An 8-node job in segments of 4: checkpointable, it takes d02's 8 free nodes (one
    domain, so the planner can still move it); unable to checkpoint, it takes the 4-node leftovers of d00 and
    d01 instead of pinning d02."""
    f = Fleet(3)
    f.run("p0", 0, range(0, 14), ckpt=False)
    f.run("p1", 1, range(0, 14), ckpt=False)
    f.run("c", 2, range(0, 10), ckpt=True)
    moved = f.place(JobSpec("y", 32, segment=4, checkpointable=True))
    assert moved == [f"d02-n{i:02d}" for i in range(10, 18)]
    pinned = f.place(JobSpec("x", 32, segment=4))
    assert pinned == [f"d00-n{i:02d}" for i in range(14, 18)] + [f"d01-n{i:02d}" for i in range(14, 18)]
