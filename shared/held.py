"""Who holds which GPUs, as the core's ClusterState: placement's allocations and the queue's job records.

The queue builds its scheduling cycle's state here and the migration service plans moves on the very same
view, so both see one truth; the topology under it comes from `shared.topology_view`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.core import ClusterState, Topology
from shared.core.state import Allocation as CoreAllocation
from shared.core.state import indices_mask
from shared.jobs import record_spec
from shared.schemas import AllocationRecord, JobRecord, JobState, NodeGpus, Reservations

log = logging.getLogger("rackscale.held")

# GPUs nobody may take back by preemption (an order on its way, a commit not yet seen as placed, a move in
# progress) go into the state above every real priority, so the core never picks them as victims
UNPREEMPTIBLE = 1 << 30
MOVE_SUFFIX = ">move"  # allocation id of a migrating job's target GPUs in a cycle's state


def occupy(
    state: ClusterState,
    job_id: str,
    nodes: list[NodeGpus],
    rec: JobRecord | None,
    now: float,
    *,
    preemptible: bool,
) -> bool:
    """Put a job's GPUs into the state; `preemptible` only for a placed/running job on them. False when some
    of them were taken already (views that lag can overlap): only the free ones went in (and none that is
    down)."""
    idx = [state.topo.node_index.get(ng.node) for ng in nodes]
    if any(i is None for i in idx):
        log.warning("job %s holds GPUs on nodes unknown to inventory: %s", job_id, nodes)
        return True
    spec = record_spec(rec) if rec is not None else None
    runtime = spec.expected_runtime_s if spec is not None and spec.expected_runtime_s is not None else 3600.0
    start = rec.started_at if rec is not None and rec.started_at else now
    free = state.free
    # Only an in-flight order can overlap held GPUs (commits can't: the Lua check), and placement will
    # reject it; its other GPUs still count as taken, or the cycle would hand them out a second time.
    named = [(i, indices_mask(ng.gpus)) for ng, i in zip(nodes, idx, strict=True) if i is not None]
    full = state.full
    whole = not any(m & full[i] & ~free[i] for i, m in named)  # GPUs that are down are nobody's: no overlap
    masks = [(i, m & free[i]) for i, m in named]
    masks = [(i, m) for i, m in masks if m]
    if not masks:
        return whole
    elastic = None
    if preemptible and spec is not None and spec.elastic is not None and nodes and whole:
        per_node = spec.gpus // len(nodes)
        elastic = (spec.elastic[0] // max(per_node, 1), spec.segment or 1)
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
            elastic=elastic,
        )
    )
    return whole


def reserved_domains(memory: Reservations, topo: Topology) -> dict[str, frozenset[int]]:
    """The queue leader's reservations (`Reservations.domains`, by name) as NVLink domain indices of `topo`:
    `Scheduler.promised` for a new leader, `plan_defrag(promised=)` for the migration planner. Domains this
    topology doesn't know are dropped."""
    index = {name: i for i, name in enumerate(topo.group_names[topo.domain])}
    return {job: frozenset(index[d] for d in doms if d in index) for job, doms in memory.domains.items()}


def movable_allocation(rec: JobRecord | None, alloc: AllocationRecord) -> bool:
    """Only a job the queue knows as placed/running on this very allocation can be preempted or moved."""
    return rec is not None and rec.state in (JobState.PLACED, JobState.RUNNING) and rec.attempt == alloc.attempt


_Want = tuple[list[NodeGpus], AllocationRecord | None, JobRecord | None]  # (nodes, allocation, the job's record)
_Wanted = dict[str, _Want]


