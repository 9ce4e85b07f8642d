"""Growth: an elastic job running below its most grows into idle room at a checkpoint. Pure, like the
migration planner it extends (shrinking is the cycle's: `cycle._shrink`).

Per candidate (a running elastic job below its most; `Movable.spec` carries its range): the largest size up
to its most that the policy can place now with the job's own GPUs given back (it keeps what it can of them),
never in a domain a reservation holds. Its rest of the run takes `remaining x n / m` at m nodes instead of n
(data parallel). Gain: the GPU-seconds the added GPUs work, `(m - n) x GPUs per node x remaining x n / m`;
cost: its GPUs at the new size x (checkpoint + restore). A move needs gain > `min_gain_ratio` x cost and the
hour's moving budget.

Run it after a cycle, as consolidation: the room it takes is room no waiting job could use this cycle. One
move per call, the largest net gain first, ties by job id.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.core.migration import MigrationBudget, Movable, Move, expected_end, unreserved_domains
from shared.core.policies import Context, Placement, Policy
from shared.core.shape import ShapeError, request, with_size
from shared.core.state import ClusterState
from shared.core.statement import Statement


def plan_growth(
    state: ClusterState,
    movable: Mapping[str, Movable],
    policy: Policy,
    budget: MigrationBudget,
    now: float,
    promised: Mapping[str, frozenset[int]] | None = None,
) -> Move | None:
    """The one growth that pays most now, or None (see the module doc)."""
    if budget.moves_left < 1:
        return None
    topo = state.topo
    within = unreserved_domains(topo, promised)
    best: tuple[float, str, Placement, float, float] | None = None
    for job_id in sorted(movable):
        mv = movable[job_id]
        alloc = state.allocs.get(job_id)
        spec = mv.spec
        if spec.elastic is None or alloc is None or alloc.hold or alloc.gpus >= spec.elastic[1]:
            continue
        per_node = alloc.gpus // len(alloc.nodes)
        unit = spec.segment or 1
        n = len(alloc.nodes)
        remaining = expected_end(alloc, now) - now
        stmt = Statement(state)
        cp = stmt.checkpoint()
        stmt.release(job_id)
        try:
            for m in range(spec.elastic[1] // per_node, n, -unit):
                after = remaining * n / m
                gain = (m - n) * per_node * after
                cost = mv.cost_gpu_s(m * per_node)
                if gain <= budget.min_gain_ratio * cost or cost > budget.gpu_s_left:
                    continue
                if best is not None and gain - cost <= best[0]:
                    break  # smaller sizes gain less
                try:
                    req = request(with_size(spec, m * per_node), topo)
                except ShapeError:
                    continue
                ctx = Context(now=now, job_end=now + after, demand=frozenset({unit}), within=within)
                placement = policy.place(state, req, ctx)
                if placement is not None:
                    best = (gain - cost, job_id, placement, cost, now + after)
                    break
        finally:
            stmt.rollback(cp)
    if best is None:
        return None
    _, job_id, placement, cost, end = best
    alloc = state.allocs[job_id]
    reason = f"grown from {len(alloc.nodes)} to {len(placement.nodes)} nodes into idle room"
    return Move(job_id, alloc, placement, reason, cost, expected_end=end)
