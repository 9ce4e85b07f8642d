"""`tree`: Slurm topology/tree. One domain by best fit when the job fits one, else the fewest domains.

Best effort: `required` is treated as a preference and segments are ignored, as Slurm's tree plugin
has no hard boundary (short of `--switches` with a wait limit).
"""

from __future__ import annotations

from shared.core.policies.base import Context, Picker, Policy, fewest_groups
from shared.core.shape import Request
from shared.core.state import ClusterState


class TreePolicy(Policy):
    name = "tree"
    honours_required = False

    def layers(self, state: ClusterState, req: Request) -> tuple[tuple[int, int], ...]:
        return ()

    def spill(self, pk: Picker, ctx: Context) -> bool:
        level, need = pk.req.level, pk.req.nodes
        single = [(pk.cap(level, g), g) for g in range(len(pk.state.topo.group_nodes[level]))]
        fitting = [cg for cg in single if cg[0] >= need]
        if fitting:
            _, g = min(fitting)  # best fit: fewest free nodes, ties to the lowest index
            return self.take_nodes(pk, level, g, need, ctx)
        plan = fewest_groups(pk, level)
        return bool(plan) and all(self.take_nodes(pk, level, g, n, ctx) for g, n in plan)
