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


@dataclass(frozen=True, slots=True)
class HeatSums:
    """What the fit needs of a set of (utilisation, temperature) samples: count and sums. Sums add, so a node's
    samples are summed once as they come and a domain's are the sum of its nodes'."""

    n: int = 0
    u: float = 0.0
    t: float = 0.0
    uu: float = 0.0
    ut: float = 0.0

    @staticmethod
    def of(samples: Iterable[tuple[float, float]]) -> HeatSums:
        n, u, t, uu, ut = 0, 0.0, 0.0, 0.0, 0.0
        for util, temp in samples:
            n, u, t, uu, ut = n + 1, u + util, t + temp, uu + util * util, ut + util * temp
        return HeatSums(n, u, t, uu, ut)

    def __add__(self, o: HeatSums) -> HeatSums:
        return HeatSums(self.n + o.n, self.u + o.u, self.t + o.t, self.uu + o.uu, self.ut + o.ut)

    def spread(self) -> tuple[float, float]:
        """(sum of (u - mean u)^2, sum of (u - mean u)(t - mean t)); (0, 0) without samples."""
        if not self.n:
            return 0.0, 0.0
        mu, mt = self.u / self.n, self.t / self.n
        return self.uu - self.n * mu * mu, self.ut - self.n * mu * mt


def thermal_offsets(topo: Topology, samples: Iterable[GpuHeat]) -> dict[int, float]:
    """Domain index -> how much hotter its GPUs run than the fleet's at the same utilisation (mean 0).

    temp = offset[domain] + slope x util, the slope fitted on the variation *inside* domains (busy and idle
    GPUs side by side), so a domain that is both busier and hotter keeps its heat in its offset. Without such
    variation (every domain all busy or all idle) the slope comes from the pooled samples."""
    by_dom: dict[int, list[tuple[float, float]]] = {}
    for r in samples:
        by_dom.setdefault(topo.node_group[topo.domain][r.node], []).append((r.util, r.temp_c))
    return offsets_from_sums({d: HeatSums.of(rs) for d, rs in by_dom.items()})


def offsets_from_sums(by_domain: Mapping[int, HeatSums]) -> dict[int, float]:
    """`thermal_offsets` from each domain's sums (the migration service keeps its nodes' as telemetry comes)."""
    sums = {d: h for d, h in by_domain.items() if h.n}
    if not sums:
        return {}
    within = [h.spread() for h in sums.values()]
    sxx, sxy = sum(x for x, _ in within), sum(y for _, y in within)
    if sxx > 1e-6:
        slope = sxy / sxx
    else:
        var, cov = sum(sums.values(), HeatSums()).spread()
        slope = cov / var if var > 1e-9 else 0.0
    raw = {d: h.t / h.n - slope * h.u / h.n for d, h in sums.items()}
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
