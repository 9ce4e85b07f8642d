"""migration: repairs placements while jobs run — evacuates failed hardware, defragments for blocked jobs.

It decides; the queue (which owns job records) carries a move out; placement and the agents do it:

    migration ──MoveOrder──▶ queue: running → migrating ──CheckpointOrder──▶ placement ──StopRank(checkpoint)──▶ agents
    agents ──RankExited(checkpointed) = ack──▶ queue ──ReleaseOrder, then PlaceOrder pinned at the target──▶ placement
    placement ──commit (Lua: every target GPU free)──StartRank(restore)──▶ agents ──RankStarted──▶ queue: running

- **Evacuation** on a health event (`NodeChanged` from inventory: a GPU went down or degraded, after the
  health rules' hysteresis): the core planner (`shared.core.migration.plan_evacuation`) moves each affected
  checkpointable job — in place on a spare of its domain, else re-placed whole under its topology
  guarantees — and requeues the others (a MoveOrder with no target: pending again, or failed by the job's
  `on_node_failure`). A whole node going down is the queue's own node-loss path, not a move.
- **Defragmentation** every `RACKSCALE_MIGRATION_INTERVAL_S`: `plan_defrag` on the pending jobs that fit the
  free total but no layout; its moves go out only when their gain exceeds their cost, within the budgets
  (`RACKSCALE_MAX_MIGRATIONS` in flight, `RACKSCALE_MIGRATION_GPU_HOURS` of moving per hour). The queue
  leader's reservations (`names.reservations_key`) steer it: a job's reserved domains are emptied first, and
  moved jobs stay out of every reserved domain.
- **Rebalancing** every `RACKSCALE_MIGRATION_INTERVAL_S`: from the agents' telemetry (`telemetry.*`), each
  domain's temperature at equal load (`shared.core.rebalance.offsets_from_sums`); a domain that has run
  `RACKSCALE_REBALANCE_SPREAD_C` hotter than others for `RACKSCALE_REBALANCE_HOLD_S` sheds its cheapest
  checkpointable jobs to the cool domains (`plan_rebalance`), one plan at a time.
- **The record**: every move is a `MigrationRecord`, written to JetStream (`names.migration_record(id)`, the
  newest per move kept) before its MoveOrder goes out, mirrored to Redis for the API, and announced as a
  `MigrationEvent` at each step (requested → checkpointing → restoring → done; requeued; rolled_back). Steps
  advance from the job's own events (`events.job.>`, a core subscription: hints, with the job records
  read back every round as the truth); a step not done within
  `RACKSCALE_MIGRATION_STEP_TIMEOUT_S` is rolled back (a checkpoint that never completes: MoveAbort, the
  queue requeues the job). Steps are carried by NATS, so only the time this service could hear counts
  (`shared.liveness`): no step times out while its connection is down, and after a reconnect (or its start)
  each step gets the whole timeout again. A restarted service reads its records back, re-sends the MoveOrder of a move
  still `requested` (the queue dedupes it) and reconciles the rest from the job records: the queue drives a
  move to its end without this service, so a crash here never leaves a job running twice or lost.

Only the replica holding the `migration:leader` lease plans and keeps records (it reads them back when it
takes the lease); the others let events go and wait to take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Mapping
from typing import Any

import msgspec
import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.core import ClusterState, Context, Health, JobSpec, ShapeError, SlowdownModel, get_policy, request
from shared.core.consolidation import plan_consolidation
from shared.core.elastic import plan_growth
from shared.core.migration import MigrationBudget, Movable, Move, plan_defrag, plan_evacuation
from shared.core.rebalance import HeatSums, offsets_from_sums, plan_rebalance
from shared.core.topology import GpuState, NodeState
from shared.held import occupy, occupy_held, reserved_domains
from shared.job_cache import JobCache
from shared.jobs import body_segments, record_spec
from shared.liveness import Hearing, observe, overdue
from shared.metrics import MigrationMetrics
from shared.runtime import Deps, Service
from shared.schemas import (
    EVENTS,
    MIGRATION_RECORD,
    TELEMETRY,
    TERMINAL,
    JobEvent,
    JobRecord,
    JobState,
    MigrationEvent,
    MigrationRecord,
    MoveAbort,
    MoveOrder,
    NodeChanged,
    NodeGpus,
    TelemetryBatch,
    TelemetryMessage,
    encode,
)
from shared.topology_view import TopologyView

log = logging.getLogger("rackscale.migration")

LEASE_S = 5.0
INFLIGHT_S = 15.0  # as the queue: a place order this young still holds its GPUs
FINAL = frozenset({"done", "requeued", "rolled_back"})
HOUR_S = 3600.0


class MigrationService(Service):
    name = "migration"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        s = deps.settings
        self.policy = get_policy(s.policy)
        self.policy.pin_aware = s.pin_aware  # as the queue's cycle places: moved jobs go where it would put them
        self.topology = TopologyView(deps.store)
        self.jobs = JobCache(deps.store)  # active job records, decoded only where they changed since the last round
        self.records: dict[str, MigrationRecord] = {}  # every move this service knows, by id
        self.kick = asyncio.Event()
        self.instance = uuid.uuid4().hex[:12]
        self.spent: deque[tuple[float, float]] = deque()  # (started at, GPU-seconds) of moves in the last hour
        self.last_defrag = float("-inf")
        self.last_evac = float("-inf")
        self.evac_gen = -1  # topology generation of the last evacuation pass
        self.leading = False  # holds the lease: the only replica that plans and writes records
        self.hearing = Hearing(since=0.0)  # since when steps could be heard without a break (start, reconnect)
        # rebalancing: the sums of each node's latest GPU samples (received at, sums), and since when the
        # domains' heat spread has exceeded the limit
        self.heat: dict[str, tuple[float, HeatSums]] = {}
        self.hot_since: float | None = None
        self.last_rebalance = float("-inf")
        assert deps.metrics is not None
        self.metrics = MigrationMetrics(deps.metrics)

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        n, stop = self.names, self.stop_event
        self.hearing = Hearing(since=self.now(), epoch=self.bus.reconnects)
        self.bus.on_link(lambda _up: self._hear(self.now()))
        self.spawn(self.bus.consume(n.node_events, n.consumer(self.name, "node"), EVENTS, self.on_event, stop), "node")
        # job events are hints (the job records are the truth, reconciled every round): a core subscription,
        # so the busiest subject costs no acks; what it misses while down the next round reads from Redis
        await self.bus.subscribe(n.job_events_all, EVENTS, self.on_job_msg)
        await self.bus.subscribe(n.telemetry_all, TELEMETRY, self.on_telemetry)
        self.spawn(self.loop(), "plan")

    async def resume(self) -> None:
        """Read every move's newest record back from JetStream; re-send the orders of moves not yet taken."""
        self.records.clear()
        self.spent.clear()
        for rec in await self.read_records():
            self.records[rec.id] = rec
            if self.now() - rec.created_at <= HOUR_S:
                self.spent.append((rec.created_at, rec.cost_gpu_s))
        self.spent = deque(sorted(self.spent))
        active = [r for r in self.records.values() if r.state not in FINAL]
        if active:
            log.info("resuming %d moves: %s", len(active), ", ".join(f"{r.id} ({r.state})" for r in active))
        for rec in active:
            if rec.state == "requested":
                await self._send(rec)  # the queue dedupes it by msg id and ignores it once the job moved on
        self.metrics.in_flight.set(len(active))
        self.kick.set()

    async def read_records(self) -> list[MigrationRecord]:
        """The newest record of every move in the MIGRATIONS stream."""
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
        subject = self.names.migration_records_all
        sub = await self.bus.js.pull_subscribe(subject, stream=self.names.stream_for(subject), config=config)
        out: dict[str, MigrationRecord] = {}
        try:
            while True:
                try:
                    msgs = await sub.fetch(256, timeout=0.5)
                except (nats.errors.TimeoutError, TimeoutError):
                    break
                for m in msgs:
                    try:
                        rec = MIGRATION_RECORD.decode(m.data)
                    except (msgspec.DecodeError, msgspec.ValidationError) as e:
                        await self.bus.dead_letter(m.subject, m.data, str(e))
                        continue
                    out[rec.id] = rec
                if not msgs or msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return list(out.values())

    # -- records -----------------------------------------------------------------------------------------
    async def save(self, rec: MigrationRecord, step: str | None = None) -> None:
        """The record to JetStream (the truth a restart reads), Redis (the API's view), and its step's event."""
        now = self.now()
        rec.updated_at = now
        self.records[rec.id] = rec
        await self.bus.js.publish(self.names.migration_record(rec.id), encode(rec))
        await self.store.put_migration(rec)
        n = self.names
        if step is not None:
            await self.bus.publish(
                n.migration_events, MigrationEvent(record=rec, at=now), msg_id=f"migration:{rec.id}:{step}"
            )
        self.metrics.in_flight.set(sum(r.state not in FINAL for r in self.records.values()))

    async def _send(self, rec: MigrationRecord) -> None:
        order = MoveOrder(
            migration_id=rec.id,
            job_id=rec.job_id,
            attempt=rec.attempt,
            target=rec.target,
            reason=rec.why,
            at=self.now(),
            segment=rec.segment,
        )
        await self.bus.publish(self.names.job_move, order, msg_id=f"move:{rec.id}")

    async def _finish(self, rec: MigrationRecord, state: str, at: float, error: str = "") -> None:
        if rec.state in FINAL:
            return  # an event and the loop's reconciliation may both see the end
        self.last_evac = float("-inf")  # room may have changed: look at the bad GPUs again
        rec.state = state  # type: ignore[assignment]
        rec.steps = {**rec.steps, state: at}
        if error:
            rec.error = error
        await self.save(rec, state)
        self.metrics.ended.labels(rec.kind, state).inc()
        log.info("move %s of job %s: %s%s", rec.id, rec.job_id, state, f" ({error})" if error else "")
        self.kick.set()  # room for the next move

    def active(self) -> list[MigrationRecord]:
        return [r for r in self.records.values() if r.state not in FINAL]

    # -- events in ---------------------------------------------------------------------------------------
    async def on_event(self, ev: Any, headers: Mapping[str, str]) -> None:
        if isinstance(ev, JobEvent):
            await self.on_job_event(ev)
        elif isinstance(ev, NodeChanged) and ev.changed_gpus:
            self.kick.set()  # GPU health changed: evacuate now (the topology generation moved with it)

    async def on_job_msg(self, ev: Any, _msg: Any) -> None:
        if isinstance(ev, JobEvent):
            await self.on_job_event(ev)

    async def on_telemetry(self, t: TelemetryMessage, _msg: Any) -> None:
        now = self.now()
        for sample in t.samples if isinstance(t, TelemetryBatch) else (t,):
            self.heat[sample.node] = (now, HeatSums.of((g.util, g.temp_c) for g in sample.gpus if not g.lost))

    async def on_job_event(self, ev: JobEvent) -> None:
        """Advance the job's move by the queue's transitions (idempotent: a step is recorded once). Only the
        leader keeps records; another replica lets the event go (the leader reconciles from job records)."""
        if not self.leading:
            return
        for rec in [r for r in self.active() if r.job_id == ev.job_id]:
            await self.advance(rec, ev.state, ev.attempt, ev.reason, ev.at)

    async def advance(self, rec: MigrationRecord, state: JobState, attempt: int, reason: str, at: float) -> None:
        steps = rec.steps
        if not rec.target:  # an evacuation requeue: over once the attempt is requeued or failed
            if attempt > rec.attempt or (attempt == rec.attempt and state in TERMINAL):
                await self._finish(rec, "requeued", at, "" if state is JobState.PENDING else f"job {state}")
            return
        if state is JobState.MIGRATING and attempt == rec.attempt and "checkpointing" not in steps:
            rec.state, rec.steps = "checkpointing", {**steps, "checkpointing": at}
            await self.save(rec, "checkpointing")
        elif attempt == rec.attempt + 1 and state is JobState.PENDING and "restoring" not in steps:
            if reason.startswith("migrating: restoring"):
                rec.state, rec.steps = "restoring", {**steps, "restoring": at}
                await self.save(rec, "restoring")
            else:
                await self._finish(rec, "rolled_back", at, reason)
        elif attempt == rec.attempt + 1 and state is JobState.PLACED and "placed" not in steps:
            rec.steps = {**steps, "placed": at}
            await self.save(rec)
        elif attempt > rec.attempt and state is JobState.RUNNING:
            rec.steps = {**steps, "running": at}
            await self._finish(rec, "done", at)
        elif state in TERMINAL:
            await self._finish(rec, "rolled_back", at, f"job {state} during the move")
        elif attempt > rec.attempt + 1 and state is JobState.PENDING:
            await self._finish(rec, "rolled_back", at, reason)

    # -- the planning loop ---------------------------------------------------------------------------------
    async def loop(self) -> None:
        tick = min(1.0, self.deps.settings.migration_interval_s)
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=tick)
            self.kick.clear()
            if self.stop_event.is_set():
                break
            try:
                leading = await self._lead()
                if leading and not self.leading:
                    await self.resume()  # a new leader (a start, or a takeover): the records as they are now
                self.leading = leading
                if leading:
                    await self.run_once()
            except Exception:
                log.exception("migration planning failed; next round on the timer")

    async def _lead(self) -> bool:
        return await self.store.hold_lease(self.names.migration_leader_key, self.instance, LEASE_S)

    async def run_once(self) -> None:
        """Reconcile the moves under way; evacuate when GPU health changed (or on the period while GPUs stay
        bad); defragment on the period. Reads only what the round needs: in `rackscale up` this shares the
        event loop with the queue."""
        now = self.now()
        s = self.deps.settings
        known = await self.topology.get()
        bad = known is not None and bool(known[1].gpus)  # health lists only GPUs that aren't ok
        gen = self.topology.generation
        evac = bad and (gen != self.evac_gen or now - self.last_evac >= s.migration_interval_s)
        defrag = known is not None and s.defrag == "on" and now - self.last_defrag >= s.migration_interval_s
        offsets: dict[int, float] | None = None  # set when a rebalancing plan is due
        if known is not None and self.heat and now - self.last_rebalance >= s.migration_interval_s:
            self.last_rebalance = now
            offsets = self.heat_due(known[0], now)
        rebalance = offsets is not None
        if not (self.active() or evac or defrag or rebalance):
            return
        await self.jobs.read_active()
        jobs = self.jobs.records()  # read-only here
        await self.reconcile(jobs, now)
        if known is None:
            return
        consolidate = False
        if defrag:
            self.last_defrag = now
            consolidate = any(j.state is JobState.RUNNING and (_preferred(j) or _growable(j)) for j in jobs.values())
            defrag = any(j.state is JobState.PENDING and j.inflight_since is None for j in jobs.values())
        if not (evac or defrag or rebalance or consolidate):
            return
        topo, health = known
        allocations = await self.store.allocations()
        busy = {r.job_id for r in self.active()}
        if evac:
            self.evac_gen, self.last_evac = gen, now
            await self.evacuate(topo, health, allocations, jobs, busy, now)
        if defrag:
            await self.defragment(topo, health, allocations, jobs, busy, now)
        if consolidate:
            await self.reshape(topo, health, allocations, jobs, busy, now)
        if offsets is not None:
            await self.rebalance(topo, health, offsets, allocations, jobs, busy, now)

    async def reconcile(self, jobs: Mapping[str, JobRecord], now: float) -> None:
        """Moves whose job events this service missed (a restart) or whose step ran out of time."""
        timeout = self.deps.settings.migration_step_timeout_s
        self._hear(now)
        for rec in self.active():
            job = jobs.get(rec.job_id) or await self.store.get_job(rec.job_id)
            if job is None:
                await self._finish(rec, "rolled_back", now, "job unknown")
                continue
            await self.advance(rec, job.state, job.attempt, job.reason, now)
            if rec.state in FINAL:
                continue
            since = max(rec.steps.values(), default=rec.created_at)
            if not overdue(self.hearing, since, now, timeout):
                continue  # in time, or this service couldn't hear the step (its connection was down)
            if rec.state == "requested" and "abort" not in rec.steps:
                # the queue never took it (the job wasn't running any more): nothing to undo
                await self._finish(rec, "rolled_back", now, f"the queue didn't start the move within {timeout:g}s")
            elif rec.state == "checkpointing" and "abort" not in rec.steps:
                rec.steps, rec.error = {**rec.steps, "abort": now}, f"checkpoint not acknowledged in {timeout:g}s"
                await self.save(rec, "abort")
                abort = MoveAbort(migration_id=rec.id, job_id=rec.job_id, reason=rec.error, at=now)
                await self.bus.publish(self.names.job_move, abort, msg_id=f"move:{rec.id}:abort")
            elif rec.state == "restoring":
                # the pinned order went nowhere; the queue decides the job again by itself (never lost)
                await self._finish(
                    rec, "rolled_back", now, f"restore not running in {timeout:g}s; re-placed by the queue"
                )

    def _hear(self, now: float) -> None:
        """Look at the bus: a break (a disconnection, a reconnect) gives every step the whole timeout again."""
        self.hearing = observe(self.hearing, connected=self.bus.connected, epoch=self.bus.reconnects, now=now)

    def _budget(self, now: float) -> MigrationBudget:
        """Moves in flight and GPU-seconds of moving started in the last hour, against the settings."""
        s = self.deps.settings
        while self.spent and now - self.spent[0][0] > HOUR_S:
            self.spent.popleft()
        return MigrationBudget(
            max_moves=s.max_migrations,
            in_flight=len(self.active()),
            gpu_s_per_hour=s.migration_gpu_hours * HOUR_S,
            spent_gpu_s=sum(c for _, c in self.spent),
        )

    def _movable(self, jobs: Mapping[str, JobRecord], busy: set[str]) -> dict[str, Movable]:
        s = self.deps.settings
        return {
            j.id: Movable(record_spec(j), s.checkpoint_s, s.restore_s, _preferred(j))
            for j in jobs.values()
            if j.state is JobState.RUNNING and j.spec.checkpointable and j.id not in busy
        }

    async def evacuate(
        self,
        topo: Any,
        health: Health,
        allocations: list[Any],
        jobs: Mapping[str, JobRecord],
        busy: set[str],
        now: float,
    ) -> None:
        """Jobs on down or degraded GPUs of nodes still up: move them, or requeue the ones that can't move."""
        down: dict[int, int] = {}
        degraded: dict[int, int] = {}
        for (node, gpu), st in health.gpus.items():
            idx = topo.node_index.get(node)
            if idx is None or health.node(node) is NodeState.DOWN:
                continue  # a node that is down is the queue's node-loss path
            target = down if st is GpuState.DOWN else degraded
            target[idx] = target.get(idx, 0) | 1 << gpu
        if not down and not degraded:
            return
        # the state keeps failed GPUs in place (only node states apply), so the jobs holding them show up
        state = ClusterState(topo, Health(dict(health.nodes), {}))
        occupy_held(state, allocations, jobs, now)
        evac = plan_evacuation(state, down, self._movable(jobs, busy), self.policy, now, degraded=degraded)
        for mv in evac.moves:
            job = jobs.get(mv.job_id)
            if job is not None and job.state is JobState.RUNNING and mv.job_id not in busy:
                await self.begin(job, "evacuate", mv.reason, _target(mv, topo), mv.cost_gpu_s, 0.0, now)
                busy.add(mv.job_id)
        for job_id in evac.requeue:
            job = jobs.get(job_id)
            if job is None or job_id in busy or job.state not in (JobState.PLACED, JobState.RUNNING):
                continue
            why = evac.why.get(job_id, "on failed hardware")
            await self.begin(job, "evacuate", why, [], 0.0, 0.0, now)
            busy.add(job_id)

    async def defragment(
        self,
        topo: Any,
        health: Health,
        allocations: list[Any],
        jobs: Mapping[str, JobRecord],
        busy: set[str],
        now: float,
    ) -> None:
        s = self.deps.settings
        pending = _waiting(jobs)
        in_flight = len(self.active())
        if not pending or in_flight >= s.max_migrations:
            return
        if any(r.kind == "defrag" for r in self.active()):
            # one plan at a time: the state still shows the moving jobs on their old GPUs, so planning now
            # would free room the moves under way are about to free anyway (a staged plan goes on next round)
            return
        state = _held_state(topo, health, allocations, jobs, now)
        budget = self._budget(now)
        order: list[JobSpec] = [record_spec(j) for j in pending]
        promised = await self._promised(topo, {j.id for j in pending})
        plan = plan_defrag(state, order, self._movable(jobs, busy), self.policy, budget, now, promised=promised)
        if plan is None:
            return
        log.info("defragmentation for %s: %d moves (%s)", plan.beneficiary, len(plan.moves), plan.why)
        for mv in plan.moves:
            job = jobs.get(mv.job_id)
            if job is not None and job.state is JobState.RUNNING and mv.job_id not in busy:
                why = f"defragmentation for job {plan.beneficiary}: {plan.why}"
                await self.begin(job, "defrag", why, _target(mv, topo), mv.cost_gpu_s, plan.gain_gpu_s, now)
                busy.add(mv.job_id)

    async def reshape(
        self,
        topo: Any,
        health: Health,
        allocations: list[Any],
        jobs: Mapping[str, JobRecord],
        busy: set[str],
        now: float,
    ) -> None:
        """Move a flexible job running on a smaller segment onto its first-listed one (`plan_consolidation`), or
        else grow an elastic job below its most into free room (`plan_growth`; the policy's choice), when that
        pays. Not while another move is under way, nor while a waiting job fits the free room now: the queue's
        cycle is about to place it (the room is its)."""
        if self.active():
            return
        state = _held_state(topo, health, allocations, jobs, now)
        budget = self._budget(now)
        waiting = _waiting(jobs)
        for j in waiting[: budget.max_candidates]:
            try:
                req = request(record_spec(j), topo)
            except ShapeError:
                continue
            if self.policy.place(state, req, Context(now=now)) is not None:
                return
        promised = await self._promised(topo, {j.id for j in waiting})
        movable = self._movable(jobs, busy)
        kind = "consolidate"
        flexible = {j: m for j, m in movable.items() if m.preferred is not None}
        mv = plan_consolidation(state, flexible, self.policy, budget, now, SlowdownModel(), promised)
        if mv is None and self.policy.resizes:
            kind = "grow"
            elastic = {j: m for j, m in movable.items() if _growable(jobs[j])}
            mv = plan_growth(state, elastic, self.policy, budget, now, promised)
        job = jobs.get(mv.job_id) if mv is not None else None
        if mv is None or job is None or job.state is not JobState.RUNNING:
            return
        target = _target(mv, topo)
        rec = await self.begin(job, kind, mv.reason, target, mv.cost_gpu_s, 0.0, now, segment=mv.segment)
        log.info("%s: job %s (%s): %s", kind, job.id, rec.id, mv.reason)
        busy.add(mv.job_id)

    async def _promised(self, topo: Any, pending: set[str]) -> dict[str, frozenset[int]]:
        """The NVLink domains the queue's reservations hold, for the pending jobs among them."""
        shared = await self.store.reservations()
        if shared is None:
            return {}
        return {job: doms for job, doms in reserved_domains(shared, topo).items() if job in pending}

    def heat_due(self, topo: Any, now: float) -> dict[int, float] | None:
        """The domains' thermal offsets when a rebalancing plan is due: their spread has stayed past
        `rebalance_spread_c` for `rebalance_hold_s` (a passing spike moves nothing) and no rebalancing move
        is under way (one plan at a time); else None."""
        s = self.deps.settings
        fresh = now - 3 * max(s.telemetry_s, s.migration_interval_s)
        # each node's sums were taken as its telemetry came: a domain's are their sum (samples one by one, or a
        # ClusterState built here, held the event loop far longer: docs/performance.md, "Periodic work")
        by_domain: dict[int, HeatSums] = {}
        domain_of, index = topo.node_group[topo.domain], topo.node_index
        for node, (at, sums) in self.heat.items():
            if at >= fresh and (i := index.get(node)) is not None:
                d = domain_of[i]
                by_domain[d] = by_domain[d] + sums if d in by_domain else sums
        offsets = offsets_from_sums(by_domain)
        spread = max(offsets.values()) - min(offsets.values()) if len(offsets) > 1 else 0.0
        if spread < s.rebalance_spread_c:
            self.hot_since = None
            return None
        self.hot_since = self.hot_since if self.hot_since is not None else now
        if now - self.hot_since < s.rebalance_hold_s or any(r.kind == "rebalance" for r in self.active()):
            return None
        return offsets

    async def rebalance(
        self,
        topo: Any,
        health: Health,
        offsets: dict[int, float],
        allocations: list[Any],
        jobs: Mapping[str, JobRecord],
        busy: set[str],
        now: float,
    ) -> None:
        """Move load off the domain running hot (see `heat_due`) into the cool ones, cheapest jobs first."""
        s = self.deps.settings
        state = ClusterState(topo, health)
        occupy_held(state, allocations, jobs, now)
        moves = plan_rebalance(
            state,
            offsets,
            self._movable(jobs, busy),
            self.policy,
            self._budget(now),
            now,
            spread_c=s.rebalance_spread_c,
        )
        for mv in moves:
            job = jobs.get(mv.job_id)
            if job is not None and job.state is JobState.RUNNING and mv.job_id not in busy:
                await self.begin(job, "rebalance", mv.reason, _target(mv, topo), mv.cost_gpu_s, 0.0, now)
                busy.add(mv.job_id)

    async def begin(
        self,
        job: JobRecord,
        kind: str,
        why: str,
        target: list[NodeGpus],
        cost: float,
        gain: float,
        now: float,
        segment: int | None = None,
    ) -> MigrationRecord:
        """Record the move in JetStream first, then hand it to the queue."""
        rec = MigrationRecord(
            id=uuid.uuid4().hex[:16],
            job_id=job.id,
            tenant=job.spec.tenant,
            kind=kind,  # type: ignore[arg-type]
            why=why,
            attempt=job.attempt,
            source=list(job.allocation),
            target=target,
            created_at=now,
            steps={"requested": now},
            cost_gpu_s=cost,
            gain_gpu_s=gain,
            segment=segment or 0,
        )
        await self.save(rec, "requested")
        await self._send(rec)
        self.spent.append((now, cost))
        self.metrics.started.labels(kind).inc()
        self.metrics.gpu_seconds.inc(cost)
        where = ", ".join(f"{ng.node}:{','.join(map(str, ng.gpus))}" for ng in target) or "requeue"
        log.info("move %s: job %s attempt %d → %s (%s)", rec.id, job.id, job.attempt, where, why)
        return rec


