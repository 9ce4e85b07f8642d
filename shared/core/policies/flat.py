"""`flat`: topology-naive first fit. The baseline every gain is measured against.

Takes the first fitting nodes in index order, wherever they are; `required` and segments are
ignored (the simulator charges the cross-domain slowdown this causes).
"""

from __future__ import annotations

from shared.core.policies.base import Context, Picker, Policy
from shared.core.shape import Request
from shared.core.state import ClusterState


class FlatPolicy(Policy):
    name = "flat"
    honours_required = False

    def layers(self, state: ClusterState, req: Request) -> tuple[tuple[int, int], ...]:
        return ()

    def spill(self, pk: Picker, ctx: Context) -> bool:
        need = pk.req.nodes
        state = pk.state
        if pk.within is None and not pk.req.exclusive:
            # `pk.fits` as the scan needs it, in one pass: nothing is taken ahead of the scan, so a usable node
            # with k free GPUs fits (a forecast places large jobs this way at every step it tries)
            usable, nfree, k = state.usable, state.nfree, pk.k
            nodes = (n for n in range(len(state.topo)) if usable[n] and nfree[n] >= k)
        else:
            nodes = (n for n in range(len(state.topo)) if pk.fits(n))
        for node in nodes:
            pk.take(node, self.gpu_mask(pk, node))
            need -= 1
            if not need:
                return True
        return False
