"""What every placement policy shares: the result types, the per-attempt picker and the layer walk.

A policy answers one question: where would this request go in this state right now? It never
changes the state; the cycle applies the answer through a Statement. Policies differ only in how
they choose groups (`choose_layer`), how they spill jobs that may span groups (`spill`) and the
order they take nodes inside a group (`node_order`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared.core.shape import Request
from shared.core.state import Allocation, ClusterState


@dataclass(frozen=True, slots=True)
class Placement:
    nodes: tuple[int, ...]
    masks: tuple[int, ...]

    def allocation(self, req: Request, now: float, expected_end: float) -> Allocation:
        job = req.job
        elastic = None
        if job.elastic is not None:
            elastic = (job.elastic[0] // req.per_node, req.unit)
        return Allocation(
            job.id,
            self.nodes,
            self.masks,
            priority=job.priority,
            tenant=job.tenant,
            checkpointable=job.checkpointable,
            start=now,
            expected_end=expected_end,
            elastic=elastic,
        )


@dataclass(frozen=True, slots=True)
class FitError:
    """Why a request doesn't fit now, in a user's words (see `reasons.explain`)."""

    message: str


@dataclass(slots=True)
class Context:
    """What a cycle knows beyond the state: the time, the job's expected end and the waiting demand."""

    now: float = 0.0
    job_end: float = float("inf")
    # run sizes (nodes per group at the domain level) that waiting jobs need, for fragmentation scoring
    demand: frozenset[int] = field(default_factory=frozenset)
    # only these NVLink domains may be used (a kept reservation's forecast); None: any
    within: frozenset[int] | None = None


class Picker:
    """Nodes taken by one placement attempt, with group capacities net of them."""

    __slots__ = ("dom_level", "k", "masks", "nodes", "req", "state", "taken", "taken_set", "within")

    def __init__(self, state: ClusterState, req: Request, within: frozenset[int] | None = None) -> None:
        self.state = state
        self.req = req
        self.k = req.k
        self.nodes: list[int] = []
        self.masks: list[int] = []
        self.taken_set: set[int] = set()
        self.taken: list[dict[int, int]] = [{} for _ in state.topo.levels]
        self.within = within
        self.dom_level = state.topo.domain

    def cap(self, level: int, group: int) -> int:
        """Usable nodes of the group that could still take one of the job's per-node shares."""
        if self.within is not None and level >= self.dom_level and not self._allowed(level, group):
            return 0
        return self.state.count[level][group][self.k] - self.taken[level].get(group, 0)

    def _allowed(self, level: int, group: int) -> bool:
        """Whether a group at or inside the domain level lies in one of the `within` domains."""
        topo = self.state.topo
        assert self.within is not None
        return topo.node_group[self.dom_level][topo.group_nodes[level][group][0]] in self.within

    def hostable(self, level: int, group: int, layers: Sequence[tuple[int, int]], i: int) -> int:
        """How many pieces of layer i (each `size` nodes, split by the inner layers) fit in the group."""
        size = layers[i][1]
        if i + 1 == len(layers):
            return self.cap(level, group) // size
        inner_level, inner_size = layers[i + 1]
        inner_units = sum(
            self.hostable(inner_level, h, layers, i + 1) for h in self.state.topo.descendants(level, group, inner_level)
        )
        return inner_units // (size // inner_size)

    def take(self, node: int, mask: int) -> None:
        self.nodes.append(node)
        self.masks.append(mask)
        self.taken_set.add(node)
        for t, groups in zip(self.taken, self.state.topo.node_group, strict=True):
            g = groups[node]
            t[g] = t.get(g, 0) + 1

    def fits(self, node: int) -> bool:
        if self.within is not None and self.state.topo.node_group[self.dom_level][node] not in self.within:
            return False
        return node not in self.taken_set and self.state.node_fits(node, self.k, self.req.exclusive)

    def result(self) -> Placement:
        return Placement(tuple(self.nodes), tuple(self.masks))