def _held_state(
    topo: Any, health: Health, allocations: list[Any], jobs: Mapping[str, JobRecord], now: float
) -> ClusterState:
    """The GPUs held now as the queue's cycle sees them: placement's allocations, and orders on their way."""
    state = ClusterState(topo, health)
    held = occupy_held(state, allocations, jobs, now)
    for j in jobs.values():
        young = j.inflight_since is not None and now - j.inflight_since < INFLIGHT_S
        if j.state is JobState.PENDING and young and j.id not in held:
            occupy(state, j.id, j.allocation, j, now, preemptible=False)
    return state


def _waiting(jobs: Mapping[str, JobRecord]) -> list[JobRecord]:
    """The undecided jobs, in the order the planners try them: priority, then submit time, then id."""
    pending = (j for j in jobs.values() if j.state is JobState.PENDING and j.inflight_since is None)
    return sorted(pending, key=lambda j: (-j.spec.priority, j.submitted_at, j.id))


def _preferred(job: JobRecord) -> int | None:
    """A flexible job's first-listed segment while it runs on a smaller one (consolidation's candidates)."""
    first = next(iter(body_segments(job.spec)), None)
    return first if first is not None and job.segment is not None and job.segment < first else None


def _growable(job: JobRecord) -> bool:
    """An elastic job running below its most (growth's candidates)."""
    return job.spec.min_gpus is not None and sum(len(ng.gpus) for ng in job.allocation) < job.spec.gpus


def _target(mv: Move, topo: Any) -> list[NodeGpus]:
    return [NodeGpus(node, list(gpus)) for node, gpus in mv.gpus_by_node(topo).items()]
