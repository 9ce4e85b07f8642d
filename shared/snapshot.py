"""The core's view of the running system, read from Redis: topology, health and who holds which GPUs.

The queue builds its scheduling cycle's state here and the migration service plans moves on the very same
view, so both see one truth: inventory's node records become the topology (cached per `topo:gen`),
placement's allocations and the queue's job records the held GPUs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from services.inventory.topology import topology_from_records
from shared.core import ClusterState, JobSpec
from shared.core.state import Allocation as CoreAllocation
from shared.core.state import indices_mask
from shared.jobs import job_spec as spec_of
from shared.schemas import AllocationRecord, JobRecord, JobState, NodeGpus, Reservations
from shared.store import Store

log = logging.getLogger("rackscale.snapshot")

# GPUs nobody may take back by preemption (an order on its way, a commit not yet seen as placed, a move in
# progress) go into the state above every real priority, so the core never picks them as victims
UNPREEMPTIBLE = 1 << 30
MOVE_SUFFIX = ">move"  # allocation id of a migrating job's target GPUs in a cycle's state


def job_spec(rec: JobRecord) -> JobSpec:
    """The core's view of a job record."""
    return spec_of(rec.spec, rec.id, rec.submitted_at)


def occupy(
    state: ClusterState,
    job_id: str,
    nodes: list[NodeGpus],
    rec: JobRecord | None,
    now: float,
    *,
    preemptible: bool,
) -> None:
    """Put a job's GPUs into the state; `preemptible` only for a placed/running job on them."""
    idx = [state.topo.node_index.get(ng.node) for ng in nodes]
    if any(i is None for i in idx):
        log.warning("job %s holds GPUs on nodes unknown to inventory: %s", job_id, nodes)
        return
    spec = job_spec(rec) if rec is not None else None
    runtime = spec.expected_runtime_s if spec is not None and spec.expected_runtime_s is not None else 3600.0
    start = rec.started_at if rec is not None and rec.started_at else now
    free = state.free
    # Only an in-flight order can overlap held GPUs (commits can't: the Lua check), and placement will
    # reject it; its other GPUs still count as taken, or the cycle would hand them out a second time.
    masks = [(i, indices_mask(ng.gpus) & free[i]) for ng, i in zip(nodes, idx, strict=True) if i is not None]
    masks = [(i, m) for i, m in masks if m]
    if not masks:
        return
    state.allocate(
        CoreAllocation(
            job_id,
            tuple(i for i, _ in masks),
            tuple(m for _, m in masks),
            priority=(spec.priority if spec else 0) if preemptible else UNPREEMPTIBLE,
            tenant=spec.tenant if spec else "",
            checkpointable=spec.checkpointable if spec else False,
            start=start,
            expected_end=max(start + runtime, now),
        )
    )


def reserved_domains(memory: Reservations, topo: Any) -> dict[str, frozenset[int]]:
    """The queue leader's reservations (`Reservations.domains`, by name) as NVLink domain indices of `topo`:
    `Scheduler.promised` for a new leader, `plan_defrag(promised=)` for the migration planner. Domains this
    topology doesn't know are dropped."""
    index = {name: i for i, name in enumerate(topo.group_names[topo.domain])}
    return {job: frozenset(index[d] for d in doms if d in index) for job, doms in memory.domains.items()}


def movable_allocation(rec: JobRecord | None, alloc: AllocationRecord) -> bool:
    """Only a job the queue knows as placed/running on this very allocation can be preempted or moved."""
    return rec is not None and rec.state in (JobState.PLACED, JobState.RUNNING) and rec.attempt == alloc.attempt


def occupy_held(
    state: ClusterState,
    allocations: Iterable[AllocationRecord],
    jobs: Mapping[str, JobRecord],
    now: float,
    ended: Mapping[str, JobRecord] | None = None,
) -> set[str]:
    """Every committed allocation into the state, and the targets of moves under way (nobody else may take
    them before the job restores there); returns the ids of the jobs holding GPUs. `ended`: records of jobs
    that ended but may still hold GPUs (their release on its way), so those count for their tenant's quota."""
    held: set[str] = set()
    ended = ended or {}
    for alloc in allocations:
        rec = jobs.get(alloc.job_id) or ended.get(alloc.job_id)
        occupy(state, alloc.job_id, alloc.nodes, rec, now, preemptible=movable_allocation(rec, alloc))
        held.add(alloc.job_id)
    for rec in jobs.values():
        if rec.state is JobState.MIGRATING and rec.move is not None:
            occupy(state, rec.id + MOVE_SUFFIX, rec.move.target, rec, now, preemptible=False)
        if rec.state in (JobState.PLACED, JobState.RUNNING, JobState.MIGRATING) and rec.id not in held:
            # placed by its record but missing from the allocations (a view that lags, or a release on its
            # way): its GPUs and its tenant's quota still count, or a cycle would hand them out again
            occupy(state, rec.id, rec.allocation, rec, now, preemptible=False)
    return held


class TopologyView:
    """The core's topology and health from inventory's records, rebuilt only when `topo:gen` moves.

    `get(max_age_s=...)` skips asking for `topo:gen` when it was asked that recently and `invalidate` wasn't
    called since (a reader that hears inventory's NodeChanged events calls it): a decision on a view that
    lags a change by that much is caught by the commit script (node not up) and decided again."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._cache: tuple[int, Any] | None = None
        self._empty: tuple[int, ClusterState] | None = None
        self._checked_at: float | None = None

    def invalidate(self) -> None:
        self._checked_at = None

    @property
    def generation(self) -> int:
        """`topo:gen` of the view the last `get` returned (-1 before any)."""
        return self._cache[0] if self._cache is not None else -1

    async def get(self, max_age_s: float = 0.0) -> tuple[Any, Any] | None:
        """(Topology, Health), or None until a node registers."""
        now = self.clock()
        if self._cache is not None and self._checked_at is not None and now - self._checked_at < max_age_s:
            return self._cache[1]
        gen = await self.store.topology_generation()
        self._checked_at = now
        if self._cache is None or self._cache[0] != gen:
            records = await self.store.nodes()
            self._cache = (gen, topology_from_records(records, generation=gen) if records else None)
        return self._cache[1]

    def last(self) -> tuple[Any, Any] | None:
        """What `get` returned last, without asking the store whether it is current (for lookups that may lag
        a topology change, such as which domain a node is in)."""
        return self._cache[1] if self._cache is not None else None

    def empty_state(self) -> ClusterState:
        """A fresh ClusterState of the view `get` last returned (no allocations): a copy of one built once
        per generation, since building one costs milliseconds at 64 domains."""
        assert self._cache is not None and self._cache[1] is not None, "get() returned no topology yet"
        gen, (topo, health) = self._cache
        if self._empty is None or self._empty[0] != gen:
            self._empty = (gen, ClusterState(topo, health))
        return self._empty[1].copy()
