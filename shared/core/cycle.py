"""The scheduling cycle: order the pending jobs, place them, reserve, backfill and preempt. Pure.

One call decides for every pending job: `Allocate`, `Reserve` or `Pending`, plus `Preempt` for each
victim. `now` comes in; no clock is read. The state passed in is left holding the cycle's allocations
(and without its preemption victims); reservation holds live only during the cycle.

Order: priority (high first); inside one priority, tenants take turns by weighted fair share — the
tenant with the least (GPUs held + recent usage) / weight goes next, counting the jobs ordered ahead of
it this cycle — and each tenant's jobs go by submit time, then id.

Per job, in that order:
1. invalid shapes and tenants over quota are pending with the reason;
2. place it now if the policy finds room outside every reservation hold;
3. backfill into a reservation's nodes only if the job is expected to end before that reservation
   starts (Slurm's rule; estimates are what the scheduler has);
4. preempt lower-priority jobs when that is the only way (topology-aware: the group that is cheapest
   to free — checkpointable victims first, fewest GPUs — never a scatter of victims across domains);
5. a flexible job (several segment sizes; policies with `flexible_segments`) whose preferred layout
   doesn't fit starts with the largest smaller one that fits now, unless the preferred one's forecast
   start is soon enough to end sooner despite the wait (`_smaller_layout`: the smaller layout runs
   `SlowdownModel.layout_factor` slower, the communication model the simulator charges);
6. an elastic job (a GPU range) that doesn't fit at its most starts at the largest size that fits now (every
   policy: Slurm's --nodes=MIN-MAX); otherwise it goes on at its least size, and under policies that
   `resize`, running elastic jobs of lower priority (of any, for a job reserved last cycle) are shrunk by
   whole units before anything is preempted (`_shrink`: `Resize` decisions);
7. otherwise the first `reservations` such jobs get a reservation: the earliest time the running jobs'
   expected ends free a fitting layout, whose free nodes are held for the rest of the cycle.

Reservations that stick (policies with `sticky_reservations`, i.e. rackscale): the scheduler remembers the
NVLink domains of each reservation it made last cycle. A job reserved again keeps those domains unless
another layout's forecast start is much earlier (`STICKY_FACTOR` times sooner, less `STICKY_SLACK_S`).
Re-planning from scratch every cycle (Slurm) lets a multi-domain reservation wander after noisy estimates:
the domains it left get refilled by the backlog, and the ones it moved to had not been held while they
drained, so the job waits for several domains to drain together again and again. That memory (domain ids
per reserved job) is one of the three things a `Scheduler` keeps between cycles.

Lending reserved nodes (`lend_checkpointable`; None, the default, takes the policy's choice: rackscale
lends, the baselines keep Slurm's rule): a checkpointable job of at least `lend_min_nodes` nodes may backfill
into held nodes whatever its expected end. It stays on loan until it ends: every reservation's forecast
counts every borrower as gone, and a job reserved last cycle that would fit without them preempts the
borrowers in its way (checkpointed, their work kept; never one started in the same cycle). Owed only to the
reservation it entered, a borrower that outlived that one's start (estimates run long: it often started
elsewhere) held a draining domain to its own end, and the reservations made after counted on other domains
(Philly's two-domain jobs waited longer). Small jobs don't borrow: they fit the holes other small jobs
leave everywhere, and their loans only cost the large jobs reclaims (docs/evaluation.md, finding 6). The
borrowers and the jobs reserved last cycle are the other two things a `Scheduler` keeps.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.core.comm import SlowdownModel
from shared.core.decisions import Allocate, Decision, Pending, PendingCode, Preempt, Reserve, Resize
from shared.core.policies import Context, Placement, Policy, get_policy
from shared.core.reasons import duration, explain
from shared.core.shape import JobSpec, Request, ShapeError, request
from shared.core.state import INF, Allocation, ClusterState
from shared.core.statement import Statement
from shared.core.timeline import Timeline
from shared.core.topology import Topology

HOLD_PREFIX = "resv:"
# a kept reservation yields to another layout only when that one starts this much sooner (see module doc)
STICKY_FACTOR = 1.5
STICKY_SLACK_S = 3600.0
_UNKNOWN = object()  # a forecast that runs into jobs without an expected end


LEND_MIN_NODES = 4  # CycleConfig.lend_min_nodes's default


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    weight: float = 1.0
    quota_gpus: int | None = None  # most GPUs the tenant may hold at once; None: no quota


@dataclass(frozen=True, slots=True)
class CycleConfig:
    policy: str = "rackscale"
    reservations: int = 4  # how many blocked jobs (in order) get a reservation
    backfill: bool = True  # False: nothing starts behind a blocked job
    preemption: bool = True
    default_runtime_s: float = 24 * 3600.0  # for jobs without an expected runtime
    max_tested: int | None = None  # jobs tried per cycle (Slurm's bf_max_job_test); None: all
    # checkpointable jobs may backfill into a reservation's held nodes whatever their expected end; they stay
    # on loan until they end, and a reserved job takes their nodes back (preempts them: checkpointed, requeued
    # with their progress) as soon as it would fit without them. Off: Slurm's rule (only jobs expected to end
    # before the start). None: the policy's default (Policy.lends_reserved: rackscale lends, the baselines
    # don't). Needs preemption (a loan is given back by it)
    lend_checkpointable: bool | None = None
    # jobs of fewer nodes never borrow: they soon fit elsewhere, and their loans cost the large jobs reclaims
    # (on Philly the large jobs waited longest with every size borrowing, least from 4 or 8 nodes; the Kalos mix
    # borrows only with its 16+-node gangs either way; docs/evaluation.md, finding 6)
    lend_min_nodes: int = LEND_MIN_NODES
    # a migration planner runs beside the scheduler: policies that can (rackscale) keep the jobs it can't move
    # together, so the other domains stay emptiable (Policy.pin_aware); off without migration, where the
    # packing it costs buys nothing (measured on the Kalos + Philly mix, docs/evaluation.md)
    pin_aware: bool = False
    # what a smaller layout of a flexible job costs (the simulator passes the model it charges)
    comm: SlowdownModel = field(default_factory=SlowdownModel)
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)

    def tenant(self, name: str) -> TenantPolicy:
        return self.tenants.get(name, _DEFAULT_TENANT)


_DEFAULT_TENANT = TenantPolicy()


@dataclass(slots=True)
class CycleResult:
    decisions: list[Decision] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [d for d in self.decisions if isinstance(d, kind)]

    def by_job(self) -> dict[str, Decision]:
        """The final decision per pending job (Allocate, Reserve or Pending)."""
        return {d.job_id: d for d in self.decisions if not isinstance(d, Preempt | Resize)}


def order_jobs(
    pending: Iterable[JobSpec],
    held: Mapping[str, int],
    config: CycleConfig,
    usage: Mapping[str, float] | None = None,
) -> list[JobSpec]:
    """Priority first; within a priority, weighted fair share between tenants (see module doc)."""
    usage = usage or {}
    by_prio: dict[int, dict[str, list[JobSpec]]] = {}
    for job in pending:
        by_prio.setdefault(job.priority, {}).setdefault(job.tenant, []).append(job)
    share: dict[str, float] = {}
    out: list[JobSpec] = []
    for prio in sorted(by_prio, reverse=True):
        tenants = by_prio[prio]
        heap: list[tuple[float, str]] = []
        for tenant, jobs in tenants.items():
            jobs.sort(key=lambda j: (j.submit_time, j.id), reverse=True)  # pop() takes the oldest
            if tenant not in share:
                weight = max(config.tenant(tenant).weight, 1e-9)
                share[tenant] = (held.get(tenant, 0) + usage.get(tenant, 0.0)) / weight
            heap.append((share[tenant], tenant))
        heapq.heapify(heap)
        while heap:
            _, tenant = heapq.heappop(heap)
            job = tenants[tenant].pop()
            out.append(job)
            share[tenant] += job.gpus / max(config.tenant(tenant).weight, 1e-9)
            if tenants[tenant]:
                heapq.heappush(heap, (share[tenant], tenant))
    return out


@dataclass(frozen=True, slots=True)
class _Forecast:
    """A reservation's forecast as a cycle made it: when and where the job starts, for how long."""

    start: float
    placement: Placement
    runtime: float
    shape: tuple[object, ...]
    node_names: tuple[str, ...]  # what its node indices meant (a new inventory generation may renumber)


