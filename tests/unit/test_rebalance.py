"""Rebalancing on hand-made fleets (shared/core/rebalance.py), with the expected moves written out.

Two domains of 6 nodes x 4 GPUs. Temperatures follow the sim's model, 36.5 C + 41 C x utilisation, and
domain d00 runs `hot` degrees above it. Jobs hold whole nodes.

    d00 [a] [b] [c c] [ ] [ ]   (+12 C)        d01 [ ] [ ] [ ] [ ] [ ] [ ]   (idle)
"""

from __future__ import annotations

import random

import pytest

from shared.core import Allocation, ClusterState, JobSpec, MigrationBudget, Movable, Topology, get_policy
from shared.core.rebalance import GpuHeat, HeatSums, offsets_from_sums, plan_rebalance, thermal_offsets

ALL = 0b1111
POLICY = get_policy("rackscale")


def fleet() -> tuple[ClusterState, dict[str, JobSpec]]:
    state = ClusterState(Topology.uniform(2, 6, 4))
    specs: dict[str, JobSpec] = {}
    for job, nodes in (("a", (0,)), ("b", (1,)), ("c", (2, 3))):
        specs[job] = JobSpec(job, 4 * len(nodes), checkpointable=True, expected_runtime_s=3600.0)
        state.allocate(Allocation(job, nodes, (ALL,) * len(nodes), checkpointable=True, expected_end=3600.0))
    return state, specs


def samples(state: ClusterState, hot: float) -> list[GpuHeat]:
    out = []
    for node in range(len(state.topo)):
        util = 0.9 if state.nfree[node] == 0 else 0.0
        extra = hot if node < 6 else 0.0
        out += [GpuHeat(node, util, 36.5 + 41.0 * util + extra) for _ in range(4)]
    return out


def movable(specs: dict[str, JobSpec]) -> dict[str, Movable]:
    return {j: Movable(s, checkpoint_s=30.0, restore_s=30.0) for j, s in specs.items()}


def test_offsets_compare_domains_at_the_same_load() -> None:
    state, _ = fleet()
    # d00 busier and 12 C hot, d01 idle: the fit takes the load out, the offsets keep the heat
    offsets = thermal_offsets(state.topo, samples(state, hot=12.0))
    assert offsets[0] - offsets[1] == pytest.approx(12.0, abs=1e-6)
    # busy but not hot: no offset, however uneven the load
    flat = thermal_offsets(state.topo, samples(state, hot=0.0))
    assert flat[0] == pytest.approx(0.0, abs=1e-6) and flat[1] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("utils", [(0.0, 0.9), (0.9,), (0.1, 0.35, 0.8)], ids=["busy-and-idle", "all-busy", "mixed"])
def test_per_node_sums_give_the_offsets_of_the_samples(utils: tuple[float, ...]) -> None:
    """The migration service keeps each node's sums, not its samples: summed per domain, they fit the same
    offsets (all-busy: no variation inside domains, the pooled fallback)."""
    topo = Topology.uniform(3, 5, 4)
    rng = random.Random(7)
    per_node: dict[int, list[GpuHeat]] = {}
    for node in range(len(topo)):
        heat = 8.0 if node < 5 else 0.0
        for _ in range(4):
            util = rng.choice(utils)
            per_node.setdefault(node, []).append(GpuHeat(node, util, 35.0 + 40.0 * util + heat + rng.gauss(0, 1)))
    expected = thermal_offsets(topo, [g for gs in per_node.values() for g in gs])
    by_domain: dict[int, HeatSums] = {}
    for node, gs in per_node.items():
        d = topo.node_group[topo.domain][node]
        by_domain[d] = by_domain.get(d, HeatSums()) + HeatSums.of((g.util, g.temp_c) for g in gs)
    got = offsets_from_sums(by_domain)
    assert got.keys() == expected.keys() == {0, 1, 2}
    assert got == pytest.approx(expected, abs=1e-9)
    assert got[0] == pytest.approx(8.0 * 2 / 3, abs=1.5)  # d00 runs 8 C hot against two cool peers
    assert offsets_from_sums({}) == {} and offsets_from_sums({0: HeatSums()}) == {}


def test_a_hot_domain_sheds_its_cheapest_jobs_until_it_carries_no_more_than_the_cool_one() -> None:
    state, specs = fleet()
    offsets = thermal_offsets(state.topo, samples(state, hot=12.0))
    moves = plan_rebalance(state, offsets, movable(specs), POLICY, MigrationBudget(max_moves=4), 0.0, spread_c=8.0)
    # a and b (4 GPUs each) before c (8): after two moves d00 holds 8 busy GPUs, d01 8
    assert [m.job_id for m in moves] == ["a", "b"]
    assert all(set(m.domains(state.topo)) == {"d01"} for m in moves)
    assert "d00 runs 12.0 C hotter than d01" in moves[0].reason
    state.check()  # the state is left as it was
    assert set(state.allocs) == {"a", "b", "c"} and state.allocs["a"].nodes == (0,)


def test_within_the_spread_nothing_moves() -> None:
    state, specs = fleet()
    offsets = thermal_offsets(state.topo, samples(state, hot=6.0))
    assert plan_rebalance(state, offsets, movable(specs), POLICY, MigrationBudget(), 0.0, spread_c=8.0) == []


def test_budget_and_checkpointability_limit_the_moves() -> None:
    state, specs = fleet()
    offsets = thermal_offsets(state.topo, samples(state, hot=12.0))
    only_c = {"c": movable(specs)["c"]}  # a and b can't checkpoint
    moves = plan_rebalance(state, offsets, only_c, POLICY, MigrationBudget(max_moves=4), 0.0, spread_c=8.0)
    assert [m.job_id for m in moves] == ["c"]
    one = MigrationBudget(max_moves=2, in_flight=1)
    assert [m.job_id for m in plan_rebalance(state, offsets, movable(specs), POLICY, one, 0.0, spread_c=8.0)] == ["a"]
    # GPU-seconds: a move costs 4 GPUs x 60 s = 240; a budget of 300 left takes one
    tight = MigrationBudget(max_moves=4, gpu_s_per_hour=300.0)
    assert [m.job_id for m in plan_rebalance(state, offsets, movable(specs), POLICY, tight, 0.0, spread_c=8.0)] == ["a"]


def test_a_job_spanning_domains_is_never_moved() -> None:
    state = ClusterState(Topology.uniform(2, 6, 4))
    spec = JobSpec("x", 8, checkpointable=True)
    state.allocate(Allocation("x", (5, 6), (ALL, ALL), checkpointable=True))
    offsets = {0: 10.0, 1: -10.0}
    assert (
        plan_rebalance(state, offsets, {"x": Movable(spec, 1.0, 1.0)}, POLICY, MigrationBudget(), 0.0, spread_c=8.0)
        == []
    )
