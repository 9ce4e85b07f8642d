"""Consolidation: a flexible job that started on a smaller segment than its preferred one (the cycle took
it because waiting for the preferred layout would have ended later) is moved onto its preferred layout when
room for it appears and the move pays. Pure, like the migration planner it extends.

Per candidate (a running checkpointable job with `Movable.preferred`): its preferred units that now cross
domains cost it `SlowdownModel.factor(0, x_outer)` (the communication model the simulator charges); moved
onto whole preferred segments it runs that much faster for the rest of its expected run. Gain: its GPUs x
the remaining expected time x (1 - 1 / factor); cost: its GPUs x (checkpoint + restore). A move needs gain >
`min_gain_ratio` x cost and the hour's moving budget. The new layout is placed by the policy on the state
with the job's own GPUs given back (it may reuse some of them), never in a domain a reservation holds.

Run it after a cycle, not before: then every free run a waiting job could use has been used already, and
the move only reshapes free room nobody wanted (it holds as many GPUs after as before). One move per call,
the largest net gain first, ties by job id.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.core.comm import SlowdownModel
from shared.core.migration import MigrationBudget, Movable, Move, expected_end, unreserved_domains
from shared.core.policies import Context, Placement, Policy
from shared.core.shape import ShapeError, request, with_segment
from shared.core.state import ClusterState
from shared.core.statement import Statement


def plan_consolidation(
    state: ClusterState,
    movable: Mapping[str, Movable],
    policy: Policy,
    budget: MigrationBudget,
    now: float,
    model: SlowdownModel,
    promised: Mapping[str, frozenset[int]] | None = None,
) -> Move | None:
    """The one consolidation move that pays most now, or None (see the module doc)."""
    if budget.moves_left < 1:
        return None
    topo = state.topo
    dom = topo.node_group[topo.domain]
    within = unreserved_domains(topo, promised)
    best: tuple[float, str, Placement, int, float] | None = None
    for job_id in sorted(movable):
        mv = movable[job_id]
        alloc = state.allocs.get(job_id)
        if mv.preferred is None or alloc is None or alloc.hold:
            continue
        factor = model.factor(0.0, model.cross_share([dom[n] for n in alloc.nodes], mv.preferred))
        if factor <= 1.0:
            continue  # its preferred units are whole already (its segments landed together)
        remaining = expected_end(alloc, now) - now
        gain = alloc.gpus * remaining * (1.0 - 1.0 / factor)
        cost = mv.cost_gpu_s(alloc.gpus)
        if gain <= budget.min_gain_ratio * cost or cost > budget.gpu_s_left:
            continue
        if best is not None and gain - cost <= best[0]:
            continue
        try:
            req = request(with_segment(mv.spec, mv.preferred), topo)
        except ShapeError:
            continue
        stmt = Statement(state)
        cp = stmt.checkpoint()
        stmt.release(job_id)
        ctx = Context(now=now, job_end=now + remaining / factor, demand=frozenset({mv.preferred}), within=within)
        placement = policy.place(state, req, ctx)
        stmt.rollback(cp)
        if placement is not None:
            best = (gain - cost, job_id, placement, mv.preferred, cost)
    if best is None:
        return None
    _, job_id, placement, preferred, cost = best
    seg = movable[job_id].spec.segment
    reason = f"consolidated onto its preferred segments of {preferred} nodes (ran on segments of {seg})"
    return Move(job_id, state.allocs[job_id], placement, reason, cost, segment=preferred)