@dataclass(slots=True)
class _Hold:
    job_id: str
    start: float
    end: float  # start + expected runtime: when the forecast gives the layout back
    nodes: tuple[int, ...]  # the whole reserved layout (busy nodes too)
    masks: tuple[int, ...]


class Scheduler:
    """Runs cycles with one policy and configuration.

    Between cycles it keeps the domains of the last cycle's reservations (sticky policies), the jobs it
    reserved, and the borrowers of reserved nodes (lending).
    """

    def __init__(self, config: CycleConfig | None = None) -> None:
        self.config = config or CycleConfig()
        self.policy: Policy = get_policy(self.config.policy)
        self.policy.pin_aware = self.config.pin_aware
        lend = self.config.lend_checkpointable
        # a loan is given back by preemption: without it reserved nodes are not lent (Slurm's rule)
        self.lend = (self.policy.lends_reserved if lend is None else lend) and self.config.preemption
        self.promised: dict[str, frozenset[int]] = {}  # job id -> NVLink domains of its last reservation
        # borrower job id -> the reserved jobs whose held nodes it took (`lend_checkpointable`); a borrower
        # stays on loan until it ends: any job reserved last cycle may take its nodes back
        self.lent: dict[str, frozenset[str]] = {}
        self.reserved: frozenset[str] = frozenset()  # the jobs the last cycle reserved
        self.forecasts: dict[str, _Forecast] = {}  # the last cycle's reservations (`reuse_forecasts`)
        # job id -> (spec, topology, its request or why it has none), for the last cycle's jobs
        self.requests: dict[str, tuple[JobSpec, Topology, Request | ShapeError]] = {}
        # the running jobs' ends played forward, kept between forecasts and cycles (`_Cycle._earliest_start`)
        self.timeline = Timeline()

    def cycle(
        self,
        state: ClusterState,
        pending: Sequence[JobSpec],
        now: float,
        usage: Mapping[str, float] | None = None,
        *,
        reuse_forecasts: bool = False,
    ) -> CycleResult:
        """One cycle. `reuse_forecasts`: a job reserved last cycle keeps that reservation while it still holds
        (see `_Cycle._kept_forecast`) instead of replaying every running job's end again, whose cost grows with
        the running jobs (docs/performance.md, a large job waiting). Its start may then be later than a fresh
        forecast's (a job ended early); cycles without it (the running system's timer, every simulator cycle)
        find the earliest."""
        return _Cycle(self, state, now, reuse_forecasts).run(pending, usage)


