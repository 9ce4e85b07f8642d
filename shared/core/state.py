"""Per-cycle scratch state: free GPUs per node and free-node counts per group, kept incrementally.

The topology is immutable; everything that changes while a cycle decides lives here, in dense lists
indexed by node and group, so a placement question ("which domains have 16 free whole nodes?") is
a table lookup, not a walk of the tree.

``count[level][group][k]`` is the number of usable (up, not draining) nodes of the group with at least
``k`` free GPUs. A whole-node job of 4-GPU nodes asks for ``k = 4``; a 2-GPU-per-node job for ``k = 2``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from shared.core.topology import GpuState, Health, NodeState, Topology

INF = float("inf")
K = TypeVar("K")


class StateError(RuntimeError):
    """An impossible state change: allocating a busy GPU, releasing an unknown job."""


@dataclass(slots=True)
class Allocation:
    """GPUs held by one job (or by a reservation hold), with what the scheduler needs to know of it."""

    job_id: str
    nodes: tuple[int, ...]
    masks: tuple[int, ...]  # GPU bitmask per node, aligned with nodes
    priority: int = 0
    tenant: str = ""
    checkpointable: bool = False
    start: float = 0.0
    expected_end: float = INF
    hold: bool = False  # a reservation hold, not a running job
    gpus: int = field(default=0)
    # an elastic job: (least nodes, unit nodes): the cycle may shrink it by whole units from the end of its
    # nodes down to the least, instead of preempting it (`cycle._shrink`)
    elastic: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.masks):
            raise StateError(f"allocation {self.job_id}: {len(self.nodes)} nodes but {len(self.masks)} masks")
        if not self.gpus:
            self.gpus = sum(m.bit_count() for m in self.masks)


def mask_indices(mask: int) -> tuple[int, ...]:
    return tuple(i for i in range(mask.bit_length()) if mask >> i & 1)


def indices_mask(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


def _add(counts: dict[K, int], key: K, n: int) -> None:
    """Add n to a count, dropping it at zero (a recount from scratch has no zero entries)."""
    total = counts.get(key, 0) + n
    if total:
        counts[key] = total
    else:
        counts.pop(key, None)


class ClusterState:
    """Free capacity of a topology under a health overlay and a set of allocations."""

    __slots__ = (
        "allocs",
        "count",
        "degraded",
        "degraded_in",
        "free",
        "full",
        "nfree",
        "node_jobs",
        "pinned_in",
        "pins",
        "priorities",
        "tenant_gpus",
        "topo",
        "usable",
    )

    def __init__(self, topo: Topology, health: Health | None = None) -> None:
        self.topo = topo
        health = health or Health.all_up()
        n = len(topo)
        self.full: list[int] = [(1 << g) - 1 for g in topo.node_gpus]  # healthy-or-degraded GPUs
        self.degraded: list[int] = [0] * n
        self.usable: list[bool] = [True] * n
        for name, st in health.nodes.items():
            idx = topo.node_index.get(name)
            if idx is not None and st is not NodeState.UP:
                self.usable[idx] = False
        for (name, gpu), st in health.gpus.items():
            idx = topo.node_index.get(name)
            if idx is None or not 0 <= gpu < topo.node_gpus[idx]:
                continue
            if st is GpuState.DOWN:
                self.full[idx] &= ~(1 << gpu)
            elif st is GpuState.DEGRADED:
                self.degraded[idx] |= 1 << gpu
        # nodes with a degraded GPU per group and level (health is fixed for a state's life)
        self.degraded_in: list[dict[int, int]] = [{} for _ in topo.levels]
        for node, deg in enumerate(self.degraded):
            if deg:
                for li, groups in enumerate(topo.node_group):
                    row = self.degraded_in[li]
                    row[groups[node]] = row.get(groups[node], 0) + 1
        self.free: list[int] = list(self.full)
        self.nfree: list[int] = [m.bit_count() for m in self.free]
        # job -> GPU mask per node; a node's dict is replaced, never changed in place, so copies share them
        self.node_jobs: list[dict[str, int]] = [{} for _ in range(n)]
        self.allocs: dict[str, Allocation] = {}
        # running jobs' GPUs per tenant and their count per priority (holds don't count): kept as jobs come
        # and go, so a cycle's quotas and preemption floor cost no pass over every allocation
        self.tenant_gpus: dict[str, int] = {}
        self.priorities: dict[int, int] = {}
        # jobs a migration planner can't move (`pins`) per node, and usable nodes holding one per NVLink domain:
        # kept as jobs come and go, so pin-aware placement (policies/rackscale.py) reads a domain's in O(1)
        self.pins: list[int] = [0] * n
        self.pinned_in: list[int] = [0] * len(topo.group_nodes[topo.domain])
        kmax = topo.max_node_gpus
        self.count: list[list[list[int]]] = [
            [[0] * (kmax + 1) for _ in topo.group_nodes[li]] for li in range(len(topo.levels))
        ]
        for node in range(n):
            if self.usable[node]:
                self._count(node, -1, self.nfree[node])

    def copy(self) -> ClusterState:
        """An independent copy. Building a state from the topology is the costly part (the counts); copying a
        prepared empty one per topology generation costs a fraction of that (docs/performance.md)."""
        other = ClusterState.__new__(ClusterState)
        other.topo = self.topo
        other.full = self.full[:]
        other.degraded = self.degraded[:]
        other.usable = self.usable[:]
        other.degraded_in = [dict(row) for row in self.degraded_in]
        other.free = self.free[:]
        other.nfree = self.nfree[:]
        other.node_jobs = self.node_jobs[:]
        other.allocs = dict(self.allocs)
        other.tenant_gpus = dict(self.tenant_gpus)
        other.priorities = dict(self.priorities)
        other.pins = self.pins[:]
        other.pinned_in = self.pinned_in[:]
        other.count = [[row[:] for row in level] for level in self.count]
        return other

    # -- counts --------------------------------------------------------------------------------------
    def _count(self, node: int, old: int, new: int) -> None:
        """Move a node from nfree=old to nfree=new in every level's counts (-1: not counted)."""
        if old == new:
            return
        ks, step = (range(old + 1, new + 1), 1) if new > old else (range(new + 1, old + 1), -1)
        for rows, groups in zip(self.count, self.topo.node_group, strict=True):  # the hottest loop
            row = rows[groups[node]]
            for k in ks:
                row[k] += step

    def pins_nodes(self, alloc: Allocation) -> bool:
        """Whether the allocation pins its nodes: a job the migration planner can't move, one that can't
        checkpoint or one with ranks in several NVLink domains (reservation holds don't count)."""
        if alloc.hold:
            return False
        if not alloc.checkpointable:
            return True
        dom = self.topo.node_group[self.topo.domain]
        first = dom[alloc.nodes[0]] if alloc.nodes else -1
        return any(dom[n] != first for n in alloc.nodes)

    def _pin(self, alloc: Allocation, step: int) -> None:
        dom = self.topo.node_group[self.topo.domain]
        for node in set(alloc.nodes):
            before = self.pins[node]
            self.pins[node] = after = before + step
            if self.usable[node] and (before == 0) != (after == 0):
                self.pinned_in[dom[node]] += step

    def capacity(self, level: int, group: int, k: int) -> int:
        """Usable nodes of a group with at least k free GPUs."""
        return self.count[level][group][k]

    def node_fits(self, node: int, k: int, exclusive: bool) -> bool:
        if not self.usable[node]:
            return False
        if exclusive:
            return self.free[node] == self.full[node] and self.nfree[node] >= k and not self.node_jobs[node]
        return self.nfree[node] >= k

    # -- changes -------------------------------------------------------------------------------------
    def allocate(self, alloc: Allocation) -> None:
        if alloc.job_id in self.allocs:
            raise StateError(f"job {alloc.job_id} already holds GPUs")
        wanted: dict[int, int] = {}
        for node, mask in zip(alloc.nodes, alloc.masks, strict=True):
            clash = (mask & ~self.free[node]) | (mask & wanted.get(node, 0))
            if clash:
                raise StateError(
                    f"job {alloc.job_id}: GPUs {mask_indices(clash)} of node {self.topo.node_names[node]} "
                    "are not free (or named twice)"
                )
            wanted[node] = wanted.get(node, 0) | mask
        # second pass only after every node checked, so a failed allocate changes nothing
        for node, mask in zip(alloc.nodes, alloc.masks, strict=True):
            self._take(node, mask, alloc.job_id)
        self.allocs[alloc.job_id] = alloc
        if not alloc.hold:
            self._tally(alloc, 1)
        if self.pins_nodes(alloc):
            self._pin(alloc, 1)

    def _tally(self, alloc: Allocation, step: int) -> None:
        """Count a running job's GPUs for its tenant and its priority (step 1), or stop counting them (-1)."""
        _add(self.tenant_gpus, alloc.tenant, step * alloc.gpus)
        _add(self.priorities, alloc.priority, step)

    def min_priority(self) -> int | None:
        """The lowest priority among running jobs (holds aside); None when none runs."""
        return min(self.priorities, default=None)

    def _take(self, node: int, mask: int, job_id: str) -> None:
        old = self.nfree[node]
        self.free[node] &= ~mask
        self.nfree[node] = new = self.free[node].bit_count()
        jobs = self.node_jobs[node]
        self.node_jobs[node] = {**jobs, job_id: jobs.get(job_id, 0) | mask}
        if self.usable[node]:
            self._count(node, old, new)

    def release(self, job_id: str) -> Allocation:
        alloc = self.allocs.pop(job_id, None)
        if alloc is None:
            raise StateError(f"job {job_id} holds no GPUs")
        for node, mask in zip(alloc.nodes, alloc.masks, strict=True):
            old = self.nfree[node]
            # GPUs that went down while held stay out of the free set
            self.free[node] |= mask & self.full[node]
            self.nfree[node] = new = self.free[node].bit_count()
            jobs = dict(self.node_jobs[node])
            left = jobs.pop(job_id, 0) & ~mask
            if left:
                jobs[job_id] = left
            self.node_jobs[node] = jobs
            if self.usable[node]:
                self._count(node, old, new)
        if not alloc.hold:
            self._tally(alloc, -1)
        if self.pins_nodes(alloc):
            self._pin(alloc, -1)
        return alloc

    def release_many(self, job_ids: Iterable[str]) -> None:
        """`release` for each job, each node's free GPUs, jobs and counts changed once: a forecast ends a batch
        of running jobs at a time, many of them sharing nodes."""
        gone: dict[str, Allocation] = {}
        for job_id in job_ids:
            alloc = self.allocs.pop(job_id, None)
            if alloc is None:
                raise StateError(f"job {job_id} holds no GPUs")
            gone[job_id] = alloc
        freed: dict[int, int] = {}
        for alloc in gone.values():
            for node, mask in zip(alloc.nodes, alloc.masks, strict=True):
                freed[node] = freed.get(node, 0) | mask
            if not alloc.hold:
                self._tally(alloc, -1)
            if self.pins_nodes(alloc):
                self._pin(alloc, -1)
        free, full, nfree, node_jobs, usable = self.free, self.full, self.nfree, self.node_jobs, self.usable
        for node, mask in freed.items():
            old = nfree[node]
            free[node] |= mask & full[node]  # GPUs that went down while held stay out of the free set
            nfree[node] = new = free[node].bit_count()
            node_jobs[node] = {j: m for j, m in node_jobs[node].items() if j not in gone}
            if usable[node]:
                self._count(node, old, new)

    def set_usable(self, node: int, usable: bool) -> None:
        """Drain/undrain or down/up a node; its running allocations are untouched."""
        if self.usable[node] == usable:
            return
        if self.pins[node]:
            self.pinned_in[self.topo.node_group[self.topo.domain][node]] += 1 if usable else -1
        if usable:
            self.usable[node] = True
            self._count(node, -1, self.nfree[node])
        else:
            self._count(node, self.nfree[node], -1)
            self.usable[node] = False

    def set_usable_many(self, nodes: Iterable[int], usable: bool) -> None:
        """`set_usable` for each node, the counts moved once per (group, free GPUs) rather than per node: a
        forecast takes every node of the reservations ahead out of play at once (hundreds on a busy cluster)."""
        step = 1 if usable else -1
        dom = self.topo.node_group[self.topo.domain]
        nfree, flags = self.nfree, self.usable
        changed: list[int] = []
        for node in nodes:
            if flags[node] == usable:
                continue  # already so (or named twice)
            flags[node] = usable
            changed.append(node)
            if self.pins[node]:
                self.pinned_in[dom[node]] += step
        if not changed:
            return
        for rows, groups in zip(self.count, self.topo.node_group, strict=True):
            moved: dict[tuple[int, int], int] = {}  # (group, free GPUs) -> nodes
            for node in changed:
                key = (groups[node], nfree[node])
                moved[key] = moved.get(key, 0) + 1
            for (g, nf), c in moved.items():
                row = rows[g]
                for k in range(nf + 1):
                    row[k] += step * c

    # -- views ---------------------------------------------------------------------------------------
    def jobs_in_group(self, level: int, group: int) -> set[str]:
        out: set[str] = set()
        for node in self.topo.group_nodes[level][group]:
            out.update(self.node_jobs[node])
        return out

    def free_gpus(self) -> int:
        return sum(self.nfree[n] for n in range(len(self.topo)) if self.usable[n])

    def check(self) -> None:
        """Recount everything from scratch and compare: the invariant the property tests lean on."""
        fresh = ClusterState.__new__(ClusterState)
        topo = self.topo
        per_node: list[int] = [0] * len(topo)
        for alloc in self.allocs.values():
            for node, mask in zip(alloc.nodes, alloc.masks, strict=True):
                if per_node[node] & mask:
                    raise StateError(f"GPU on node {topo.node_names[node]} held twice")
                per_node[node] |= mask
        for node in range(len(topo)):
            expect = self.full[node] & ~per_node[node]
            if self.free[node] != expect:
                raise StateError(f"node {topo.node_names[node]}: free mask {self.free[node]:b} != {expect:b}")
        fresh.topo = topo
        fresh.count = [[[0] * (topo.max_node_gpus + 1) for _ in lvl] for lvl in topo.group_nodes]
        fresh.usable = self.usable
        fresh.nfree = self.nfree
        for node in range(len(topo)):
            if self.usable[node]:
                ClusterState._count(fresh, node, -1, self.nfree[node])
        if fresh.count != self.count:
            raise StateError("group counts drifted from the node masks")
        pins = [0] * len(topo)
        for alloc in self.allocs.values():
            if self.pins_nodes(alloc):
                for node in set(alloc.nodes):
                    pins[node] += 1
        pinned_in = [0] * len(self.pinned_in)
        for node, n in enumerate(pins):
            if n and self.usable[node]:
                pinned_in[topo.node_group[topo.domain][node]] += 1
        if pins != self.pins or pinned_in != self.pinned_in:
            raise StateError("pinned-node counts drifted from the allocations")
        tenant_gpus: dict[str, int] = {}
        priorities: dict[int, int] = {}
        for alloc in self.allocs.values():
            if not alloc.hold:
                tenant_gpus[alloc.tenant] = tenant_gpus.get(alloc.tenant, 0) + alloc.gpus
                priorities[alloc.priority] = priorities.get(alloc.priority, 0) + 1
        tenant_gpus = {t: g for t, g in tenant_gpus.items() if g}
        if tenant_gpus != self.tenant_gpus or priorities != self.priorities:
            raise StateError("per-tenant GPU or per-priority job counts drifted from the allocations")
