"""Rebalancing: move load off an NVLink domain that runs hotter than the others at the same load. Pure.

Domains differ in temperature for two reasons: how busy they are (packing makes that uneven on purpose)
and how well they are cooled (a failing fan wall, a hot aisle). Only the second is worth a move, so heat
is compared at equal load: `temp = offset[domain] + b x util`, with the slope b fitted on busy and idle
GPUs side by side inside each domain, and a domain's *thermal offset* is how much hotter it runs than the
fleet's average at the same load — about +12 against its peers for a domain running 12 C hot.

`plan_rebalance` moves running checkpointable single-domain jobs out of the domain with the highest offset
into domains at least `spread_c` cooler, cheapest first (GPUs x checkpoint + restore time), until the hot
domain holds no more busy GPUs than the cool ones do on average, within the budget. Each job is re-placed
by the policy with only the cool domains usable, so its topology guarantees hold. Ties by index or id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from shared.core.migration import MigrationBudget, Movable, Move
from shared.core.policies import Context, Policy
from shared.core.shape import ShapeError, request
from shared.core.state import ClusterState
from shared.core.statement import Statement
from shared.core.topology import Topology


@dataclass(frozen=True, slots=True)
class GpuHeat:
    """One GPU's latest telemetry: the node's index in the topology, its utilisation (0..1) and temperature."""

    node: int
    util: float
    temp_c: float


def thermal_offsets(topo: Topology, samples: Iterable[GpuHeat]) -> dict[int, float]:
    """Domain index -> how much hotter its GPUs run than the fleet's at the same utilisation (mean 0).

    temp = offset[domain] + slope x util, the slope fitted on the variation *inside* domains (busy and idle
    GPUs side by side), so a domain that is both busier and hotter keeps its heat in its offset. Without such
    variation (every domain all busy or all idle) the slope comes from the pooled samples."""
    by_dom: dict[int, list[GpuHeat]] = {}
    for r in samples:
        by_dom.setdefault(topo.node_group[topo.domain][r.node], []).append(r)
    if not by_dom:
        return {}
    means = {d: (sum(r.util for r in rs) / len(rs), sum(r.temp_c for r in rs) / len(rs)) for d, rs in by_dom.items()}
    sxx = sum((r.util - means[d][0]) ** 2 for d, rs in by_dom.items() for r in rs)
    sxy = sum((r.util - means[d][0]) * (r.temp_c - means[d][1]) for d, rs in by_dom.items() for r in rs)
    if sxx > 1e-6:
        slope = sxy / sxx
    else:
        rows = [r for rs in by_dom.values() for r in rs]
        mu, mt = sum(r.util for r in rows) / len(rows), sum(r.temp_c for r in rows) / len(rows)
        var = sum((r.util - mu) ** 2 for r in rows)
        slope = sum((r.util - mu) * (r.temp_c - mt) for r in rows) / var if var > 1e-9 else 0.0
    raw = {d: mt - slope * mu for d, (mu, mt) in means.items()}
    center = sum(raw.values()) / len(raw)
    return {d: raw[d] - center for d in sorted(raw)}


def _busy(state: ClusterState, domain: int) -> int:
    """GPUs held in the domain (by jobs; usable or not)."""
    topo = state.topo
    return sum(state.full[n].bit_count() - state.nfree[n] for n in topo.group_nodes[topo.domain][domain])


def plan_rebalance(
    state: ClusterState,
    offsets: Mapping[int, float],
    movable: Mapping[str, Movable],
    policy: Policy,
    budget: MigrationBudget,
    now: float,
    *,
    spread_c: float,
) -> list[Move]:
    """Moves off the hottest domain (by thermal offset) into domains `spread_c` or more cooler; [] when the
    domains are within `spread_c` of each other. The state is left as it was."""
    if len(offsets) < 2 or budget.moves_left < 1:
        return []
    hot = max(offsets, key=lambda d: (offsets[d], -d))
    cool = sorted(d for d, o in offsets.items() if offsets[hot] - o >= spread_c)
    if not cool:
        return []
    topo = state.topo
    dom = topo.domain
    names = topo.group_names[dom]
    gap = offsets[hot] - max(offsets[d] for d in cool)
    hot_nodes = set(topo.group_nodes[dom][hot])
    candidates = [
        (mv.cost_gpu_s(state.allocs[jid].gpus), jid)
        for jid, mv in movable.items()
        if jid in state.allocs and mv.spec.checkpointable and set(state.allocs[jid].nodes) <= hot_nodes
    ]
    stmt = Statement(state)
    moves: list[Move] = []
    spent = 0.0
    try:
        for d in range(len(topo.group_nodes[dom])):  # only the cool domains may take the moved jobs
            if d not in cool:
                for node in topo.group_nodes[dom][d]:
                    stmt.set_usable(node, False)
        why = (
            f"rebalance: domain {names[hot]} runs {gap:.1f} C hotter than {', '.join(names[d] for d in cool)} "
            "at the same load"
        )
        for cost, jid in sorted(candidates):
            if len(moves) >= budget.moves_left:
                break
            if _busy(state, hot) <= sum(_busy(state, d) for d in cool) / len(cool):
                break  # the hot domain carries no more than its cool peers now
            if spent + cost > budget.gpu_s_left:
                continue
            alloc = state.allocs[jid]
            try:
                req = request(movable[jid].spec, topo)
            except ShapeError:
                continue
            cp = stmt.checkpoint()
            stmt.release(jid)
            placed = policy.place(state, req, Context(now=now, job_end=alloc.expected_end))
            if placed is None:
                stmt.rollback(cp)
                continue
            stmt.allocate(replace(alloc, nodes=placed.nodes, masks=placed.masks, gpus=0))
            moves.append(Move(jid, alloc, placed, why, cost))
            spent += cost
    finally:
        stmt.discard()
    return moves