class _Cycle:
    """One cycle's working memory."""

    def __init__(self, sched: Scheduler, state: ClusterState, now: float, reuse_forecasts: bool = False) -> None:
        self.sched = sched
        self.reuse_forecasts = reuse_forecasts
        self.forecasts: dict[str, _Forecast] = {}
        self.promised: dict[str, frozenset[int]] = {}
        self.cfg = sched.config
        self.policy = sched.policy
        self.state = state
        self.now = now
        self.stmt = Statement(state)
        self.holds: list[_Hold] = []
        self.failed_shapes: set[tuple[object, ...]] = set()
        # (shape, the holds it was lent) that didn't fit even so: the state only fills up during a cycle (until a
        # preemption frees GPUs, when `_start_over` forgets these as it forgets `failed_shapes`)
        self.failed_borrows: set[tuple[object, ...]] = set()
        # why a shape doesn't fit, as `explain` words it for the state as it is (forgotten at every change)
        self.reasons: dict[tuple[object, ...], str] = {}
        self.result = CycleResult()
        self.held: dict[str, int] = dict(state.tenant_gpus)  # GPUs per tenant, as this cycle allocates
        self.failed_preempt: dict[tuple[object, ...], int] = {}
        self.lent_now: set[str] = set()  # borrowers started this cycle
        self.started: set[str] = set()  # jobs this cycle allocated (never resized in it: their start is decided)
        if sched.lent:  # borrowers that ended or were moved off elsewhere owe nothing
            sched.lent = {b: ls for b, ls in sched.lent.items() if b in state.allocs}
        # lowest priority among running jobs: no preemption what-if for jobs at or below it
        self.min_priority: int | None = state.min_priority()
        self._preferred: tuple[Request, object] | None = None  # `_preferred_start`'s answer for one job

    # -- main loop ---------------------------------------------------------------------------------------
    def run(self, pending: Sequence[JobSpec], usage: Mapping[str, float] | None) -> CycleResult:
        ordered = order_jobs(pending, self.held, self.cfg, usage)
        self.result.order = [j.id for j in ordered]
        reqs: list[Request | ShapeError] = []
        topo = self.state.topo
        # a job waits through many cycles as the same spec: its request is worked out once per spec and topology
        known = self.sched.requests
        kept: dict[str, tuple[JobSpec, Topology, Request | ShapeError]] = {}
        for job in ordered:
            got = known.get(job.id)
            if got is None or got[0] is not job or got[1] is not topo:
                try:
                    got = (job, topo, request(job, topo))
                except ShapeError as e:
                    got = (job, topo, e)
            kept[job.id] = got
            reqs.append(got[2])
        self.sched.requests = kept
        demand = frozenset(r.slices[-1][1] if r.slices else r.nodes for r in reqs if isinstance(r, Request))
        blocked_by: str | None = None
        try:
            for tested, (job, req) in enumerate(zip(ordered, reqs, strict=True)):
                if isinstance(req, ShapeError):
                    self._pending(job.id, PendingCode.INVALID, str(req))
                elif self.cfg.max_tested is not None and tested >= self.cfg.max_tested:
                    self._pending(job.id, PendingCode.NOT_TESTED, f"not yet tested: {tested} jobs ahead of it")
                elif blocked_by is not None:
                    self._pending(job.id, PendingCode.BLOCKED, f"waits behind job {blocked_by} (backfill off)")
                elif self._decide(req, demand) is False and not self.cfg.backfill:
                    blocked_by = job.id
        finally:
            self.stmt.commit()
            for h in self.holds:
                if HOLD_PREFIX + h.job_id in self.state.allocs:
                    self.state.release(HOLD_PREFIX + h.job_id)
            self.sched.promised = self.promised
            self.sched.reserved = frozenset(h.job_id for h in self.holds)
            self.sched.forecasts = self.forecasts
        return self.result

    def _decide(self, req: Request, demand: frozenset[int]) -> bool | None:
        """Decide one job: True allocated, False waits for resources, None held back by a limit.

        Only False blocks the jobs behind it when backfill is off: a job over its tenant's quota or one
        that can never fit must not stall everyone else.
        """
        job, cfg = req.job, self.cfg
        quota = cfg.tenant(job.tenant).quota_gpus
        used = self.held.get(job.tenant, 0)
        if quota is not None and used + job.gpus > quota:
            self._pending(
                job.id,
                PendingCode.QUOTA,
                f"tenant {job.tenant} is at its quota: {used} of {quota} GPUs in use, this job needs {job.gpus}",
            )
            return None
        runtime = self._runtime(job)
        end = self.now + runtime
        ctx = Context(now=self.now, job_end=end, demand=demand)

        if req.shape_key not in self.failed_shapes:
            placement = self.policy.place(self.state, req, ctx)
            if placement is not None:
                self._allocate(req, placement, end, backfilled=bool(self.holds))
                return True
            self.failed_shapes.add(req.shape_key)
        self._preferred = None
        note = ""  # what a flexible job's smaller layouts add to the pending reason
        if req.fallbacks and self.policy.flexible_segments:
            smaller = self._smaller_layout(req, ctx, runtime, demand)
            if smaller is None:
                return True
            note = smaller
        if req.sizes:
            if self._smaller_size(req, ctx):
                return True
            # from here on (loans, shrinking others, preemption, a reservation) at its least size
            most = req.job.gpus
            req = req.sizes[-1]
            note += f"; elastic {req.job.gpus}-{most} GPUs: no size fits now, it waits at its least"
            runtime = self._runtime(req.job)
            end = self.now + runtime
            ctx = Context(now=self.now, job_end=end, demand=demand)
        if self.sched.lend and self._reclaim(req, ctx, end):
            return True
        reason = self.reasons.get(req.shape_key)
        if reason is None:
            reason = self.reasons[req.shape_key] = explain(self.state, req, self.policy.honours_required)
        reason += note

        if cfg.backfill and self._borrow(req, ctx, end):
            return True
        if self.policy.resizes and self._shrink(req, ctx, end):
            return True
        if cfg.preemption and self._preempt(req, ctx, end):
            return True
        if len(self.holds) < cfg.reservations:
            found = self._preferred_start(req, runtime, demand)
            if found is None:
                self._pending(job.id, PendingCode.NEVER_FITS, f"{reason}; won't fit even when running jobs end")
                return None
            if found is _UNKNOWN:
                self._pending(
                    job.id,
                    PendingCode.NO_FIT,
                    f"{reason}; no start time can be forecast (jobs without an expected end)",
                )
                return False
            assert isinstance(found, tuple)
            start, placement = found
            self.forecasts[job.id] = _Forecast(start, placement, runtime, req.shape_key, self.state.topo.node_names)
            if self.policy.sticky_reservations:
                node_dom = self.state.topo.node_group[self.state.topo.domain]
                self.promised[job.id] = frozenset(node_dom[n] for n in placement.nodes)
            self._hold(job.id, start, start + runtime, placement)
            self.result.decisions.append(
                Reserve(job.id, start, placement.nodes, f"{reason}; reserved to start in {duration(start - self.now)}")
            )
            return False
        behind = f"; {len(self.holds)} reservations ahead" if self.holds else ""
        self._pending(job.id, PendingCode.NO_FIT, reason + behind)
        return False

    def _runtime(self, job: JobSpec) -> float:
        """The job's expected runtime; the default for one without, scaled like an elastic job's estimate."""
        if job.expected_runtime_s is not None:
            return job.expected_runtime_s
        most = job.elastic[1] if job.elastic is not None else job.gpus
        return self.cfg.default_runtime_s * most / job.gpus

    def _smaller_size(self, req: Request, ctx: Context) -> bool:
        """Start an elastic job at the largest of its smaller sizes that fits now."""
        for alt in req.sizes:
            if alt.shape_key in self.failed_shapes:
                continue
            end = self.now + self._runtime(alt.job)
            placement = self.policy.place(self.state, alt, replace(ctx, job_end=end))
            if placement is not None:
                self._allocate(alt, placement, end, backfilled=bool(self.holds))
                return True
            self.failed_shapes.add(alt.shape_key)
        return False

    def _shrink(self, req: Request, ctx: Context, end: float) -> bool:
        """Shrink running elastic jobs by whole units, from the end of their nodes down to their least, until the
        job fits: ones of lower priority, or of no higher priority when the job was reserved last cycle (its
        reservation needs the room). Lowest priority, then largest, first; all or nothing."""
        job, state = req.job, self.state
        if self.holds and end > min(h.start for h in self.holds):
            return False  # the freed nodes may be counted on by a reservation
        reserved = job.id in self.sched.reserved
        cands = sorted(
            (
                a
                for a in state.allocs.values()
                if a.elastic is not None
                and not a.hold
                and a.job_id not in self.started
                and len(a.nodes) - a.elastic[1] >= a.elastic[0]
                and (a.priority < job.priority or (reserved and a.priority <= job.priority))
            ),
            key=lambda a: (a.priority, -a.gpus, a.job_id),
        )
        if not cands:
            return False
        cp = self.stmt.checkpoint()
        before = {a.job_id: a for a in cands}
        shrunk: dict[str, Allocation] = {}
        for a in cands:
            cur = a
            assert a.elastic is not None
            least, unit = a.elastic
            while len(cur.nodes) - unit >= least:
                self.stmt.release(cur.job_id)
                n, keep = len(cur.nodes), len(cur.nodes) - unit
                left = max(cur.expected_end - self.now, 0.0) * n / keep  # the same work on fewer GPUs
                cur = replace(cur, nodes=cur.nodes[:keep], masks=cur.masks[:keep], gpus=0, expected_end=self.now + left)
                self.stmt.allocate(cur)
                shrunk[cur.job_id] = cur
                placement = self.policy.place(state, req, ctx)
                if placement is None:
                    continue
                for job_id, s in shrunk.items():
                    old = before[job_id]
                    self.held[old.tenant] = self.held.get(old.tenant, 0) - (old.gpus - s.gpus)
                    why = f"shrunk from {len(old.nodes)} to {len(s.nodes)} nodes to make room for job {job.id}"
                    self.result.decisions.append(Resize(job_id, s.nodes, s.masks, s.expected_end, job.id, why))
                self._allocate(req, placement, end, backfilled=False)
                self.failed_shapes.clear()  # the shrinking may have freed more than this job took
                self._refresh_holds()
                return True
        self.stmt.rollback(cp)
        return False

    def _preferred_start(self, req: Request, runtime: float, demand: frozenset[int]) -> object:
        """The reservation forecast for the job's (preferred) layout; asked once per job and cycle."""
        if self._preferred is None or self._preferred[0] is not req:
            found = self._kept_forecast(req, runtime) if self.reuse_forecasts else None
            if found is None:
                found = self._forecast(req, runtime, demand)
            self._preferred = (req, found)
        return self._preferred[1]

    def _smaller_layout(self, req: Request, ctx: Context, runtime: float, demand: frozenset[int]) -> str | None:
        """Start a flexible job with the largest smaller segment that fits now (None), unless
        waiting for the preferred layout is expected to end sooner: its forecast start plus the runtime, against
        now plus the runtime times the smaller layout's slowdown. Otherwise what the pending reason adds."""
        preferred = req.job.segment
        assert preferred is not None
        for alt in req.fallbacks:
            if alt.shape_key in self.failed_shapes:
                continue
            factor = self.cfg.comm.layout_factor(preferred, alt.job.segment or preferred)
            end = self.now + runtime * factor
            placement = self.policy.place(self.state, alt, replace(ctx, job_end=end))
            if placement is None:
                self.failed_shapes.add(alt.shape_key)
                continue
            found = self._preferred_start(req, runtime, demand) if factor > 1.0 else None
            if isinstance(found, tuple) and found[0] + runtime <= end:
                return (
                    f"; segments of {alt.job.segment} nodes fit now, but at {factor:.2f}x the runtime they would "
                    f"end later than waiting for segments of {preferred}"
                )
            self._allocate(alt, placement, end, backfilled=bool(self.holds))
            return None
        return ""

    # -- outcomes ----------------------------------------------------------------------------------------
    def _pending(self, job_id: str, code: PendingCode, reason: str) -> None:
        self.result.decisions.append(Pending(job_id, code, reason))

    def _allocate(self, req: Request, placement: Placement, end: float, backfilled: bool) -> None:
        self.stmt.allocate(placement.allocation(req, self.now, end))
        self.started.add(req.job.id)
        self.reasons.clear()
        prio = req.job.priority
        self.min_priority = prio if self.min_priority is None else min(self.min_priority, prio)
        self.held[req.job.tenant] = self.held.get(req.job.tenant, 0) + req.job.gpus
        self.result.decisions.append(
            Allocate(req.job.id, placement.nodes, placement.masks, end, backfilled, req.job.segment)
        )

    # -- reservations ------------------------------------------------------------------------------------
    def _hold(self, job_id: str, start: float, end: float, placement: Placement) -> None:
        """Hold the layout's currently free GPUs; its busy nodes are expected free by `start`."""
        hold = _Hold(job_id, start, end, placement.nodes, placement.masks)
        self.holds.append(hold)
        self._apply_hold(hold)

    def _refresh_holds(self) -> None:
        """Re-hold every layout: GPUs freed inside one (by preemption) must fall under the borrow rule."""
        for h in self.holds:
            if HOLD_PREFIX + h.job_id in self.state.allocs:
                self.stmt.release(HOLD_PREFIX + h.job_id)
            self._apply_hold(h)

    def _apply_hold(self, hold: _Hold) -> None:
        self.reasons.clear()
        free = self.state.free
        pairs = [(n, m & free[n]) for n, m in zip(hold.nodes, hold.masks, strict=True) if m & free[n]]
        if pairs:
            nodes, masks = zip(*pairs, strict=True)
            self.stmt.allocate(Allocation(HOLD_PREFIX + hold.job_id, nodes, masks, start=hold.start, hold=True))

    def _kept_forecast(self, req: Request, runtime: float) -> tuple[float, Placement] | None:
        """Last cycle's reservation of the job, when it still holds: it starts later than now, its layout's
        GPUs are all up, on usable nodes outside this cycle's earlier reservations, and every job on them
        (every job on its nodes, for whole-node jobs) is a borrower or expected to end by the start. Then the
        forecast would find it again or one sooner; else None (forecast anew)."""
        f = self.sched.forecasts.get(req.job.id)
        state = self.state
        if f is None or f.start <= self.now or f.runtime != runtime or f.shape != req.shape_key:
            return None
        if f.node_names != state.topo.node_names:  # the same tuple (one topology) compares at once
            return None
        covered = {n for h in self.holds for n in h.nodes}
        lent = self.sched.lent
        for node, mask in zip(f.placement.nodes, f.placement.masks, strict=True):
            if not state.usable[node] or node in covered or mask & ~state.full[node]:
                return None
            for job_id, held in state.node_jobs[node].items():
                if not (req.exclusive or held & mask) or job_id in lent:
                    continue
                a = state.allocs[job_id]
                if a.hold or a.expected_end > f.start:
                    return None
        return f.start, f.placement

    def _forecast(
        self, req: Request, runtime: float, demand: frozenset[int]
    ) -> tuple[float, Placement] | object | None:
        """The reservation's start and layout, or None / _UNKNOWN as `_earliest_start` says.

        Sticky policies keep last cycle's domains when they still work and no other layout starts much
        sooner; otherwise (and always for the others) the earliest start anywhere.
        """
        before = self.sched.promised.get(req.job.id) if self.policy.sticky_reservations else None
        if before:
            topo = self.state.topo
            layers = self.policy.layers(self.state, req)
            # only layouts of whole domain-level pieces can be confined to domains; ids from another topology
            # (fewer domains) are dropped
            if layers and layers[-1][0] >= topo.domain and max(before) < len(topo.group_nodes[topo.domain]):
                kept = self._earliest_start(req, runtime, demand, within=before)
                if isinstance(kept, tuple):
                    # only a layout starting before `until` is "much sooner"; the search stops there
                    until = self.now + (kept[0] - self.now - STICKY_SLACK_S) / STICKY_FACTOR
                    sooner = self._earliest_start(req, runtime, demand, until=until) if until > self.now else None
                    return sooner if isinstance(sooner, tuple) else kept
        return self._earliest_start(req, runtime, demand)

    def _earliest_start(
        self,
        req: Request,
        runtime: float,
        demand: frozenset[int],
        within: frozenset[int] | None = None,
        until: float = INF,
    ) -> tuple[float, Placement] | object | None:
        """Replay the forecast (running jobs end, earlier reservations run and end) until the job fits.

        `within`: only in these NVLink domains; `until`: give up (None) at this time. Nothing changes: the
        policy looks at the scheduler's timeline (shared/core/timeline.py), a snapshot of the state with the
        running jobs ended by then gone.

        A cheap gate decides when the policy must look: the replay follows the ends on its own counts (nodes of
        the gate's level with k free GPUs, per group and in all) and asks the timeline for its state only when
        the gate passes. Ends and nodes coming back commute, so the state the policy sees is the one a
        step-by-step replay would have reached. The timeline keeps its snapshots between forecasts and cycles
        (each forecast replayed most running jobs' ends again: the simulator's hot spot on a busy cluster),
        releasing only the jobs that end between its nearest earlier snapshot and the time asked.
        """
        live = self.state
        # earlier reservations keep their whole layouts, busy nodes included, until they end
        cover: dict[int, int] = {}
        for h in self.holds:
            for node in h.nodes:
                cover[node] = cover.get(node, 0) + 1
        free, full, up, allocs = live.free, live.full, live.usable, live.allocs
        out = {n for n in cover if up[n]}  # reserved nodes out of play until their last reservation ends
        # borrowers give their nodes back to whichever reserved job fits without them: they end now
        mine = self.sched.lent
        events: list[tuple[float, int, str]] = [
            (self.now if a.job_id in mine else max(a.expected_end, self.now), 0, a.job_id)
            for a in allocs.values()
            if not a.hold
        ]
        events += [(h.end, 1, str(i)) for i, h in enumerate(self.holds)]
        events.sort()
        need, k = req.nodes, req.k
        # cheap gate before asking the policy: one-layer layouts need `pieces` hostable runs
        layers = self.policy.layers(live, req)
        level, size = layers[0] if len(layers) == 1 else (0, need)
        pieces = need // size
        node_group = live.topo.node_group[level]
        fit = [r[k] for r in live.count[level]]
        total = live.count[0][0][k]
        for node in out:
            if live.nfree[node] >= k:
                fit[node_group[node]] -= 1
                total -= 1
        allowed = [True] * len(fit)
        if within is not None and level >= live.topo.domain:
            # groups outside the allowed domains host nothing, now or later
            topo = live.topo
            node_dom = topo.node_group[topo.domain]
            allowed = [node_dom[topo.group_nodes[level][g][0]] in within for g in range(len(fit))]
        contrib = [f // size if ok else 0 for f, ok in zip(fit, allowed, strict=True)]
        hostable = sum(contrib)
        # the holds' layouts come back whole, free and busy nodes alike, when they end
        later_free: dict[int, int] = {}  # free GPUs after the ends so far, of the nodes they touched
        for h in self.holds:
            a = allocs.get(HOLD_PREFIX + h.job_id)
            if a is not None:
                for node, mask in zip(a.nodes, a.masks, strict=True):
                    later_free[node] = later_free.get(node, free[node]) | (mask & full[node])
        i = 0
        while i < len(events):
            t = events[i][0]
            if t == INF:
                return _UNKNOWN  # jobs with no expected end never free their nodes in a forecast
            if t >= until:
                return None  # no fit before `until`: the caller's search stops there
            touched: set[int] = set()
            while i < len(events) and events[i][0] == t:
                _, kind, ref = events[i]
                i += 1
                if kind == 0:
                    a = allocs[ref]
                    for node, mask in zip(a.nodes, a.masks, strict=True):
                        before = later_free.get(node, free[node])
                        later_free[node] = after = before | (mask & full[node])
                        if up[node] and node not in out and before.bit_count() < k <= after.bit_count():
                            g = node_group[node]
                            fit[g] += 1
                            total += 1
                            touched.add(g)
                    continue
                for node in self.holds[int(ref)].nodes:
                    cover[node] -= 1
                    if not cover[node] and node in out:
                        out.discard(node)
                        if later_free.get(node, free[node]).bit_count() >= k:
                            g = node_group[node]
                            fit[g] += 1
                            total += 1
                            touched.add(g)
            for g in touched:
                now_units = fit[g] // size if allowed[g] else 0
                hostable += now_units - contrib[g]
                contrib[g] = now_units
            if hostable < pieces or total < need:
                continue
            placement = self._place_at(req, t, runtime, demand, within, out)
            if placement is not None:
                return t, placement
        return None

    def _place_at(
        self,
        req: Request,
        t: float,
        runtime: float,
        demand: frozenset[int],
        within: frozenset[int] | None,
        out: set[int],
    ) -> Placement | None:
        """The policy's placement at `t` of a forecast: every running job expected to end by then gone, the
        nodes of the reservations still ahead out of play. The timeline's state at `t` is shared with other
        forecasts and cycles: the nodes go out of play only while the policy looks (`Timeline.place`)."""
        ctx = Context(now=t, job_end=t + runtime, demand=demand, within=within)
        return self.sched.timeline.place(self.policy, req, ctx, out, self.state, self.sched.lent, self.now)

    def _borrow(self, req: Request, ctx: Context, end: float) -> bool:
        """Backfill into held nodes of reservations that start after this job is expected to end (with
        lending on, a checkpointable job into any reservation's: it gives them back when asked)."""
        lend = self.sched.lend and req.job.checkpointable and req.nodes >= self.cfg.lend_min_nodes
        lendable = [h for h in self.holds if (lend or h.start >= end) and HOLD_PREFIX + h.job_id in self.state.allocs]
        if not lendable:
            return False
        tried = (req.shape_key, *(h.job_id for h in lendable))
        if tried in self.failed_borrows:
            return False
        cp = self.stmt.checkpoint()
        for h in lendable:
            self.stmt.release(HOLD_PREFIX + h.job_id)
        placement = self.policy.place(self.state, req, ctx)
        if placement is None:
            self.stmt.rollback(cp)
            self.failed_borrows.add(tried)
            return False
        self._allocate(req, placement, end, backfilled=True)
        if lend:
            used = set(placement.nodes)
            # every reservation whose layout it enters and outlasts may take it back (layouts overlap: a later
            # reservation counts on an earlier one's nodes once that one has run)
            lenders = frozenset(h.job_id for h in self.holds if h.start < end and used & set(h.nodes))
            if lenders:
                self.sched.lent[req.job.id] = lenders
                self.lent_now.add(req.job.id)
        for h in lendable:
            self._apply_hold(h)
        return True

    def _reclaim(self, req: Request, ctx: Context, end: float) -> bool:
        """A job reserved last cycle, with borrowers of reserved nodes about (any reservation's: they stay on
        loan until they end): when it fits with them gone, preempt the ones in its way (they keep their
        progress) and start it."""
        lent = self.sched.lent
        if req.job.id not in self.sched.reserved:
            return False
        # not one lent this cycle: its Allocate is already decided (a preemption would undo a start)
        borrowers = sorted(b for b in lent if b in self.state.allocs and b not in self.lent_now)
        if not borrowers:
            return False
        cp = self.stmt.checkpoint()
        gone = {b: self.stmt.release(b) for b in borrowers}
        self._refresh_holds()  # what they free inside the layouts of the reservations ahead stays held
        placement = self.policy.place(self.state, req, ctx)
        self.stmt.rollback(cp)
        if placement is None:
            return False
        used = set(placement.nodes)
        victims = [b for b, a in gone.items() if used & set(a.nodes)]
        released = [self.stmt.release(v) for v in victims]
        if victims:
            self._refresh_holds()
            placement = self.policy.place(self.state, req, ctx)
        if placement is None:
            self.stmt.rollback(cp)
            return False
        for v in released:
            lent.pop(v.job_id, None)
        self._start_over(req, placement, end, released)
        return True

    def _start_over(self, req: Request, placement: Placement, end: float, victims: list[Allocation]) -> None:
        """Start the job on GPUs its victims (released in the statement) gave up: they are preempted."""
        for v in victims:
            self.held[v.tenant] = self.held.get(v.tenant, 0) - v.gpus
            self.result.decisions.append(Preempt(v.job_id, req.job.id, v.checkpointable))
        self._allocate(req, placement, end, backfilled=False)
        self.failed_shapes.clear()  # the victims may have freed more than this job took
        self.failed_borrows.clear()
        self._refresh_holds()

    # -- preemption --------------------------------------------------------------------------------------
    def _preempt(self, req: Request, ctx: Context, end: float) -> bool:
        """Free the cheapest groups of lower-priority work until the job fits; all or nothing."""
        job, state = req.job, self.state
        if self.holds and end > min(h.start for h in self.holds):
            return False  # the freed nodes may be counted on by a reservation
        if self.min_priority is None or self.min_priority >= job.priority:
            return False
        # the state only fills up during a cycle: a shape that found no victims won't at a lower priority
        if self.failed_preempt.get(req.shape_key, self.min_priority - 1) >= job.priority:
            return False
        topo = state.topo
        level, size = req.slices[-1] if req.slices else (req.level, min(req.nodes, topo.max_group_nodes(req.level)))
        cp = self.stmt.checkpoint()
        victims: list[Allocation] = []
        for _ in range(req.nodes // size + 1):
            # the caller has just failed to place the job, so free something before the first try
            chosen = self._cheapest_group(req, level, size)
            if chosen is None:
                break
            for vid in chosen:
                victims.append(self.stmt.release(vid))
            placement = self.policy.place(state, req, ctx)
            if placement is not None:
                self._start_over(req, placement, end, victims)
                return True
        self.stmt.rollback(cp)
        self.failed_preempt[req.shape_key] = max(job.priority, self.failed_preempt.get(req.shape_key, job.priority))
        return False

    def _cheapest_group(self, req: Request, level: int, size: int) -> list[str] | None:
        """Victims that free one more piece of `size` nodes in a single group, cheapest group first."""
        state, k, prio, exclusive = self.state, req.k, req.job.priority, req.exclusive
        node_group = state.topo.node_group[level]
        free, full, usable = state.free, state.full, state.usable

        def fits(n: int, mask: int) -> bool:
            return mask == full[n] if exclusive else mask.bit_count() >= k

        best: tuple[tuple[int, int, int, int], list[str]] | None = None
        for g in range(len(state.topo.group_nodes[level])):
            fitting = state.count[level][g][k]
            if fitting >= size:
                continue
            cands = sorted(
                (a for j in state.jobs_in_group(level, g) if not (a := state.allocs[j]).hold and a.priority < prio),
                key=lambda a: (not a.checkpointable, a.priority, a.gpus, a.job_id),
            )
            after: dict[int, int] = {}  # free mask of touched nodes once the chosen victims are gone
            chosen: list[Allocation] = []
            for a in cands:
                chosen.append(a)
                for n, m in zip(a.nodes, a.masks, strict=True):
                    if node_group[n] != g or not usable[n]:
                        continue
                    before = after.get(n, free[n])
                    after[n] = now = before | (m & full[n])
                    fitting += fits(n, now) - fits(n, before)
                if fitting >= size:
                    cost = (sum(not c.checkpointable for c in chosen), sum(c.gpus for c in chosen), len(chosen), g)
                    if best is None or cost < best[0]:
                        best = (cost, [c.job_id for c in chosen])
                    break
        return None if best is None else best[1]
