"""`block`: Slurm topology/block, as its source (26.x) behaves. The strongest peer.

- Each NVLink domain is a base block. A job that fits one block goes in one block: among blocks with
  enough free usable nodes, the fewest free nodes wins (best fit), ties to the highest-index block;
  nodes inside the block are taken in index order.
- `--segment=S`: the N/S segments are placed one after another, each by the same best fit on what the
  previous segments left (greedy, no look-ahead) — the base class's `choose_layer`.
- A job larger than a block without segments uses an aligned group of 2^L consecutive base blocks
  (the smallest L that can hold it), best fit by fewest free nodes among such groups.
- Backfill with reservations is the cycle's (shared by every policy).
"""

from __future__ import annotations

from shared.core.policies.base import Context, Picker, Policy
from shared.core.shape import Request
from shared.core.state import ClusterState


class BlockPolicy(Policy):
    name = "block"

    def layers(self, state: ClusterState, req: Request) -> tuple[tuple[int, int], ...]:
        if req.slices:
            return req.slices
        dom = state.topo.domain
        if req.nodes <= state.topo.max_group_nodes(dom):
            return ((dom, req.nodes),)  # Slurm keeps any job that fits a block inside one block
        return ()

    def spill(self, pk: Picker, ctx: Context) -> bool:
        topo = pk.state.topo
        dom = topo.domain
        blocks = len(topo.group_nodes[dom])
        bsize = topo.max_group_nodes(dom)
        width = 1
        while width * bsize < pk.req.nodes:
            width *= 2
        best: tuple[int, int] | None = None
        for start in range(0, blocks, width):
            free = sum(pk.cap(dom, b) for b in range(start, min(start + width, blocks)))
            if free >= pk.req.nodes and (best is None or (free, -start) < (best[0], -best[1])):
                best = (free, start)
        if best is None:
            return False
        need = pk.req.nodes
        for b in range(best[1], min(best[1] + width, blocks)):
            take = min(need, pk.cap(dom, b))
            if take and not self.take_nodes(pk, dom, b, take, ctx):
                return False
            need -= take
            if not need:
                return True
        return False
