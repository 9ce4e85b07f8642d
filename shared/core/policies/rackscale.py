"""`rackscale`: block guarantees plus what Slurm's block plugin lacks. The scoring, in order:

1. **Slot loss** (spare awareness): a domain's free nodes are worth ``free // P`` protected runs, with
   ``P`` the larger of the operators' planning unit (domain nodes minus ``SPARES``, i.e. 16 of 18) and
   the largest run a waiting job needs. A choice that breaks fewer such runs wins, so small jobs stay
   off domains that can still host a 16-node job, and a domain with a tray or two down keeps hosting one.
2. **Stranded nodes** (fragmentation awareness): of what a domain has left, the nodes no waiting job's
   run size can use (an unbounded knapsack over the waiting run sizes). Fewer wins.
3. **Best fit**: fewest free nodes left in the domain.
4. Tie-breaks: fewer nodes with a degraded GPU used; lowest index. Not the running jobs' end times: the
   scheduler only has users' estimates (often off by 2x), and ranking domains by them scatters the
   long tail of small jobs over many domains instead of packing it into a few, so fewer domains drain
   whole (measured on the Kalos + Philly mix, docs/evaluation.md).

Segmented jobs are laid out together: several complete layouts (the per-piece greedy one Slurm uses,
fewest domains first, exact fits first, healthy domains first) are scored by the sums of slot loss,
stranded nodes, degraded nodes used, domains used and nodes left, and the cheapest wins.
`preferred` jobs that fit no single domain spill over the fewest domains; `none` jobs fill stranded
fragments before touching whole domains. Degraded GPUs are taken last inside a node and a domain.

With a migration planner beside it (`pin_aware`, set by the scheduler from `CycleConfig.pin_aware`), a job
the planner can't move (no checkpoint, or ranks in several domains) goes where domains are pinned already,
so the others stay emptiable (measured on the Kalos + Philly mix, docs/evaluation.md).

Reservations stick (`sticky_reservations`, applied by the cycle): a job reserved again keeps last cycle's
domains unless another layout is forecast to start much sooner, so the domains it waits for keep draining
instead of the reservation wandering after every new estimate (a two-segment job then waits for two
domains to drain once, not again and again; measured on Philly, docs/evaluation.md).

Reserved nodes are lent (`lends_reserved`, applied by the cycle): a checkpointable job of 4 nodes or more
(`CycleConfig.lend_min_nodes`) may start in a reservation's held nodes whatever its expected end; it stays on
loan until it ends, and a reserved job that would fit without it takes the nodes back (checkpointed, the work
kept). Held nodes do work while the domains drain: on the Kalos mix the LLM gangs run in them (measured on
both traces, docs/evaluation.md, finding 6).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from functools import lru_cache

from shared.core.policies.base import Context, Picker, Policy, fewest_groups
from shared.core.shape import Need
from shared.core.state import ClusterState

SPARES = 2  # trays per domain an operator plans to lose (16 of 18 on NVL72)


@lru_cache(maxsize=256)
def frag_tables(demand: frozenset[int], group_size: int) -> tuple[int, tuple[int, ...]]:
    """(P, stranded[r] for r in 0..group_size) for a demand of run sizes. Pure, so cached."""
    sizes = sorted(s for s in demand if 0 < s <= group_size)
    protect = max([group_size - SPARES, *sizes]) if group_size > SPARES else group_size
    packable = [0] * (group_size + 1)
    for r in range(1, group_size + 1):
        packable[r] = max([packable[r - 1]] + [packable[r - s] + s for s in sizes if s <= r])
    stranded = tuple(r - packable[r] if sizes else 0 for r in range(group_size + 1))
    return max(protect, 1), stranded


def pinned_node(state: ClusterState, node: int) -> bool:
    """Whether a job the migration planner can't move holds GPUs on the node: one that can't checkpoint,
    or one with ranks in another NVLink domain (reservation holds don't count; `ClusterState.pins`)."""
    return state.pins[node] > 0


class RackscalePolicy(Policy):
    name = "rackscale"
    prefer_healthy_gpus = True
    sticky_reservations = True
    lends_reserved = True
    flexible_segments = True
    resizes = True

    # -- scoring ---------------------------------------------------------------------------------------
    def _tables(self, pk: Picker, level: int, ctx: Context) -> tuple[int, tuple[int, ...]] | None:
        topo = pk.state.topo
        if level != topo.domain:
            return None  # fragmentation scoring is about NVLink domains; other levels use best fit
        return frag_tables(ctx.demand, topo.max_group_nodes(level))

    @staticmethod
    def _cost(tables: tuple[int, tuple[int, ...]] | None, cap: int, left: int) -> tuple[int, int, int]:
        if tables is None:
            return (0, 0, left)
        protect, stranded = tables
        return (cap // protect - left // protect, stranded[left], left)

    @staticmethod
    def _degraded_need(pk: Picker, level: int, group: int, size: int) -> int:
        """How many of `size` nodes taken from the group would have to carry a degraded GPU."""
        state = pk.state
        if not state.degraded_in[level].get(group):
            return 0
        k, healthy = pk.k, 0
        for n in state.topo.group_nodes[level][group]:
            if pk.fits(n) and (state.free[n] & ~state.degraded[n]).bit_count() >= k:
                healthy += 1
        return max(0, size - healthy)

    # -- pins: domains the migration planner could still empty to a 16-node run --------------------------
    def _pin_tier(self, pk: Picker, level: int, group: int, take: int) -> int:
        """What placing `take` nodes of a job that can't move does to the group (a domain): 0 when the
        domain already holds so many pinned nodes that it can't be emptied to a planning unit (``nodes -
        SPARES``) anyway, 1 when it still could be after this job, 2 when this job is what pins it."""
        state = pk.state
        # usable nodes (those with >= 0 free GPUs) and the pinned ones among them, both kept by the state
        usable, pinned = state.count[level][group][0], state.pinned_in[group]
        keep = state.topo.max_group_nodes(level) - SPARES
        if usable - pinned < keep:
            return 0
        return 1 if usable - pinned - take >= keep else 2

    def _pins(self, pk: Picker, level: int) -> bool:
        """Whether a single-domain placement of this request is one the planner can't move."""
        return self.pin_aware and level == pk.state.topo.domain and not pk.req.job.checkpointable

    def _refine(self, pk: Picker, level: int, tier: list[int], size: int) -> int:
        """Tie-break equal-cost groups: fewer degraded nodes needed, then lowest index."""
        if len(tier) == 1:
            return tier[0]
        return min(tier, key=lambda g: (self._degraded_need(pk, level, g, size), g))

    def piece_key(
        self, pk: Picker, level: int, group: int, layers: Sequence[tuple[int, int]], i: int
    ) -> tuple[int, ...]:
        """Outer layers of multi-layer slices: best fit, ties to the lowest index (as for domains)."""
        return (pk.cap(level, group), group)

    def _choose_single(self, pk: Picker, level: int, scope: Iterable[int], size: int, ctx: Context) -> int | None:
        tables = self._tables(pk, level, ctx)
        pins = self._pins(pk, level)
        take = size if pk.k == pk.state.topo.max_node_gpus else 1
        best: tuple[int, ...] | None = None
        tier: list[int] = []
        for g in scope:
            cap = pk.cap(level, g)
            if cap < size:
                continue
            cost: tuple[int, ...] = self._cost(tables, cap, cap - size)
            if pins:
                cost = (cost[0], self._pin_tier(pk, level, g, take), *cost[1:])
            if best is None or cost < best:
                best, tier = cost, [g]
            elif cost == best:
                tier.append(g)
        return self._refine(pk, level, tier, size) if tier else None

    # -- layers ----------------------------------------------------------------------------------------
    def choose_layer(
        self,
        pk: Picker,
        layers: Sequence[tuple[int, int]],
        i: int,
        scope: Sequence[int],
        count: int,
        ctx: Context,
    ) -> list[tuple[int, int]] | None:
        if i + 1 < len(layers):
            return super().choose_layer(pk, layers, i, scope, count, ctx)
        level, size = layers[i]
        if count == 1:
            g = self._choose_single(pk, level, scope, size, ctx)
            return None if g is None else [(g, 1)]
        return self._joint_layout(pk, level, scope, size, count, ctx)

    def _joint_layout(
        self, pk: Picker, level: int, scope: Sequence[int], size: int, count: int, ctx: Context
    ) -> list[tuple[int, int]] | None:
        """Score whole layouts of `count` pieces instead of committing one piece at a time."""
        tables = self._tables(pk, level, ctx)
        caps = {g: c for g in scope if (c := pk.cap(level, g)) >= size}
        if sum(c // size for c in caps.values()) < count:
            return None

        def greedy() -> dict[int, int]:
            # one piece at a time, like Slurm, by our score; the score depends only on a group's free
            # count, so groups are bucketed by it and each step compares buckets, not groups
            buckets: dict[int, list[int]] = {}
            for g in sorted(caps):
                buckets.setdefault(caps[g], []).append(g)
            plan: dict[int, int] = {}
            for _ in range(count):
                c = min(
                    (c for c, gs in buckets.items() if c >= size and gs),
                    key=lambda c: (self._cost(tables, c, c - size), buckets[c][0]),
                )
                g = buckets[c].pop(0)
                bisect.insort(buckets.setdefault(c - size, []), g)
                plan[g] = plan.get(g, 0) + 1
            return plan

        def ordered(key_of: object) -> dict[int, int]:
            plan: dict[int, int] = {}
            remaining = count
            for g in sorted(caps, key=key_of):  # type: ignore[arg-type]
                m = min(caps[g] // size, remaining)
                if m:
                    plan[g] = m
                    remaining -= m
                if not remaining:
                    break
            return plan

        def exact_key(g: int) -> tuple[object, ...]:
            m = min(caps[g] // size, count)
            return (*self._cost(tables, caps[g], caps[g] - m * size)[:2], -m, caps[g] - m * size, g)

        def healthy_key(g: int) -> tuple[object, ...]:
            return (self._degraded_need(pk, level, g, min(caps[g] // size, count) * size) > 0, *exact_key(g))

        plans = [greedy(), ordered(lambda g: (-(caps[g] // size), caps[g], g)), ordered(exact_key)]
        if pk.state.degraded_in[level]:
            plans.append(ordered(healthy_key))
        # pins: a layout over several domains (or of a job that can't checkpoint) can't be moved by the
        # planner; prefer the layouts that pin the fewest domains it could still empty
        pin_aware = self.pin_aware and level == pk.state.topo.domain
        tiers: dict[tuple[int, int], int] = {}

        def tier(g: int, m: int) -> int:
            if (g, m) not in tiers:
                tiers[g, m] = self._pin_tier(pk, level, g, m * size)
            return tiers[g, m]

        if pin_aware:
            plans.append(ordered(lambda g: (tier(g, min(caps[g] // size, count)) == 2, *exact_key(g))))

        def plan_cost(plan: dict[int, int]) -> tuple[int, ...]:
            loss = stranded = degraded = left_total = pinned = 0
            pins = pin_aware and (len(plan) > 1 or not pk.req.job.checkpointable)
            for g, m in plan.items():
                a, b, c = self._cost(tables, caps[g], caps[g] - m * size)
                loss, stranded, left_total = loss + a, stranded + b, left_total + c
                degraded += self._degraded_need(pk, level, g, m * size)
                if pins:
                    pinned += tier(g, m) == 2
            return (loss, pinned, stranded, degraded, len(plan), left_total)

        best = min(plans, key=plan_cost)
        return sorted(best.items())

    # -- jobs that may span groups ---------------------------------------------------------------------
    def spill(self, pk: Picker, ctx: Context) -> bool:
        req = pk.req
        level, need = req.level, req.nodes
        scope = range(len(pk.state.topo.group_nodes[level]))
        single = self._choose_single(pk, level, scope, need, ctx)
        if req.need is Need.PREFERRED:
            if single is not None:
                return self.take_nodes(pk, level, single, need, ctx)
            plan = fewest_groups(pk, level)
            return bool(plan) and all(self.take_nodes(pk, level, g, n, ctx) for g, n in plan)
        # `none`: stranded fragments first, unless one group takes the job without breaking a run
        tables = self._tables(pk, level, ctx)
        if single is not None:
            cap = pk.cap(level, single)
            if self._cost(tables, cap, cap - need)[0] == 0:
                return self.take_nodes(pk, level, single, need, ctx)
        pieces = sorted((c, g) for g in scope if (c := pk.cap(level, g)) > 0)
        if sum(c for c, _ in pieces) < need:
            return False
        for cap, g in pieces:
            take = min(cap, need)
            if not self.take_nodes(pk, level, g, take, ctx):
                return False
            need -= take
            if not need:
                return True
        return False

    # -- nodes -----------------------------------------------------------------------------------------
    def node_order(self, pk: Picker, nodes: Sequence[int]) -> Iterable[int]:
        state = pk.state
        if pk.req.k == state.topo.max_node_gpus:
            if not any(state.degraded[n] for n in nodes):
                return nodes
            return sorted(nodes, key=lambda n: (state.degraded[n] != 0, n))
        # partial nodes: best fit (fewest free GPUs that still fit), healthy first; a job that can't move
        # goes beside others that can't (the node is pinned already)
        if self.pin_aware and not pk.req.job.checkpointable:
            return sorted(
                nodes,
                key=lambda n: (
                    state.degraded[n] & state.free[n] != 0,
                    not pinned_node(state, n),
                    state.nfree[n],
                    n,
                ),
            )
        return sorted(nodes, key=lambda n: (state.degraded[n] & state.free[n] != 0, state.nfree[n], n))