def _own(alloc: AllocationRecord | None, rec: JobRecord | None, ended: JobRecord | None) -> _Want | None:
    """What holds a job's own GPUs: its committed allocation (with its record, or the record of the ended job
    whose release is on its way), else its record's allocation while the record says placed, running or
    migrating (a view that lags, or a release on its way: its GPUs and its tenant's quota still count, or a
    cycle would hand them out again); None when nothing does."""
    if alloc is not None:
        return alloc.nodes, alloc, rec or ended
    if rec is None:
        return None
    state = rec.state  # (identity tests: an enum member's hash is computed in Python, on every held job)
    if state is JobState.PLACED or state is JobState.RUNNING or state is JobState.MIGRATING:
        return rec.allocation, None, rec
    return None


def _target(rec: JobRecord | None) -> _Want | None:
    """The GPUs a migrating job restores on, held for it until it does (`MOVE_SUFFIX` allocation)."""
    move = rec.move if rec is not None and rec.state is JobState.MIGRATING else None
    return (move.target, None, rec) if move is not None else None


def _wanted(
    allocations: list[AllocationRecord], jobs: Mapping[str, JobRecord], ended: Mapping[str, JobRecord]
) -> _Wanted:
    """What `occupy_held` puts into a state, in its order (the allocations first): allocation id → `_Want`."""
    out: _Wanted = {}
    job, gone = jobs.get, ended.get
    for alloc in allocations:
        key = alloc.job_id
        out[key] = (alloc.nodes, alloc, job(key) or gone(key))
    for rec in jobs.values():
        if (target := _target(rec)) is not None:
            out[rec.id + MOVE_SUFFIX] = target
        if rec.id not in out and (own := _own(None, rec, None)) is not None:
            out[rec.id] = own
    return out


def _preemptible(alloc: AllocationRecord | None, rec: JobRecord | None) -> bool:
    """Only a committed allocation of a job placed/running on it is a victim (not a move's target, not an
    allocation known only from its job's record)."""
    return alloc is not None and movable_allocation(rec, alloc)


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
    allocations = list(allocations)
    for key, (nodes, alloc, rec) in _wanted(allocations, jobs, ended or {}).items():
        occupy(state, key, nodes, rec, now, preemptible=_preemptible(alloc, rec))
    return {a.job_id for a in allocations}


@dataclass(slots=True)
class _Kept:
    """One allocation a HeldState holds, with what it was built from (compared by identity: the same records
    give the same allocation)."""

    alloc: AllocationRecord | None
    rec: JobRecord | None