class Policy:
    """Base policy: block-style layers with a pluggable group choice. Subclasses override the hooks."""

    name = "base"
    honours_required = True  # False for baselines that treat `required` as best effort
    prefer_healthy_gpus = False
    # keep a reservation's domains from cycle to cycle unless another layout forecasts a much earlier
    # start (see cycle.py); Slurm's backfill re-plans every reservation from scratch each cycle
    sticky_reservations = False
    # checkpointable jobs may borrow a reservation's held nodes (CycleConfig.lend_checkpointable None: this)
    lends_reserved = False
    # keep jobs a migration planner can't move (no checkpoint, or spanning domains) together, so other
    # domains stay emptiable by moves; set by the scheduler (CycleConfig.pin_aware), used by rackscale only
    pin_aware = False
    # a bound to measure against (`ceiling`): the simulator charges it no cross-domain slowdown
    yardstick = False
    # a flexible job may start with a smaller segment it accepts (cycle.py weighs it against the wait for
    # its preferred one); off, it always waits for its first-listed segment, as Slurm's --segment would
    flexible_segments = False
    # elastic jobs are shrunk (instead of preempted) for a higher-priority or reserved job, and grown into
    # idle room (`elastic.plan_growth`); off, an elastic job keeps the size it started with, as Slurm's
    # --nodes=MIN-MAX does (every policy starts one at the largest size that fits)
    resizes = False

    # -- entry point -----------------------------------------------------------------------------------
    def place(self, state: ClusterState, req: Request, ctx: Context) -> Placement | None:
        """Where the request fits now, or None. Never changes the state."""
        if state.count[0][0][req.k] < req.nodes:
            return None  # not enough fitting nodes in the whole cluster: no layout can work
        pk = Picker(state, req, ctx.within)
        layers = self.layers(state, req)
        if layers:
            top = layers[0][0]
            scope = range(len(state.topo.group_nodes[top]))
            ok = self.place_layer(pk, layers, 0, scope, req.nodes // layers[0][1], ctx)
        else:
            ok = self.spill(pk, ctx)
        return pk.result() if ok else None

    def layers(self, state: ClusterState, req: Request) -> tuple[tuple[int, int], ...]:
        """The hard slice layout this policy enforces (the request's own unless a baseline relaxes it)."""
        return req.slices

    def place_layer(
        self,
        pk: Picker,
        layers: Sequence[tuple[int, int]],
        i: int,
        scope: Iterable[int],
        count: int,
        ctx: Context,
    ) -> bool:
        """Place `count` pieces of layer i inside the scope groups, then recurse into inner layers."""
        level, size = layers[i]
        chosen = self.choose_layer(pk, layers, i, tuple(scope), count, ctx)
        if chosen is None:
            return False
        for group, pieces in chosen:
            if i + 1 < len(layers):
                inner_level, inner_size = layers[i + 1]
                inner_scope = pk.state.topo.descendants(level, group, inner_level)
                for _ in range(pieces):
                    if not self.place_layer(pk, layers, i + 1, inner_scope, size // inner_size, ctx):
                        return False
            elif not self.take_nodes(pk, level, group, size * pieces, ctx):
                return False
        return True

    def choose_layer(
        self,
        pk: Picker,
        layers: Sequence[tuple[int, int]],
        i: int,
        scope: Sequence[int],
        count: int,
        ctx: Context,
    ) -> list[tuple[int, int]] | None:
        """Groups for `count` pieces of layer i, as (group, pieces); None when they don't fit.

        Default: Slurm's greedy best fit, one piece at a time on what the previous pieces left.
        Pieces of the innermost layer are taken here at once, so they come back with 0 pieces left.
        """
        level = layers[i][0]
        if i + 1 == len(layers) and type(self).piece_key is Policy.piece_key:
            return self._best_fit_pieces(pk, level, layers[i][1], scope, count, ctx)
        chosen: list[tuple[int, int]] = []
        used: dict[int, int] = {}
        for _ in range(count):
            best = None
            best_key: tuple[int, ...] | None = None
            for g in scope:
                room = pk.hostable(level, g, layers, i) - used.get(g, 0)
                if room < 1:
                    continue
                key = self.piece_key(pk, level, g, layers, i)
                if best_key is None or key < best_key:
                    best, best_key = g, key
            if best is None:
                return None
            used[best] = used.get(best, 0) + 1
            chosen.append((best, 1))
            if i + 1 == len(layers):
                # take now so the next piece sees what this one left (Slurm: one segment at a time)
                if not self.take_nodes(pk, level, best, layers[i][1], ctx):
                    return None
                chosen[-1] = (best, 0)
                used[best] -= 1
        return chosen

    def _best_fit_pieces(
        self, pk: Picker, level: int, size: int, scope: Sequence[int], count: int, ctx: Context
    ) -> list[tuple[int, int]] | None:
        """`choose_layer` for the innermost layer with the default `piece_key`, the same choices: a group
        hosts a piece when its capacity is `size` or more, and taking one changes only that group's capacity,
        so the capacities are read once (a forecast places a large job's segments at every step it tries)."""
        caps = {g: pk.cap(level, g) for g in scope}
        chosen: list[tuple[int, int]] = []
        for _ in range(count):
            fits = [(c, -g) for g, c in caps.items() if c >= size]
            if not fits:
                return None
            best = -min(fits)[1]
            if not self.take_nodes(pk, level, best, size, ctx):
                return None
            chosen.append((best, 0))
            caps[best] = pk.cap(level, best)
        return chosen

    def piece_key(
        self, pk: Picker, level: int, group: int, layers: Sequence[tuple[int, int]], i: int
    ) -> tuple[int, ...]:
        """Slurm block best fit: fewest free nodes, ties to the highest-index group."""
        return (pk.cap(level, group), -group)

    def spill(self, pk: Picker, ctx: Context) -> bool:
        """Place a job that may span groups (`preferred` / `none` without slices)."""
        raise NotImplementedError

    # -- node and GPU choice -----------------------------------------------------------------------------
    def node_order(self, pk: Picker, nodes: Sequence[int]) -> Iterable[int]:
        return nodes

    def take_nodes(self, pk: Picker, level: int, group: int, count: int, ctx: Context) -> bool:
        if count == 0:
            return True
        got = 0
        for node in self.node_order(pk, pk.state.topo.group_nodes[level][group]):
            if pk.fits(node):
                pk.take(node, self.gpu_mask(pk, node))
                got += 1
                if got == count:
                    return True
        return False

    def gpu_mask(self, pk: Picker, node: int) -> int:
        state, req = pk.state, pk.req
        free = state.free[node]
        if req.exclusive:
            return free
        want = req.per_node
        order = free & ~state.degraded[node] if self.prefer_healthy_gpus else free
        mask = 0
        for source in (order, free):
            bits = source & ~mask
            while bits and want:
                low = bits & -bits
                mask |= low
                bits ^= low
                want -= 1
        return mask


def fewest_groups(pk: Picker, level: int, key_extra: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Fewest groups of `level` covering the job: largest first, the last one by best fit.

    Returns (group, nodes) pairs, or [] when the free total is short. Shared by `tree` (Slurm's
    topology/tree spreads over the fewest switches) and `rackscale`'s spill of preferred jobs.
    """
    need = pk.req.nodes
    groups = pk.state.topo.group_nodes[level]
    caps = [(pk.cap(level, g), g) for g in range(len(groups))]
    caps = [c for c in caps if c[0] > 0]
    if sum(c for c, _ in caps) < need:
        return []
    caps.sort(key=lambda cg: (-cg[0], cg[1]))
    out: list[tuple[int, int]] = []
    i = 0
    while need:
        # best fit for the remainder: the smallest group that finishes the job, else the largest
        finishing = [cg for cg in caps[i:] if cg[0] >= need]
        if finishing:
            cap, g = min(finishing, key=lambda cg: (cg[0], cg[1]))
            out.append((g, need))
            return out
        cap, g = caps[i]
        out.append((g, cap))
        need -= cap
        i += 1
    return out
