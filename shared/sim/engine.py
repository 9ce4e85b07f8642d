"""Discrete-event simulator around the scheduling core. The clock is the event time; nothing reads a wall clock.

One `ClusterState` lives for the whole run. Events (job arrivals, job ends, node failures and repairs)
are processed in time order; every event at one timestamp is applied first, then — only if something
changed that could start a job (an arrival, an end, a repair, a requeue) and jobs are waiting — one
`Scheduler.cycle` runs over the whole pending list, exactly as the queue service calls it. Its
decisions are applied as they are:

- `Allocate`: the cycle already left the allocation in the state, with ``expected_end = now + estimate``;
  the simulator starts an *attempt* whose true end is ``now + restore + remaining_work x slowdown``.
- `Preempt`: the cycle already released the victim; the simulator closes its attempt and requeues it,
  keeping its progress when it is checkpointable (a restart from a checkpoint pays the restore cost).
- `Reserve`: recorded (first promised start) for the reservation-hit metric.
- `Pending` with code `invalid`: the job can never run; it leaves the queue and is reported unfinished.

A node failure marks the node unusable (`state.set_usable(node, False)`) and kills the jobs on it:
released and requeued; a checkpointable job keeps the work up to its last periodic checkpoint
(`ckpt_interval_s` of work), others restart from zero. A repair makes the node usable again.

With `migration` on, the core's migration planner (`shared/core/migration.py`) runs here as in the
migration service: on a node failure `plan_evacuation` first moves the checkpointable jobs on it (a spare
node of the same domain, else re-placed whole; they lose the work since their last checkpoint, pay the
restore and restart at once); at most every `migration_interval_s`, before and after a cycle, `plan_defrag`
moves running jobs so a blocked one fits. A moved attempt ends as `moved` keeping all its work; the job
restarts at the destination after checkpoint + restore time (GPU time without progress).

With `usage_half_life_s` > 0, fair share has a memory as in the queue: every attempt's start and end moves
the tenant's decayed usage (`shared.core.usage.UsageLedger.hold`, the function the queue's leader calls), and
each cycle gets the waiting tenants' usage as its `usage`.

Each attempt is recorded (start, end, GPUs, restore overhead, kept work, slowdown, locality) so the
metrics can be recomputed exactly, and GPU-hours can be checked to add up.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from shared.core import (
    LEND_MIN_NODES,
    Allocate,
    ClusterState,
    CycleConfig,
    JobSpec,
    MigrationBudget,
    Movable,
    Move,
    Pending,
    PendingCode,
    Preempt,
    Reserve,
    Resize,
    Scheduler,
    get_policy,
    plan_consolidation,
    plan_defrag,
    plan_evacuation,
    plan_growth,
)
from shared.core.comm import SlowdownModel
from shared.core.shape import with_segment, with_size
from shared.core.usage import UsageLedger
from shared.sim.fleet import FailureModel, FleetConfig, NodeFailures
from shared.sim.mapping import SimJob

END, FAIL, REPAIR, TICK = 0, 1, 2, 3

# attempt outcomes (MOVED: checkpointed and moved by the migration planner, work kept)
DONE, KILLED, PREEMPTED, CUT, MOVED, RESIZED = "done", "killed", "preempted", "cut", "moved", "resized"


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: str = "rackscale"
    seed: int = 1
    fleet: FleetConfig = field(default_factory=FleetConfig)
    failures: FailureModel = field(default_factory=FailureModel)
    slowdown: SlowdownModel = field(default_factory=SlowdownModel)
    reservations: int = 4
    backfill: bool = True
    preemption: bool = True
    max_tested: int | None = None
    ckpt_interval_s: float = 3600.0  # work between periodic checkpoints (what a failure can lose)
    large_nodes: int = 16  # the single-domain run the large-job availability metric looks for
    window: tuple[float, float] | None = None  # metric window; None: first to last submit
    horizon_s: float | None = None  # stop here (running jobs are cut, pending ones unfinished)
    stall_s: float = 30 * 86400.0  # stop when nothing ran or ended this long and only down nodes could help
    samples: int = 400  # time samples for the plots (occupancy, free runs)
    cycle_interval_s: float = 0.0  # 0: a cycle at every changed timestamp; >0: at most one per tick
    queue_depth: int | None = None  # jobs per tenant handed to a cycle (its oldest); None: every pending job
    check_state: bool = False  # state.check() after every event batch (tests; slow)
    # scripted outages (node index, down at, up at), on top of (or instead of) the random failures
    outages: tuple[tuple[int, float, float], ...] = ()
    # migration (the core's planner, shared/core/migration.py): evacuation on node failures and
    # defragmentation for blocked jobs at most every `migration_interval_s`; off keeps issue-4 runs as they were
    migration: bool = False
    migration_budget: MigrationBudget = field(default_factory=MigrationBudget)
    migration_interval_s: float = 300.0
    # checkpointable jobs may backfill into reserved nodes and give them back when the reservation's job
    # fits (CycleConfig.lend_checkpointable); None: on with migration (part of its stack), else the policy's
    # default (rackscale lends, the baselines don't)
    lend_reserved: bool | None = None
    lend_min_nodes: int = LEND_MIN_NODES  # jobs of fewer nodes never borrow
    # fair share with memory: the tenants' GPU-seconds decayed with this half-life go to every cycle as its `usage`
    # (shared/core/usage.py, as the queue's leader does); 0: off, the order sees only the GPUs held now
    usage_half_life_s: float = 0.0

    def cycle_config(self) -> CycleConfig:
        return CycleConfig(
            policy=self.policy,
            reservations=self.reservations,
            backfill=self.backfill,
            preemption=self.preemption,
            max_tested=self.max_tested,
            lend_checkpointable=self.lend_reserved if self.lend_reserved is not None else (self.migration or None),
            lend_min_nodes=self.lend_min_nodes,
            pin_aware=self.migration,
            comm=self.slowdown,  # a flexible job's smaller layout is weighed at what the simulator charges
        )


@dataclass(frozen=True, slots=True)
class Attempt:
    job: int  # index into SimResult.jobs
    start: float
    end: float
    gpus: int
    overhead: float  # restore time at the start (GPU time without progress)
    kept: float  # work (ideal seconds) this attempt contributed to the job's completion
    done: float  # work done, kept or not
    slowdown: float
    cross: float  # share of rank pairs across domains (0: local)
    outcome: str
    nodes: tuple[int, ...] = ()
    segment: int | None = None  # the layout's segment (a flexible job's may be smaller than its first)
    rate: float = 1.0  # work per wall second before slowdown: an elastic job's nodes / its most (1: rigid)

    @property
    def pace(self) -> float:
        """Wall seconds per second of work (ideal seconds at the job's full size)."""
        return self.slowdown / self.rate


@dataclass(slots=True)
class JobRun:
    job: SimJob
    remaining: float  # work left, in ideal (local) seconds
    spec: JobSpec  # what the scheduler sees now (estimate shrinks with progress)
    first_start: float | None = None
    end: float | None = None
    attempt_no: int = 0
    running: bool = False
    start: float = 0.0
    overhead: float = 0.0
    slowdown: float = 1.0
    cross: float = 0.0
    nodes: tuple[int, ...] = ()
    segment: int | None = None  # the running attempt's segment (`Allocate.segment`; a move keeps it)
    rate: float = 1.0  # the running attempt's `Attempt.rate`
    gpus: int = 0  # the running attempt's GPUs (an elastic job's size; else the job's)
    reserved_at: float | None = None  # first promised start
    preemptions: int = 0
    kills: int = 0
    unfinished: str = ""  # why it never finished, when it didn't


@dataclass(slots=True)
class SimResult:
    config: SimConfig
    jobs: list[JobRun]
    attempts: list[Attempt]
    window: tuple[float, float]
    end_time: float
    events: int
    batches: int
    cycles: int
    # time integrals over the metric window (GPU-seconds)
    healthy_gpu_s: float
    alloc_gpu_s: float
    free_gpu_s: float
    frag_gpu_s: float
    large_avail_gpu_s: float
    reservations: int
    reservation_hits: int
    preemptions: int
    failures: int
    failure_kills: int
    samples: list[tuple[float, int, int]]  # (time, allocated GPUs, healthy GPUs)
    free_runs: list[int]  # sampled count of domains per free whole-node run length
    cycle_time_s: float = 0.0  # wall time inside Scheduler.cycle, when a timer was injected
    state_checks: int = 0  # full state.check() runs (check_state)
    migration: MigrationStats | None = None  # None: migration off
    shrinks: int = 0  # elastic jobs shrunk by the cycle (`Resize`) instead of preempted
    grows: int = 0  # elastic jobs grown into idle room (`plan_growth`)


@dataclass(slots=True)
class MigrationStats:
    """What the migration planner did in a run (GPU-seconds unless said otherwise)."""

    defrag_plans: int = 0  # plans applied
    defrag_moves: int = 0
    staged_plans: int = 0  # plans whose beneficiary needed later moves too
    evac_moves: int = 0  # jobs moved off a failed node instead of requeued
    evac_in_place: int = 0  # of those, only the failed node's ranks moved (spare in the same domain)
    evac_requeued: int = 0  # jobs on a failed node the planner requeued
    consolidations: int = 0  # flexible jobs moved onto their preferred segments
    pause_gpu_s: float = 0.0  # GPUs x (checkpoint + restore) of defrag moves, restore of evacuations
    gain_gpu_s: float = 0.0  # planner's estimate of the beneficiaries' wait avoided (GPUs x wait)
    beneficiaries_started: int = 0  # beneficiaries that started at the plan's time
    plan_calls: int = 0
    plan_time_s: float = 0.0  # wall time inside the planner, when a timer was injected
    move_times: list[float] = field(default_factory=list)  # simulated time of every move


class PendingQueue:
    """Waiting jobs, and per tenant their keys in the order the core's ordering takes them.

    A cycle gets every job, or with a depth only each tenant's first `depth` jobs by (priority, submit,
    id). The core's fair-share order takes each tenant's jobs in exactly that order, so the first `depth`
    jobs of the full order are always among them (Slurm's bf_max_job_user plays the same role).
    """

    __slots__ = ("by_tenant", "specs")

    def __init__(self) -> None:
        self.specs: dict[str, JobSpec] = {}
        self.by_tenant: dict[str, list[tuple[int, float, str]]] = {}

    @staticmethod
    def _key(spec: JobSpec) -> tuple[int, float, str]:
        return (-spec.priority, spec.submit_time, spec.id)

    def add(self, spec: JobSpec) -> None:
        if spec.id in self.specs:
            # a second key would outlive the job's removal and break `heads` much later, far from the cause
            raise ValueError(
                f"job {spec.id} is already waiting (requeued while pending: a decision on a job not running)"
            )
        self.specs[spec.id] = spec
        bisect.insort(self.by_tenant.setdefault(spec.tenant, []), self._key(spec))

    def remove(self, job_id: str) -> JobSpec:
        spec = self.specs.pop(job_id)
        keys = self.by_tenant[spec.tenant]
        i = bisect.bisect_left(keys, self._key(spec))
        del keys[i]
        if not keys:
            del self.by_tenant[spec.tenant]
        return spec

    def heads(self, depth: int | None) -> list[JobSpec]:
        if depth is None:
            return list(self.specs.values())
        specs = self.specs
        return [specs[k[2]] for keys in self.by_tenant.values() for k in keys[:depth]]

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.specs

    def __len__(self) -> int:
        return len(self.specs)

    def __getitem__(self, job_id: str) -> JobSpec:
        return self.specs[job_id]


class Simulator:
    def __init__(
        self,
        jobs: Sequence[SimJob],
        config: SimConfig,
        progress: Callable[[float], None] | None = None,
        timer: Callable[[], float] | None = None,
    ) -> None:
        if get_policy(config.policy).yardstick:  # the ceiling pays no cross-domain cost
            config = replace(config, slowdown=replace(config.slowdown, comm_share=0.0, outer_share=0.0))
        self.cfg = config
        self.topo = config.fleet.topology()
        self.state = ClusterState(self.topo)
        self.sched = Scheduler(config.cycle_config())
        self.runs = [JobRun(j, j.duration_s, j.spec) for j in sorted(jobs, key=lambda j: (j.submit_s, j.id))]
        self.index = {r.job.id: i for i, r in enumerate(self.runs)}
        if len(self.index) != len(self.runs):
            raise ValueError("job ids must be unique")
        self.progress = progress
        self.timer = timer  # optional wall-clock probe for profiling the cycle; injected, never read here
        self.attempts: list[Attempt] = []
        self.shrinks = self.grows = 0
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.pending = PendingQueue()
        dom = self.topo.domain
        self.dom_of = self.topo.node_group[dom]
        self.dom_row = self.state.count[dom]
        self.kmax = self.topo.max_node_gpus
        self.healthy = sum(self.topo.node_gpus)
        self.allocated = 0
        # migration: running checkpointable jobs the planner may move, moves under way, budget use
        self.mig: MigrationStats | None = MigrationStats() if config.migration else None
        self.movable: dict[str, Movable] = {}
        self.moving: list[tuple[float, str]] = []  # (pause end, job id)
        self.move_spend: list[tuple[float, float]] = []  # (time, GPU-s) of moves started
        self.next_defrag = -math.inf
        self.next_consolidate = -math.inf
        # flexible jobs running on a smaller segment than their first, that the planner may consolidate
        self.smaller: set[str] = set()
        self.growable: set[str] = set()  # elastic jobs below their most, that the planner may grow
        self.blocked: list[str] = []  # jobs the last cycle left waiting, in its order
        self.waiting_for: dict[str, float] = {}  # beneficiary -> plan time
        # decayed usage per tenant, moved as attempts start and end (None: off)
        self.usage = UsageLedger(config.usage_half_life_s) if config.usage_half_life_s > 0 else None

    # -- event plumbing -----------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> SimResult:
        cfg, state, runs = self.cfg, self.state, self.runs
        n_jobs = len(runs)
        if runs:
            first = runs[0].job.submit_s
            last = runs[-1].job.submit_s
        else:
            first = last = 0.0
        w0, w1 = cfg.window if cfg.window is not None else (first, last if last > first else first + 1.0)
        horizon = cfg.horizon_s if cfg.horizon_s is not None else math.inf
        failures = NodeFailures(cfg.failures, len(self.topo), cfg.seed) if cfg.failures.enabled else None
        if failures is not None:
            for node in range(len(self.topo)):
                self._push(failures.next_failure(node, first), FAIL, node)
        for k, (node, down, _up) in enumerate(cfg.outages):
            self._push(down, FAIL, node, k + 1)  # b > 0: scripted, repaired at its own time

        sample_dt = max(w1 - w0, 1.0) / max(cfg.samples, 1)
        next_sample = w0
        samples: list[tuple[float, int, int]] = []
        free_runs = [0] * (self.topo.max_group_nodes(self.topo.domain) + 1)

        healthy_s = alloc_s = free_s = frag_s = large_s = 0.0
        frag_now = 0  # free GPUs the blocked queue head can't use (see metrics doc)
        large_now = self._large_avail()
        n_res = n_hits = n_preempt = n_fail = n_kill = 0
        events = batches = cycles = state_checks = 0
        cycle_time = 0.0
        finished = 0
        ai = 0  # next arrival
        last_t = first
        running = 0
        next_progress = 0.0
        timer = self.timer

        total_gpus = self.healthy
        dirty = False  # something changed that could start a job since the last cycle
        tick_at = -math.inf  # the scheduled TICK, when cycles are quantised
        interval = cfg.cycle_interval_s
        last_change = first  # last time a job started or ended: a queue that can't move stops the run
        while True:
            t_arr = runs[ai].job.submit_s if ai < n_jobs else math.inf
            t_evt = self.heap[0][0] if self.heap else math.inf
            t = min(t_arr, t_evt)
            if ai >= n_jobs and running == 0 and not dirty:
                if not self.pending:
                    break
                # waiting jobs only move when down nodes come back; give up after `stall_s` of nothing
                if self.healthy == total_gpus or t - last_change > cfg.stall_s:
                    break
            if t == math.inf:
                break
            stop = t > horizon
            if stop:
                t = horizon
            # time integrals for [last_t, t) under the state as it was
            lo, hi = max(last_t, w0), min(t, w1)
            if hi > lo:
                dt = hi - lo
                healthy_s += self.healthy * dt
                alloc_s += self.allocated * dt
                free_s += (self.healthy - self.allocated) * dt
                frag_s += frag_now * dt
                large_s += large_now * dt
            while next_sample <= t and next_sample <= w1:
                samples.append((next_sample, self.allocated, self.healthy))
                for row in self.dom_row:
                    free_runs[row[self.kmax]] += 1
                next_sample += sample_dt
            if stop:
                last_t = t
                break
            last_t = t
            batches += 1
            # apply every event at time t
            while ai < n_jobs and runs[ai].job.submit_s == t:
                r = runs[ai]
                self.pending.add(r.spec)
                ai += 1
                events += 1
                dirty = True
            while self.heap and self.heap[0][0] == t:
                _, _, kind, a, b = heapq.heappop(self.heap)
                events += 1
                if kind == END:
                    r = runs[a]
                    if not r.running or r.attempt_no != b:
                        continue  # stale: the attempt was killed or preempted
                    state.release(r.job.id)
                    self._close(a, t, DONE)
                    r.remaining = 0.0
                    r.end = t
                    running -= 1
                    finished += 1
                    last_change = t
                    dirty = True
                elif kind == FAIL:
                    if not state.usable[a]:
                        if not b and failures is not None:  # down already (scripted): keep its random chain going
                            self._push(failures.next_failure(a, t), FAIL, a)
                        continue
                    n_fail += 1
                    state.set_usable(a, False)
                    self.healthy -= self.topo.node_gpus[a]
                    if self.mig is not None:
                        dirty |= self._evacuate(a, t)
                    for jid in sorted(state.node_jobs[a]):
                        i = self.index[jid]
                        state.release(jid)
                        self._interrupt(i, t, KILLED)
                        running -= 1
                        n_kill += 1
                        dirty = True
                    if b:
                        self._push(cfg.outages[b - 1][2], REPAIR, a, b)
                    else:
                        assert failures is not None
                        self._push(failures.repair_time(a, t), REPAIR, a)
                elif kind == TICK:
                    pass
                else:  # REPAIR
                    if state.usable[a]:
                        continue
                    state.set_usable(a, True)
                    self.healthy += self.topo.node_gpus[a]
                    if not b and failures is not None:
                        self._push(failures.next_failure(a, t), FAIL, a)
                    dirty = True
            if dirty and self.pending and interval > 0 and t < tick_at:
                pass  # a tick is coming: batch everything until then into one cycle
            elif dirty and self.pending and interval > 0 and t != tick_at and t % interval:
                tick_at = math.ceil(t / interval) * interval
                self._push(tick_at, TICK, 0)
            elif dirty and self.pending:
                dirty = False
                if self.mig is not None and t >= self.next_defrag and self.blocked:
                    # before the cycle, so nodes that just came free are consolidated before backfill takes them
                    self._defrag(self.blocked, t)
                t0 = timer() if timer else 0.0
                usage = self.usage.shares(t, self.pending.by_tenant) if self.usage is not None else None
                result = self.sched.cycle(state, self.pending.heads(cfg.queue_depth), t, usage)
                if timer:
                    cycle_time += timer() - t0
                cycles += 1
                decisions = result.decisions
                head: str | None = None
                for d in decisions:
                    if isinstance(d, Preempt):
                        i = self.index[d.job_id]
                        self._interrupt(i, t, PREEMPTED)
                        running -= 1
                        n_preempt += 1
                        dirty = True
                    elif isinstance(d, Resize):  # the state holds its new size already
                        self._resize(self.index[d.job_id], t, d.nodes)
                        self.shrinks += 1
                if dirty:  # preempted victims wait again: one more cycle at this same time considers them
                    self._push(t, TICK, 0)
                for d in decisions:
                    if isinstance(d, Allocate):
                        i = self.index[d.job_id]
                        r = runs[i]
                        self.pending.remove(d.job_id)
                        if r.reserved_at is not None and r.first_start is None and t <= r.reserved_at + 1e-6:
                            n_hits += 1
                        r.segment = d.segment
                        self._start(i, t, d.nodes)
                        running += 1
                        last_change = t
                    elif isinstance(d, Reserve):
                        r = runs[self.index[d.job_id]]
                        if r.reserved_at is None and r.first_start is None:
                            r.reserved_at = d.start
                            n_res += 1
                    elif isinstance(d, Pending) and d.code is PendingCode.INVALID:
                        r = runs[self.index[d.job_id]]
                        self.pending.remove(d.job_id)
                        r.unfinished = f"invalid shape: {d.reason}"
                # the queue head: first job in order that didn't start this cycle
                for jid in result.order:
                    if jid in self.pending:
                        head = jid
                        break
                if self.mig is not None:
                    self._note_started(decisions, t)
                    self.blocked = [j for j in result.order if j in self.pending]
                    if head is not None and t >= self.next_defrag and self._defrag(result.order, t):
                        dirty = True
                        self._push(t, TICK, 0)  # the beneficiary is decided at this same instant
                frag_now = 0
                if head is not None:
                    free = self.healthy - self.allocated
                    if free >= self.pending[head].gpus:
                        frag_now = free
            elif not self.pending:
                dirty = False
                frag_now = 0
            if (self.smaller or self.growable) and t >= self.next_consolidate and self._reshape(t):
                dirty = True
                self._push(t, TICK, 0)  # the nodes it left are the queue's at this same instant
            large_now = self._large_avail()
            if cfg.check_state:
                state_checks += 1
                state.check()
                assert self.allocated == sum(a.gpus for a in state.allocs.values() if not a.hold)
            if self.progress is not None and n_jobs:
                done = (finished + 0.5 * ai) / (1.5 * n_jobs)
                if done >= next_progress:
                    self.progress(done)
                    next_progress = done + 0.005

        end_time = last_t
        # cut what is still running at the horizon; report what never finished
        for i, r in enumerate(runs):
            if r.running:
                state.release(r.job.id)
                self._close(i, end_time, CUT)
                r.unfinished = "still running at the horizon"
            elif r.end is None and not r.unfinished:
                if r.job.id in self.pending:
                    r.unfinished = "never placed: still pending when the run stopped"
                else:
                    r.unfinished = "never submitted before the horizon"
        if self.progress is not None:
            self.progress(1.0)
        return SimResult(
            config=cfg,
            jobs=runs,
            attempts=self.attempts,
            window=(w0, w1),
            end_time=end_time,
            events=events,
            batches=batches,
            cycles=cycles,
            healthy_gpu_s=healthy_s,
            alloc_gpu_s=alloc_s,
            free_gpu_s=free_s,
            frag_gpu_s=frag_s,
            large_avail_gpu_s=large_s,
            reservations=n_res,
            reservation_hits=n_hits,
            preemptions=n_preempt,
            failures=n_fail,
            failure_kills=n_kill,
            samples=samples,
            free_runs=free_runs,
            cycle_time_s=cycle_time,
            state_checks=state_checks,
            migration=self.mig,
            shrinks=self.shrinks,
            grows=self.grows,
        )

    # -- attempts -------------------------------------------------------------------------------------------
    def _start(self, i: int, t: float, nodes: tuple[int, ...], overhead: float | None = None) -> None:
        r = self.runs[i]
        job = r.job
        doms = [self.dom_of[n] for n in nodes]
        model, unit, outer = self.cfg.slowdown, job.unit_nodes, 0.0
        if job.sensitive and r.segment is not None and r.segment < unit:
            # a flexible job on a smaller layout: its segments must be local, its preferred units may not be
            outer = model.cross_share(doms, unit)
            unit = r.segment
        cross = model.cross_share(doms, unit) if job.sensitive else 0.0
        slow = model.factor(cross, outer) if cross or outer else 1.0
        if overhead is None:
            overhead = job.ckpt_cost_s if r.remaining < job.duration_s else 0.0
        r.rate, r.gpus = 1.0, job.gpus
        if job.spec.elastic is not None:  # data parallel: the same work spreads over the GPUs it has
            r.rate, r.gpus = len(nodes) / job.nodes, len(nodes) * (job.gpus // job.nodes)
        if self.mig is not None and job.spec.checkpointable:
            # moved as the rigid job it now is: its segments stay whole; on a smaller layout, consolidation
            # may move it onto its first-listed one
            first = job.spec.segment
            preferred = first if r.segment is not None and first is not None and r.segment < first else None
            laid_out = with_size(with_segment(r.spec, r.segment), r.gpus)  # the rigid job it is now
            self.movable[job.id] = Movable(laid_out, job.ckpt_cost_s, job.ckpt_cost_s, preferred)
            if preferred is not None:
                self.smaller.add(job.id)
            if job.spec.elastic is not None and r.gpus < job.gpus and self.sched.policy.resizes:
                self.growable.add(job.id)
        r.running = True
        r.attempt_no += 1
        r.start, r.overhead, r.slowdown, r.cross, r.nodes = t, overhead, slow, cross, nodes
        if r.first_start is None:
            r.first_start = t
        self.allocated += r.gpus
        if self.usage is not None:
            self.usage.hold(job.spec.tenant, r.gpus, t)
        self._push(t + overhead + r.remaining * slow / r.rate, END, i, r.attempt_no)

    def _close(self, i: int, t: float, outcome: str, kept: float | None = None) -> float:
        """Record the attempt; returns the work it kept."""
        r = self.runs[i]
        elapsed = t - r.start
        done = min(r.remaining, max(0.0, (elapsed - r.overhead) * r.rate / r.slowdown))
        if outcome == DONE:
            done = r.remaining
        keep = done if kept is None else kept
        self.attempts.append(
            Attempt(
                i,
                r.start,
                t,
                r.gpus,
                min(r.overhead, elapsed),
                keep,
                done,
                r.slowdown,
                r.cross,
                outcome,
                r.nodes,
                r.segment,
                r.rate,
            )
        )
        r.running = False
        self.allocated -= r.gpus
        if self.usage is not None:
            self.usage.hold(r.job.spec.tenant, -r.gpus, t)
        if self.mig is not None:
            self.movable.pop(r.job.id, None)
            self.smaller.discard(r.job.id)
            self.growable.discard(r.job.id)
        return keep

    def _interrupt(self, i: int, t: float, outcome: str) -> None:
        """A killed or preempted attempt (its GPUs are already released): keep what survives, requeue."""
        r = self.runs[i]
        job = r.job
        elapsed = t - r.start
        done = min(r.remaining, max(0.0, (elapsed - r.overhead) * r.rate / r.slowdown))
        if not job.spec.checkpointable:
            kept = 0.0
        elif outcome == PREEMPTED:
            kept = done  # checkpointed on the way out
        else:
            step = self.cfg.ckpt_interval_s
            kept = math.floor(done / step) * step if step > 0 else done
        self._close(i, t, outcome, kept)
        r.remaining -= kept
        if outcome == PREEMPTED:
            r.preemptions += 1
        else:
            r.kills += 1
        est = job.spec.expected_runtime_s or job.duration_s
        r.spec = replace(job.spec, expected_runtime_s=est * r.remaining / job.duration_s + job.ckpt_cost_s)
        self.pending.add(r.spec)

    # -- migration ------------------------------------------------------------------------------------------
    def _evacuate(self, node: int, t: float) -> bool:
        """A node just failed (already unusable): the core's planner moves its checkpointable jobs (a spare
        node in the same domain when there is one), each losing the work since its last periodic checkpoint
        and restarting at once; what it requeues is left on the node for the caller's kill-and-requeue.
        True when a job left nodes that are still up (a cycle may use them)."""
        assert self.mig is not None
        if not self.state.node_jobs[node]:
            return False
        plan = plan_evacuation(self.state, {node: self._all_gpus(node)}, self.movable, self.sched.policy, t)
        self.mig.evac_requeued += len(plan.requeue)
        step = self.cfg.ckpt_interval_s
        for mv in plan.moves:
            i = self.index[mv.job_id]
            r = self.runs[i]
            done = self._done(i, t)
            kept = math.floor(done / step) * step if step > 0 else done
            self._relocate(i, t, mv, kept, r.job.ckpt_cost_s, KILLED)
            r.kills += 1
            self.mig.evac_moves += 1
            self.mig.evac_in_place += mv.in_place
        return any(not mv.in_place for mv in plan.moves)

    def _all_gpus(self, node: int) -> int:
        return (1 << self.topo.node_gpus[node]) - 1

    def _done(self, i: int, t: float) -> float:
        r = self.runs[i]
        return min(r.remaining, max(0.0, (t - r.start - r.overhead) * r.rate / r.slowdown))

    def _relocate(self, i: int, t: float, mv: Move, kept: float, pause: float, outcome: str) -> None:
        """Close the job's attempt keeping `kept` work and start it at the move's destination after `pause`."""
        assert self.mig is not None
        r = self.runs[i]
        self.state.release(mv.job_id)
        self.state.allocate(mv.allocation())
        self._close(i, t, outcome, kept)
        r.remaining -= kept
        if mv.segment is not None:
            r.segment = mv.segment
        self._start(i, t, mv.dst.nodes, overhead=pause)
        self.mig.pause_gpu_s += pause * r.gpus
        self.mig.move_times.append(t)
        self.moving.append((t + pause, mv.job_id))

    def _move_budget(self, t: float) -> MigrationBudget:
        """The budget now: moves still pausing their jobs are in flight, and the last hour's moving is spent."""
        self.moving = [(e, j) for e, j in self.moving if e > t]
        self.move_spend = [(s, c) for s, c in self.move_spend if s > t - 3600.0]
        spent = sum(c for _, c in self.move_spend)
        return replace(self.cfg.migration_budget, in_flight=len(self.moving), spent_gpu_s=spent)

    def _defrag(self, order: list[str], t: float) -> bool:
        """Ask the planner for moves that let a blocked job start; apply them. True when something moved."""
        mig, cfg = self.mig, self.cfg
        assert mig is not None
        self.next_defrag = t + cfg.migration_interval_s
        budget = self._move_budget(t)
        if budget.moves_left < 1:
            return False
        busy = {j for _, j in self.moving}
        movable = {j: m for j, m in self.movable.items() if j not in busy} if busy else self.movable
        pending = [self.pending[j] for j in order if j in self.pending]
        t0 = self.timer() if self.timer else 0.0
        mig.plan_calls += 1
        plan = plan_defrag(
            self.state,
            pending,
            movable,
            self.sched.policy,
            budget,
            t,
            self.sched.config.default_runtime_s,
            self.sched.promised,
        )
        if self.timer:
            mig.plan_time_s += self.timer() - t0
        if plan is None:
            return False
        for mv in plan.moves:
            i = self.index[mv.job_id]
            mv_cost = self.movable[mv.job_id]
            self._relocate(i, t, mv, self._done(i, t), mv_cost.checkpoint_s + mv_cost.restore_s, MOVED)
            self.move_spend.append((t, mv.cost_gpu_s))
        mig.defrag_plans += 1
        mig.defrag_moves += len(plan.moves)
        mig.staged_plans += not plan.complete
        mig.gain_gpu_s += plan.gain_gpu_s if plan.complete else 0.0
        if plan.beneficiary is not None and plan.complete:
            self.waiting_for[plan.beneficiary] = t
        return True

    def _resize(self, i: int, t: float, nodes: tuple[int, ...]) -> None:
        """An elastic job checkpoints and restarts on `nodes` (its allocation in the state already), keeping
        its work; it stands still for the checkpoint and the restore."""
        r = self.runs[i]
        kept = self._done(i, t)
        self._close(i, t, RESIZED, kept)
        r.remaining -= kept
        self._start(i, t, nodes, overhead=2 * r.job.ckpt_cost_s)

    def _reshape(self, t: float) -> bool:
        """After a cycle: move one flexible job on a smaller layout onto its preferred one (`plan_consolidation`),
        or else grow one elastic job into idle room (`plan_growth`), when that pays. True when one moved."""
        mig, cfg = self.mig, self.cfg
        assert mig is not None
        self.next_consolidate = t + cfg.migration_interval_s
        budget = self._move_budget(t)
        busy = {j for _, j in self.moving}
        policy, promised = self.sched.policy, self.sched.promised
        movable = {j: self.movable[j] for j in sorted(self.smaller) if j not in busy}
        mv = plan_consolidation(self.state, movable, policy, budget, t, cfg.slowdown, promised) if movable else None
        if mv is None:
            movable = {j: self.movable[j] for j in sorted(self.growable) if j not in busy}
            mv = plan_growth(self.state, movable, policy, budget, t, promised) if movable else None
            if mv is None:
                return False
            self.grows += 1
        else:
            mig.consolidations += 1
        i = self.index[mv.job_id]
        cost = self.movable[mv.job_id]
        self._relocate(i, t, mv, self._done(i, t), cost.checkpoint_s + cost.restore_s, MOVED)
        self.move_spend.append((t, mv.cost_gpu_s))
        return True

    def _note_started(self, decisions: list, t: float) -> None:
        assert self.mig is not None
        if not self.waiting_for:
            return
        for d in decisions:
            if isinstance(d, Allocate) and self.waiting_for.pop(d.job_id, None) == t:
                self.mig.beneficiaries_started += 1
        self.waiting_for = {j: pt for j, pt in self.waiting_for.items() if pt >= t}

    # -- gauges ---------------------------------------------------------------------------------------------
    def _large_avail(self) -> int:
        """GPUs that single-domain jobs of `large_nodes` whole nodes could get right now."""
        size = self.cfg.large_nodes
        k = self.kmax
        runs = 0
        for row in self.dom_row:
            c = row[k]
            if c >= size:
                runs += c // size
        return runs * size * self.kmax


def simulate(
    jobs: Sequence[SimJob],
    config: SimConfig,
    progress: Callable[[float], None] | None = None,
    timer: Callable[[], float] | None = None,
) -> SimResult:
    return Simulator(jobs, config, progress, timer).run()