class HeldState:
    """`occupy_held` kept between cycles: the held GPUs stay in one ClusterState and `sync` applies only what
    changed since the last call, then hands out a copy for the cycle to decide on.

    Rebuilding from every allocation costs time in proportion to the running jobs, on every kicked cycle
    (docs/performance.md, "A busy cluster"). Given the ids of the jobs whose allocation or record changed since the
    last sync (`changed`), a sync costs only those; without them, a pass over every id with identity checks. Records
    are compared by identity: the queue's views (`JobCache`, `HeldView`) replace a record when it
    changes and keep the object while it doesn't. The result is the same as `occupy_held` on a fresh state (the
    property test in tests/unit/test_held_state.py checks it), except that the expected end of a job past its
    estimate stays where it was when the job went in, instead of moving to `now`: the core reads `max(expected_end,
    now)`. Views that lag can overlap (an allocation some of whose GPUs are taken already): then the state is built
    from scratch, in `occupy_held`'s order, until no overlap is left."""

    def __init__(self) -> None:
        self._base: ClusterState | None = None
        self._state: ClusterState | None = None
        self._kept: dict[str, _Kept] = {}
        self._unstarted: set[str] = set()  # kept keys whose start is `now`
        self._overlap = False
        self.rebuilds = 0  # states built from scratch (a new topology or health, an overlap)

    def sync(
        self,
        base: ClusterState,
        allocations: Mapping[str, AllocationRecord],
        jobs: Mapping[str, JobRecord],
        now: float,
        ended: Mapping[str, JobRecord] | None = None,
        changed: Iterable[str] | None = None,
    ) -> ClusterState:
        """The state `occupy_held` would give on a copy of `base` (a state with no allocations, not changed
        here), as a copy the caller may change. `allocations` by job id; `changed`: the ids of the jobs whose
        allocation or record (in `jobs` or `ended`) may differ from the last sync's, or None for any."""
        ended = ended or {}
        state = self._state
        fresh = state is None or base is not self._base or self._overlap
        try:
            if not fresh:
                assert state is not None
                if changed is None:
                    fresh = not self._apply(state, _wanted(list(allocations.values()), jobs, ended), now)
                else:
                    fresh = not self._apply_changed(state, changed, allocations, jobs, ended, now)
            if fresh:
                self._rebuild(base, _wanted(list(allocations.values()), jobs, ended), now)
            self._refresh(now)
        except BaseException:
            self._state = None  # half applied: the next sync builds it from scratch
            raise
        assert self._state is not None
        return self._state.copy()

    def _same(self, key: str, want: _Want | None) -> bool:
        """Whether the kept allocation was built from the same records (its nodes come from them)."""
        k = self._kept.get(key)
        if k is None or want is None:
            return k is None and want is None
        return k.alloc is want[1] and k.rec is want[2]

    def _drop(self, state: ClusterState, key: str) -> None:
        if self._kept.pop(key, None) is not None:
            self._unstarted.discard(key)
            if key in state.allocs:
                state.release(key)

    def _put(self, state: ClusterState, key: str, want: _Want, now: float) -> bool:
        """Occupy one allocation; False on an overlap."""
        nodes, alloc, rec = want
        ok = occupy(state, key, nodes, rec, now, preemptible=_preemptible(alloc, rec))
        self._kept[key] = _Kept(alloc, rec)
        if rec is None or not rec.started_at:  # `occupy` started it at `now`
            self._unstarted.add(key)
        return ok

    def _apply(self, state: ClusterState, wanted: _Wanted, now: float) -> bool:
        """Bring the kept state to `wanted`; False on an overlap (the state is then to be rebuilt). What goes
        is released before anything comes, so GPUs handed from one job to another don't look taken."""
        for key in [k for k in self._kept if k not in wanted or not self._same(k, wanted[k])]:
            self._drop(state, key)
        return all(self._put(state, key, want, now) for key, want in wanted.items() if key not in self._kept)

    def _apply_changed(
        self,
        state: ClusterState,
        changed: Iterable[str],
        allocations: Mapping[str, AllocationRecord],
        jobs: Mapping[str, JobRecord],
        ended: Mapping[str, JobRecord],
        now: float,
    ) -> bool:
        """`_apply` for the changed jobs only: their allocation and their move's target."""
        todo: list[tuple[str, _Want]] = []
        for job in changed:
            rec = jobs.get(job)
            own = _own(allocations.get(job), rec, ended.get(job))
            for key, want in ((job, own), (job + MOVE_SUFFIX, _target(rec))):
                if not self._same(key, want):
                    self._drop(state, key)
                    if want is not None:
                        todo.append((key, want))
        return all(self._put(state, key, want, now) for key, want in todo)

    def _refresh(self, now: float) -> None:
        """Move the start (and so the expected end) of the jobs not started yet to `now`, as `occupy` would."""
        assert self._state is not None
        allocs = self._state.allocs
        for key in self._unstarted:
            a = allocs.get(key)
            if a is not None and a.start != now:
                allocs[key] = CoreAllocation(
                    a.job_id, a.nodes, a.masks, a.priority, a.tenant, a.checkpointable,
                    start=now, expected_end=a.expected_end - a.start + now, gpus=a.gpus,
                )  # fmt: skip

    def _rebuild(self, base: ClusterState, wanted: _Wanted, now: float) -> None:
        self.rebuilds += 1
        state = base.copy()
        self._kept, self._unstarted = {}, set()
        overlap = False
        for key, want in wanted.items():
            overlap |= not self._put(state, key, want, now)
        self._base, self._state, self._overlap = base, state, overlap
