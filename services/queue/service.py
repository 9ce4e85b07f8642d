"""queue: owns jobs. Durable intake, the job state machine's handlers, and the scheduling cycle.

The state machine itself is `shared.lifecycle`: each handler here reads the job, applies one of its pure
transitions, compares-and-sets the record and publishes (every transition is a JobEvent on the job's
subject, its audit log).

A job's event always goes out before the order that frees its GPUs, so the event log alone shows
who held which GPU when. Every handler is idempotent (at-least-once delivery): events for another
attempt than the job's current one are stale and ignored, except a Committed for a job still waiting,
which is adopted (the order went through after all). Records change only through `Store.update_job`
(a compare-and-set script), so replicas and concurrent handlers can't lose each other's writes. Only the replica
holding the leader lease runs cycles. The cycle itself is the pure core: `shared.core.Scheduler`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.js.errors

from services.queue.dry_run import reply_of
from services.queue.gate import Gate
from services.queue.rebuild import rebuild_view
from services.queue.usage import UsageKeeper
from shared import lifecycle
from shared.bus import Outgoing, Retry
from shared.core import Allocate, ClusterState, CycleConfig, JobSpec, Pending, Preempt, Reserve, Resize, Scheduler
from shared.core.dry_run import dry_run
from shared.core.eligibility import Sifted
from shared.held import HeldState, occupy, reserved_domains
from shared.held_view import HeldView
from shared.job_cache import CHANGES_LISTED, JobCache
from shared.jobs import body_segments, record_launch, record_spec
from shared.launch import master_port
from shared.liveness import Hearing, observe, overdue
from shared.runtime import Deps, Service, in_groups
from shared.schemas import (
    DRY_RUN_REQUEST,
    EVENTS,
    HOLDING,
    JOB_INTAKE,
    TERMINAL,
    CheckpointOrder,
    Committed,
    DryRunReply,
    DryRunRequest,
    JobCancel,
    JobRecord,
    JobState,
    JobSubmitted,
    MoveAbort,
    MoveOrder,
    NodeChanged,
    NodeGpus,
    PlaceOrder,
    RankExited,
    RankStarted,
    Rejected,
    Released,
    ReleaseOrder,
    Reservations,
    encode,
)
from shared.store import ViewMark, ViewNotReady
from shared.tenants import tenants_from_settings
from shared.topology_view import TopologyView
from shared.usage_store import UsageStore

log = logging.getLogger("rackscale.queue")

RESIZE_PREFIX = "resize-"  # the migration id of the cycle's own moves (`_resize`), watched by this service
INFLIGHT_TIMEOUT_S = 15.0  # an order with no answer this long is decided again (with a new attempt)
LEASE_S = 5.0
REBUILD_LOCK_S = 60.0  # a rebuild cut short (its replica died) is taken over after this
TOPOLOGY_MAX_AGE_S = 1.0  # a kicked cycle's topology may lag inventory this long (NodeChanged events cut it)
ANNOUNCED_KEPT = 10_000  # placed events remembered as published (so the running event needn't repeat them)


def _trace(rec: JobRecord) -> dict[str, str] | None:
    """Headers that keep a job's later orders (releases) in the job's trace."""
    return {"traceparent": rec.trace} if rec.trace else None


def _job(msg: Any) -> str:
    """Ordering key of the queue's messages (node events, which have no job, share one lane)."""
    return str(getattr(msg, "job_id", ""))


@dataclass(frozen=True, slots=True)
class RankStarts:
    """Rank starts of one attempt next to each other in the inbox (a gang's agents start together), handled as
    one: one record update and one event instead of one per rank. Not a message: the inbox's lanes make it."""

    starts: tuple[RankStarted, ...]

    @property
    def job_id(self) -> str:
        return self.starts[0].job_id


def _starts(a: Any, b: Any) -> RankStarts | None:
    """`Bus.consume`'s merge for the inbox: consecutive RankStarted of one job and attempt."""
    if not isinstance(b, RankStarted):
        return None
    starts = a.starts if isinstance(a, RankStarts) else (a,) if isinstance(a, RankStarted) else ()
    if not starts or (starts[0].job_id, starts[0].attempt) != (b.job_id, b.attempt):
        return None
    return RankStarts((*starts, b))


@contextlib.contextmanager
def _redelivered_if_early() -> Iterator[None]:
    """An input that came before one it depends on (`lifecycle.NotYet`) is redelivered later (`Retry`)."""
    try:
        yield
    except lifecycle.NotYet as e:
        raise Retry(str(e)) from e


CYCLE_WRITES_AT_ONCE = 64  # a cycle's orders and reasons in flight at once (each its own job's round trips)


class QueueService(Service):
    name = "queue"

    def __init__(self, deps: Deps, config: CycleConfig | None = None) -> None:
        super().__init__(deps)
        tenants = tenants_from_settings(deps.settings)  # quotas and weights (RACKSCALE_TENANTS_FILE)
        pin_aware = deps.settings.pin_aware  # the cycle places for the migration planner while it defragments
        default = CycleConfig(
            policy=deps.settings.policy,
            tenants=tenants,
            pin_aware=pin_aware,
            lend_checkpointable=deps.settings.lend_checkpointable,  # RACKSCALE_LEND_RESERVED
            lend_min_nodes=deps.settings.lend_min_nodes,
        )
        self.scheduler = Scheduler(config or default)
        self._shared_reservations: Reservations | None = None  # as last written (its `at` aside)
        # the scheduler's memory was taken over from the last leader's (`_take_over`): False until this replica
        # leads, and again whenever it loses the lease (another leader's cycles move on without it)
        self._taken_over = False
        self.kick = asyncio.Event()
        self.timer_clock: Callable[[], float] = time.monotonic  # when full cycles are due (tests step it)
        # a kick from the bus (another replica wrote a job this one may not know): the next kicked cycle asks
        # the store for the undecided ids; its own kicks decide on what this replica wrote (no round trip)
        self._foreign = True
        self._kicks_out: set[asyncio.Task[None]] = set()
        # jobs this replica ended whose GPUs may not be released yet: they still count for their tenant's quota
        self._ended: dict[str, JobRecord] = {}
        self.instance = uuid.uuid4().hex[:12]
        self.cycles = 0
        self._topo = TopologyView(deps.store)
        self.gate = Gate(deps.store, deps.bus.js, deps.names)  # dependencies, singletons, arrays' %N (gate.py)
        self.jobs = JobCache(deps.store)  # the records this replica last read or wrote: decided on without a read
        self.held = HeldView()  # allocations as placement's events tell them (full reads on the timer)
        self._held_state = HeldState()  # the cycle's state of held GPUs, kept between cycles
        self._unsynced: set[str] | None = None  # jobs changed since its last sync (None: any; the first is full)
        self._lease_trusted_until = 0.0  # monotonic time until which the leader lease is surely ours
        # attempts whose placed event this process has published (acked): their running event needn't repeat it
        self._announced: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._view_mark: ViewMark | None = None  # the furthest position this process saw the view at
        self._view_ready = True  # False while another replica rebuilds the view: nothing is decided on it
        # since when placement's answers could be heard without a break: an order's silence counts from there
        self.hearing = Hearing(since=0.0)
        self._deciding = asyncio.Lock()  # a dry run decides on a cycle's inputs between cycles, never amid one
        # the usage view and the decayed usage the cycle orders tenants by, while this replica leads
        self.usage = UsageKeeper(deps.bus, UsageStore(deps.store.r, deps.names), deps.settings.usage_half_life_s)

    async def start(self) -> None:
        n, stop = self.names, self.stop_event
        self.hearing = Hearing(since=self.now(), epoch=self.bus.reconnects)
        self.bus.on_link(lambda _up: self._hear(self.now()))
        with contextlib.suppress(Exception):  # else at the first full cycle (Redis may not answer yet)
            await self.ensure_view()
        # one lane per job: a job's messages in order, different jobs' concurrently
        for what, subject in (("submit", n.job_submit), ("cancel", n.job_cancel), ("move", n.job_move)):
            consumer = self.bus.consume(
                subject, n.consumer(self.name, what), JOB_INTAKE, self.on_intake, stop, key=_job
            )
            self.spawn(consumer, what)
        # placement's and the agents' messages as one inbox: a job's in the order they were stored
        # (a gang's rank starts, heard together, are recorded in one update: `_starts`)
        for what, subject in (("inbox", n.job_inbox), ("node", n.node_events)):
            consumer = self.bus.consume(
                subject, n.consumer(self.name, what), EVENTS, self.on_event, stop, key=_job, merge=_starts
            )
            self.spawn(consumer, what)
        await self.bus.nc.subscribe(n.cycle_kick, cb=self._on_kick)
        await self.bus.subscribe(n.dry_run, DRY_RUN_REQUEST, self._on_dry_run)  # every replica: the leader answers
        self.spawn(self.cycle_loop(), "cycle")
        self.spawn(self.usage.run(self._led_lately, stop, self.deps.settings.cycle_interval_s, self.now), "usage")

    async def _on_kick(self, _msg: Any) -> None:
        self._foreign = True
        self.kick.set()

    def wake(self) -> None:
        """Run a cycle soon. A replica that isn't the leader (as far as it knows) also tells the leader over the
        bus, since its writes aren't in the leader's memory; core NATS, so a lost kick costs one timer period."""
        self.kick.set()
        if self._surely_leading():
            return
        task = asyncio.ensure_future(self._kick_leader())
        self._kicks_out.add(task)
        task.add_done_callback(self._kicks_out.discard)

    async def _update(
        self, job_id: str, change: Callable[[JobRecord], JobRecord | None]
    ) -> tuple[JobRecord | None, bool]:
        """`Store.update_job` with a transition of `shared.lifecycle`, keeping the record of a job this replica
        ended until its GPUs are released. An input that came before one it depends on is redelivered later."""
        before: list[JobState] = []  # the state the recorded change started from (its last try)

        def tracked(r: JobRecord) -> JobRecord | None:
            before.append(r.state)
            return change(r)

        with _redelivered_if_early():
            rec, changed = await self.jobs.update(job_id, tracked)
        if changed and rec is not None and rec.state in TERMINAL and before[-1] not in TERMINAL:
            self._ended[rec.id] = rec  # (a late rank exit recorded on an ended job is not an end)
        return rec, changed

    async def _kick_leader(self) -> None:
        try:
            await self.bus.nc.publish(self.names.cycle_kick, b"")
        except Exception as e:  # the leader's timer is the fallback
            log.warning("could not kick the leader's cycle: %s", e)

    # -- events out ----------------------------------------------------------------------------------------
    def event(self, rec: JobRecord, headers: Mapping[str, str] | None = None) -> Outgoing:
        """The record's current state as its JobEvent; msg-id dedup makes repeats (redeliveries) harmless."""
        event = lifecycle.event_of(rec)
        hdrs = dict(headers or {})
        if rec.trace and "traceparent" not in hdrs:
            hdrs["traceparent"] = rec.trace
        return Outgoing(self.names.job_event(rec.id), event, f"{rec.id}:{rec.state}:{rec.attempt}", hdrs)

    async def emit(self, rec: JobRecord, headers: Mapping[str, str] | None = None) -> None:
        """Publish the record's current state."""
        await self.bus.publish_all([self.event(rec, headers)])

    async def release(self, rec: JobRecord, reason: str, checkpoint: bool = False, stop_ranks: bool = True) -> None:
        await self.bus.publish(
            self.names.orders,
            ReleaseOrder(
                job_id=rec.id,
                reason=reason,
                checkpoint=checkpoint,
                stop_ranks=stop_ranks,
                cause=lifecycle.stop_cause(rec),
            ),
            msg_id=f"{rec.id}:{rec.attempt}:release:{rec.state}",
            headers=_trace(rec),
        )

    # -- intake --------------------------------------------------------------------------------------------
    async def on_intake(
        self, msg: JobSubmitted | JobCancel | MoveOrder | MoveAbort, headers: Mapping[str, str]
    ) -> None:
        if isinstance(msg, JobSubmitted):
            await self.on_submit(msg, headers)
        elif isinstance(msg, JobCancel):
            await self.on_cancel(msg)
        elif isinstance(msg, MoveOrder):
            await self.on_move(msg)
        else:
            await self.on_move_abort(msg)

    async def on_submit(self, msg: JobSubmitted, headers: Mapping[str, str]) -> None:
        if msg.spec.array is not None:
            await self._submit_array(msg, headers)
            return
        rec = lifecycle.submitted(msg, self.now(), headers.get("traceparent", ""))
        stored, _ = await self.jobs.create(rec)  # a redelivery finds the job stored: nothing changes
        # The event goes out also on redelivery (it may not have gone out). Its PUB is on the wire before the
        # kicked cycle runs, so it precedes every later event of the job; the cycle needn't wait for its ack.
        emitted = asyncio.create_task(self.emit(stored, headers))
        self.wake()
        await emitted

    async def _submit_array(self, msg: JobSubmitted, headers: Mapping[str, str]) -> None:
        """An array's submit: a record and a pending event for each of its tasks (`lifecycle.submitted_jobs`).
        The array's index of task ids is written after every task's record, so whoever finds the array (the
        gateway, to read, cancel or depend on it) finds all of its tasks; until then its id is "not recorded
        yet", as a job's is. A redelivery writes what is missing and announces every task again (msg ids dedupe)."""
        recs = lifecycle.submitted_jobs(msg, self.now(), headers.get("traceparent", ""))
        if not recs:
            log.error("job %s: array %r doesn't parse; the submit is dropped", msg.job_id, msg.spec.array)
            return

        async def create(rec: JobRecord) -> None:
            stored, _ = await self.jobs.create(rec)
            # Each task's pending event leaves as soon as its record is stored, before this coroutine yields: a
            # cycle already running may decide on the task from then on, and its placed event must come after.
            # (Announcing the tasks only once all are stored let an early task be placed before its pending.)
            await self.emit(stored, headers)

        await in_groups([create(r) for r in recs], CYCLE_WRITES_AT_ONCE)
        await self.store.index_array(msg.job_id, [r.id for r in recs])
        self.wake()

    async def on_cancel(self, msg: JobCancel) -> None:
        now = self.now()
        rec, changed = await self._update(msg.job_id, lambda r: lifecycle.cancelled(r, msg, now))
        if rec is None:
            await self._cancel_array(msg)
            return
        if rec.state is JobState.CANCELLED:
            # the event goes out before the release, so the log never shows a GPU freed before it is
            await self.emit(rec)
            # release even if nothing is held: an order may be in flight (idempotent at placement)
            await self.release(rec, msg.reason)
        if changed:
            self.wake()

    async def _cancel_array(self, msg: JobCancel) -> None:
        """A cancel naming an array (no job has its id): every task of it that hasn't ended. (The array's index is
        written after its tasks: a task found missing is one no rebuild has written back yet; it comes back.)"""
        tasks = await self.store.array_task_ids(msg.job_id)
        if not tasks:
            return
        await in_groups(
            [self.on_cancel(JobCancel(job_id=t, at=msg.at, reason=msg.reason)) for t in tasks], CYCLE_WRITES_AT_ONCE
        )
        if len(await self.store.get_jobs(tasks)) < len(tasks):
            raise Retry(f"array {msg.job_id}: not every task is recorded yet")

    # -- events in -----------------------------------------------------------------------------------------
    async def on_event(self, ev: Any, headers: Mapping[str, str]) -> None:
        if isinstance(ev, Committed):
            await self.on_committed(ev, headers)
        elif isinstance(ev, Rejected):
            await self.on_rejected(ev)
        elif isinstance(ev, Released):
            self.held.released(ev)
            if (ended := self._ended.get(ev.job_id)) is not None and ended.attempt == ev.attempt:
                del self._ended[ev.job_id]
            self.wake()  # GPUs came free
        elif isinstance(ev, RankStarted):
            await self.on_started(ev)
        elif isinstance(ev, RankStarts):
            await self.on_starts(list(ev.starts))
        elif isinstance(ev, RankExited):
            await self.on_exited(ev)
        elif isinstance(ev, NodeChanged):
            await self.on_node(ev)

    async def on_committed(self, ev: Committed, headers: Mapping[str, str]) -> None:
        self.held.committed(ev)
        now = self.now()
        domains = await self._domains([ng.node for ng in ev.nodes])
        rec, _ = await self._update(ev.job_id, lambda r: lifecycle.placed(r, ev, domains, now))
        if rec is None:
            return
        if rec.state in TERMINAL or rec.attempt != ev.attempt:
            # cancelled (or requeued) while the order was out: give the GPUs back
            await self.bus.publish(
                self.names.orders,
                # only that attempt's GPUs: by now the job may hold a newer attempt's
                ReleaseOrder(
                    job_id=rec.id,
                    reason=f"job is {rec.state}",
                    only_attempt=ev.attempt,
                    cause=lifecycle.stop_cause(rec) if rec.state in TERMINAL else lifecycle.PREEMPTED,
                ),
                msg_id=f"{rec.id}:{ev.attempt}:release:stale",
                headers=_trace(rec),
            )
            return
        if rec.state in (JobState.PLACED, JobState.RUNNING):
            # the placed event, also on redelivery (it may not have gone out); a running job's own event is
            # on_started's (msg ids dedupe the repeat)
            await self.emit(msgspec.structs.replace(rec, state=JobState.PLACED), headers)
            self._announce((rec.id, rec.attempt))

    def _announce(self, key: tuple[str, int]) -> None:
        self._announced[key] = None
        while len(self._announced) > ANNOUNCED_KEPT:
            self._announced.popitem(last=False)

    async def on_rejected(self, ev: Rejected) -> None:
        now = self.now()
        _, changed = await self._update(ev.job_id, lambda r: lifecycle.rejected(r, ev, now))
        if changed:
            self.wake()

    async def on_started(self, ev: RankStarted) -> None:
        await self.on_starts([ev])

    async def on_starts(self, evs: list[RankStarted]) -> None:
        """Ranks of one attempt started (one, or a gang's heard together)."""
        now = self.now()
        rec, changed = await self._update(evs[0].job_id, lambda r: lifecycle.started_all(r, evs, now))
        if rec is None or not changed or rec.state is not JobState.RUNNING:
            return
        key = (rec.id, rec.attempt)
        out = [self.event(rec)]
        if key not in self._announced:
            # The placed event goes first unless this process saw it acked: the commit may have been handled
            # by another replica (replicas share the inbox), by a process that crashed before publishing it,
            # or not yet (another replica's handler wrote PLACED and is about to publish). The stream's msg-id
            # dedup drops the repeat. Both PUBs leave in order on one connection, so the log keeps the order
            # without waiting twice.
            out.insert(0, self.event(msgspec.structs.replace(rec, state=JobState.PLACED)))
        await self.bus.publish_all(out)
        self._announced.pop(key, None)

    async def on_exited(self, ev: RankExited) -> None:
        if ev.checkpointed:
            await self.on_checkpointed(ev)
            return
        if ev.lost and ev.exit_code != 0:
            rec = await self.store.get_job(ev.job_id)
            if rec is not None:
                with _redelivered_if_early():
                    lifecycle.commit_seen(rec, ev.attempt)
                await self._lose(ev.job_id, ev.attempt, ev.node, lifecycle.lost_reason(ev))
            return
        now = self.now()

        before: list[JobState] = []  # the state the recorded change started from (the last try of it)

        def change(r: JobRecord) -> JobRecord | None:
            before.append(r.state)
            return lifecycle.exited(r, ev, now)

        rec, changed = await self._update(ev.job_id, change)
        late = changed and before[-1] in TERMINAL  # a rank of a job that had ended: its exit recorded, no more
        ended = rec is not None and rec.state in (JobState.SUCCEEDED, JobState.FAILED) and rec.attempt == ev.attempt
        # (a redelivered exit of an ended job emits and releases again: the first handling may have died before)
        if ended and not late:
            await self.emit(rec)
            # a job that ended on its own has no rank left to stop (one rank's failure may leave others running)
            await self.release(rec, f"job {rec.state}", stop_ranks=len(rec.exit_codes) < len(rec.allocation))
            self.wake()

    async def on_node(self, ev: NodeChanged) -> None:
        self._topo.invalidate()
        if ev.state != "down":
            self.wake()
            return
        for rec in await self.store.active_jobs():
            if rec.state not in HOLDING:
                continue
            if any(ng.node == ev.node for ng in rec.allocation):
                await self._lose(rec.id, rec.attempt, ev.node, f"node {ev.node} went down: {ev.reason}")
        self.wake()

    async def _lose(self, job_id: str, attempt: int, node: str, reason: str) -> None:
        """A placed/running attempt lost a node under it: requeue it, or fail it by its on_node_failure."""
        now = self.now()
        new, changed = await self._update(job_id, lambda r: lifecycle.node_lost(r, attempt, reason, now))
        if new is not None and changed:
            await self.emit(new)
            await self.bus.publish(
                self.names.orders,
                ReleaseOrder(job_id=job_id, reason=f"node {node} lost" if node else reason, cause=lifecycle.NODE_LOST),
                msg_id=f"{job_id}:{attempt}:release:node",
                headers=_trace(new),
            )
            self.wake()

    # -- the cycle -----------------------------------------------------------------------------------------
    async def cycle_loop(self) -> None:
        """A cycle on every kick, and a full one (see `run_cycle`) every period: kicks that keep coming don't
        put the timer's off, or the views and the reservations' forecasts would never be put right."""
        interval = self.deps.settings.cycle_interval_s
        clock = self.timer_clock
        next_full = clock() + interval
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=max(0.0, next_full - clock()))
            full = clock() >= next_full
            if full:
                next_full = clock() + interval
            self.kick.clear()
            if self.stop_event.is_set():
                break
            try:
                if full and not await self.ensure_view():
                    continue  # another replica rebuilds the view: nothing is decided on it meanwhile
                if self._view_ready and await self._lead():
                    async with self._deciding:
                        await self.run_cycle(full=full)
            except ViewNotReady as e:  # found behind or closed mid-cycle: the next full cycle catches it up
                log.warning("scheduling cycle cut short: %s", e)
                self._view_ready = False
                next_full = clock()
            except Exception:
                log.exception("scheduling cycle failed; next one on the timer")

    # -- the view: rebuilt from the log when Redis came back empty or behind ----------------------------------
    async def ensure_view(self) -> bool:
        """Whether the view may be decided on; first rebuilds it from the log if Redis came back empty (no view),
        or catches it up if it came back behind (its position below the one this process saw it at: a replica
        promoted before it caught up), or finishes a rebuild cut short. One replica rebuilds (a lock); the
        others wait. A ready view's position is recorded on the way (the queue's consumers' ack floors)."""
        state, mark = await self.store.view_status()
        seen = self._view_mark
        behind = (
            mark is not None
            and seen is not None
            and (mark.events_seq < seen.events_seq or mark.jobs_seq < seen.jobs_seq)
        )
        if state == "ready" and not behind:
            self._view_ready = True
            await self._record_view()
            return True
        self._view_ready = False
        if not await self.store.hold_lease(self.names.view_lock_key, self.instance, REBUILD_LOCK_S):
            return False
        log.warning("the view is %s: rebuilding it from the log", "behind the log" if state == "ready" else state)
        await self.store.close_view()
        since = None if state == "missing" else mark
        done = await rebuild_view(self.bus, self.store, since, self.now())
        self._view_mark = done.mark
        self._forget_views()
        self._view_ready = True
        self.wake()
        return True

    async def _record_view(self) -> None:
        """Record how far the view is complete: everything the queue's submit and inbox consumers acked is in it
        (a handler writes before it acks; the queue's own JobEvents follow their writes)."""
        n, js = self.names, self.bus.js
        try:
            submit = await js.consumer_info(n.stream_for(n.job_submit), n.consumer(self.name, "submit"))
            inbox = await js.consumer_info(n.stream_for(n.job_inbox), n.consumer(self.name, "inbox"))
        except nats.js.errors.NotFoundError:
            return  # the consumers aren't there yet: nothing consumed, nothing to record
        mark = ViewMark(jobs_seq=submit.ack_floor.stream_seq, events_seq=inbox.ack_floor.stream_seq)
        await self.store.see_view_clock()  # after the floors: it covers every write of what they count as done
        if not await self.store.record_view(mark):
            return  # the view went behind (or is rebuilt): the next cycle catches it up
        seen = self._view_mark or ViewMark()
        self._view_mark = ViewMark(max(seen.jobs_seq, mark.jobs_seq), max(seen.events_seq, mark.events_seq))

    def _hear(self, now: float) -> None:
        """A bus outage is not placement's silence: an order in flight gets its whole timeout after it."""
        self.hearing = observe(self.hearing, connected=self.bus.connected, epoch=self.bus.reconnects, now=now)

    def _forget_views(self) -> None:
        """After a rebuild, what this process kept of the old view is no guide: read everything afresh."""
        self.jobs.forget()
        self.held = HeldView()
        self._held_state = HeldState()
        self._unsynced = None
        self._ended = {}
        self._announced.clear()
        self._taken_over = False

    async def _lead(self) -> bool:
        """Hold (or take) the leader lease: one queue replica runs cycles at a time. A lease renewed less than
        a third of its time ago is held for two thirds more: no round trip for it."""
        if self._surely_leading():
            return True
        mono = time.monotonic()
        held = await self.store.hold_lease(self.names.queue_leader_key, self.instance, LEASE_S)
        self._lease_trusted_until = mono + LEASE_S / 3 if held else 0.0
        if not held:
            self._taken_over = False
        return held

    def _led_lately(self) -> bool:
        """The lease was ours at its last renewal, less than a lease ago (no round trip): the usage view follows the
        cycle's leader, and never takes the lease itself."""
        return time.monotonic() < self._lease_trusted_until + LEASE_S * 2 / 3

    def _surely_leading(self) -> bool:
        """The lease was renewed recently enough to be ours without asking (see `_lead`)."""
        return time.monotonic() < self._lease_trusted_until

    async def _topology(self) -> tuple[Any, Any] | None:
        """The core's topology and health from inventory's records; None until a node registers. Asks for
        `topo:gen` at most every TOPOLOGY_MAX_AGE_S unless a NodeChanged came (`on_node` invalidates)."""
        return await self._topo.get(max_age_s=TOPOLOGY_MAX_AGE_S)

    async def _domains(self, nodes: list[str]) -> list[str]:
        known = self._topo.last() or await self._topology()  # node → domain: a lagging view is fine here
        if known is None:
            return []
        topo = known[0]
        seen: dict[str, None] = {}
        for name in nodes:
            idx = topo.node_index.get(name)
            if idx is not None:
                seen.setdefault(topo.group_names[topo.domain][topo.node_group[topo.domain][idx]])
        return list(seen)

    async def run_cycle(self, *, full: bool = True) -> None:
        """One scheduling cycle. The timer's cycles (`full`) read every active job and allocation, so an order
        in flight past its timeout is taken back within a period and the views below are put right. A kicked
        cycle decides on what this replica keeps: the job records it wrote or read (`JobCache`)
        and the allocations placement's events told it (`HeldView`); only after a kick from another replica
        (`wake`) does it also ask for the ids of the undecided jobs (one SMEMBERS). A stale view costs a
        rejected order at worst: the commit script checks every GPU."""
        now = self.now()
        self._hear(now)
        self.cycles += 1
        if full or not self.held.complete:
            self._foreign = False  # the full read below covers every replica's writes
            since = self.held.mark()
            await self.jobs.read_active()  # the kept records are exactly the active jobs now
            self.held.replace(await self.store.allocations(), since)
            holding = self.held.by_job()
            self._ended = {j: r for j, r in self._ended.items() if j in holding}
            await self._resend_stuck_resizes(now)
        else:
            foreign, self._foreign = self._foreign, False
            if foreign and (unknown := await self.store.undecided_job_ids() - self.jobs.ids()):
                await self.jobs.read(unknown)  # another replica's
        if not self.jobs.has_pending():
            return  # most kicks (exits, releases, heartbeats' changes) leave nothing to decide: skip the reads
        self._note_changes()
        known = await self._topology()
        if known is None:
            return  # no GPU node has registered yet: jobs keep waiting with their intake reason
        topo = known[0]
        state, jobs, undecided, late = self._cycle_inputs(now)
        for rec in late:
            await self._expire_inflight(rec, now)
        # dependencies, singletons and arrays' %N hold jobs out of the cycle (they never block the others)
        sifted = await self.gate.sift(undecided, self.jobs.view(), self.held.by_job())
        await self._hold_back(sifted, jobs, now)
        pending: list[JobSpec] = [record_spec(undecided[j]) for j in sifted.eligible]
        if not pending:
            return
        if not self._taken_over:
            await self._take_over(topo)
        usage = self.usage.shares(now, {spec.tenant for spec in pending})  # fair share's memory (None: none yet)
        # a kicked cycle keeps last cycle's reservations while they hold; the timer's forecasts them anew
        result = self.scheduler.cycle(state, pending, now, usage, reuse_forecasts=not full)
        blocked: set[str] = set()  # jobs whose victims could not be moved out: their GPUs aren't free
        writes: list[Coroutine[Any, Any, None]] = []  # each of one job: sent together once the decisions are read
        for d in result.decisions:
            if isinstance(d, Allocate):
                if d.job_id in blocked:
                    continue  # decided again next cycle, from the state as it is then
                writes.append(self._order(jobs[d.job_id], d, topo, now))
            elif isinstance(d, Preempt):
                if not await self._preempt(d, now):
                    blocked.add(d.for_job)
                    self.wake()
            elif isinstance(d, Resize):
                # the job it makes room for is decided again once the resize gave the GPUs back
                await self._resize(d, topo, now)
                blocked.add(d.for_job)
            # most cycles change no reason: skip those round trips
            elif isinstance(d, Pending | Reserve) and jobs[d.job_id].reason != d.reason:
                writes.append(self._set_reason(d.job_id, d.reason, now))
        # a burst's hundred orders overlap their round trips; after a failure the rest are decided again next cycle
        await in_groups(writes, CYCLE_WRITES_AT_ONCE)
        await self._share_reservations(topo, now)

    def _cycle_inputs(
        self, now: float
    ) -> tuple[ClusterState, dict[str, JobRecord], dict[str, JobRecord], list[JobRecord]]:
        """What a cycle decides on (the dry run too, so both decide on the same): the state of held GPUs, the
        pending records (kept as they are now: the decisions await), the records to decide (before the gate's
        sift) and the records whose order is overdue (`_expire_inflight`). Call `_note_changes` first.

        Only the jobs whose allocation or record changed since the last sync are applied (`HeldState`); the ids
        were noted before this view is read, so none changes unnoticed. The view is live (no copy of every active
        job) and the same record objects from cycle to cycle while a job doesn't change (`HeldState` compares by
        identity); nothing awaits here."""
        allocations = self.held.by_job()
        state = self._held_state.sync(
            self._topo.base_state(), allocations, self.jobs.view(), now, self._ended, self._unsynced
        )
        self._unsynced = set()
        jobs = self.jobs.pending()
        held = {job_id for job_id in jobs if job_id in allocations}  # as synced (`allocations` is live)
        undecided: dict[str, JobRecord] = {}
        late: list[JobRecord] = []
        for rec in jobs.values():
            if rec.id in held:
                continue  # committed, its Committed event not handled yet (or a release on its way)
            if rec.inflight_since is not None:
                if not overdue(self.hearing, rec.inflight_since, now, INFLIGHT_TIMEOUT_S):
                    # its order is on its way
                    occupy(state, rec.id, rec.allocation, rec, now, preemptible=False)
                else:
                    late.append(rec)
                continue
            undecided[rec.id] = rec
        return state, jobs, undecided, late

    # -- dry runs (services/queue/dry_run.py) ----------------------------------------------------------------
    async def _on_dry_run(self, req: DryRunRequest, msg: Any) -> None:
        """Only the leader answers; another replica stays silent (the gateway hears the leader or nobody)."""
        if not msg.reply or not (self._view_ready and await self._lead()):
            return
        try:
            reply = await self.dry_run(req)
        except Exception as e:
            log.exception("dry run of job %s failed", req.job_id)
            reply = DryRunReply(ok=False, error=f"the queue leader could not decide: {e}")
        await msg.respond(encode(reply))

    async def dry_run(self, req: DryRunRequest) -> DryRunReply:
        """Where the job would go if it were submitted now: the next cycle's decision on what this replica holds
        (read as a kicked cycle reads it), with nothing stored or published."""
        async with self._deciding:
            now = self.now()
            if not self.held.complete:  # as a cycle would: one full read first
                since = self.held.mark()
                await self.jobs.read_active()
                self.held.replace(await self.store.allocations(), since)
            elif self._foreign and (unknown := await self.store.undecided_job_ids() - self.jobs.ids()):
                await self.jobs.read(unknown)  # another replica's (the next cycle reads them too)
            submitted = JobSubmitted(job_id=req.job_id, spec=req.spec, submitted_at=req.submitted_at)
            # an array's first task stands for the array: its tasks differ only in their index
            first = lifecycle.submitted_jobs(submitted, now)[0]
            candidate = record_spec(first)
            known = await self._topology()
            if known is None:
                return DryRunReply(
                    ok=True, gpus=candidate.gpus, reason=f"{lifecycle.INTAKE_REASON}: no GPU node has registered yet"
                )
            topo = known[0]
            if not self._taken_over:
                await self._take_over(topo)
            self._note_changes()
            state, _, undecided, _ = self._cycle_inputs(now)
            # the gate's verdicts as the next cycle would give them, the job among the waiting ones
            sifted = await self.gate.sift({**undecided, first.id: first}, self.jobs.view(), self.held.by_job())
            if first.id in sifted.doomed:
                return DryRunReply(ok=True, start="never", gpus=candidate.gpus, reason=sifted.doomed[first.id])
            if first.id in sifted.held:
                return DryRunReply(ok=True, start="later", gpus=candidate.gpus, reason=sifted.held[first.id])
            pending = [record_spec(undecided[j]) for j in sifted.eligible if j != first.id]
            usage = self.usage.shares(now, {spec.tenant for spec in pending} | {candidate.tenant})
            got = dry_run(self.scheduler, state, pending, candidate, now, usage, reuse_forecasts=True)
            return reply_of(got, topo, candidate)

    def _note_changes(self) -> None:
        """Collect the ids of the jobs whose record or allocation changed since the last look (None: too many to
        list), for the next `HeldState.sync`: a cycle that returns before it loses none."""
        changed, dirty = self.jobs.take_changed(), self.held.take_dirty()
        if self._unsynced is None or changed is None or len(self._unsynced) > CHANGES_LISTED:
            self._unsynced = None
        else:
            self._unsynced |= changed | dirty

    async def _share_reservations(self, topo: Any, now: float) -> None:
        """Write the scheduler's memory for the migration planner and the next leader, when it changed (most
        cycles reserve the same domains again, or none)."""
        names = topo.group_names[topo.domain]
        sched = self.scheduler
        memory = Reservations(
            at=now,
            domains={job: sorted(names[d] for d in doms) for job, doms in sched.promised.items()},
            reserved=sorted(sched.reserved),
            lent={b: sorted(lenders) for b, lenders in sched.lent.items()},
        )
        last = self._shared_reservations
        if last is not None and msgspec.structs.replace(last, at=now) == memory:
            return
        await self.store.put_reservations(memory)
        self._shared_reservations = memory

    async def _take_over(self, topo: Any) -> None:
        """A replica that has just become leader starts from the last leader's memory (sticky reservations'
        domains, reserved jobs, borrowers), so a failover neither moves the reservations nor strands loans.
        Domains unknown to this topology are dropped; ended jobs fall out in the next cycle."""
        self._taken_over = True
        memory = await self.store.reservations()
        if memory is None:
            return
        sched = self.scheduler
        sched.promised = reserved_domains(memory, topo)
        sched.reserved = frozenset(memory.reserved)
        sched.lent = {b: frozenset(lenders) for b, lenders in memory.lent.items()}
        self._shared_reservations = memory

    def _place_order(self, rec: JobRecord, now: float) -> PlaceOrder:
        """The order for the record's in-flight attempt; a job with a checkpoint restores from it and runs
        only what is left of its duration. It carries what the launch contract tells every process
        (shared/launch.py): the body's launch settings, each node's domain and segment, the rendezvous port."""
        nodes = rec.allocation
        domain_of = self._topo.domain_of
        per_segment = rec.segment or next(iter(body_segments(rec.spec)), 0)
        return PlaceOrder(
            job_id=rec.id,
            attempt=rec.attempt,
            nodes=nodes,
            master_addr=self._topo.addr_of.get(nodes[0].node, nodes[0].node),
            command=list(rec.spec.command),
            duration_s=max(0.0, rec.spec.duration_s - rec.ran_s),
            decided_at=now,
            restore=rec.checkpoint,
            launch=record_launch(rec),
            domains=[domain_of.get(ng.node, "") for ng in nodes],
            segments=[i // per_segment if per_segment else 0 for i in range(len(nodes))],
            master_port=master_port(rec.id, rec.attempt),
            segment=per_segment,
        )

    async def _order(self, rec: JobRecord, d: Allocate, topo: Any, now: float) -> None:
        nodes = [NodeGpus(n, list(g)) for n, g in d.gpus_by_node(topo).items()]
        attempt = rec.attempt + 1

        laid_out = msgspec.structs.replace(rec, attempt=attempt, allocation=nodes, segment=d.segment)
        order = self._place_order(laid_out, now)
        parent = {"traceparent": rec.trace} if rec.trace else None
        attrs = {
            "rackscale.job_id": rec.id,
            "rackscale.policy": self.scheduler.config.policy,
            "rackscale.domains": ",".join(d.groups(topo)),
            "rackscale.queue_wait_s": max(0.0, now - rec.submitted_at),
            "rackscale.attempt": attempt,
        }
        with self.tracer.span("queue.decide", parent, attrs):
            hdrs = self.tracer.headers()
            # The order goes out with the record's in-flight mark, not after it (one wait instead of two). Its
            # commit may overtake the mark: on_committed and on_started adopt it, and the mark then finds the
            # job placed and changes nothing. A job cancelled meanwhile gets its commit given back
            # (on_committed). A crash between the two leaves the job undecided: decided again, its newer order
            # is rejected (the job holds GPUs for this attempt, which on_committed adopts).
            await asyncio.gather(  # the order first: it is on the path to the job's start, the mark isn't
                self.bus.publish(self.names.orders, order, msg_id=f"{rec.id}:{attempt}:place", headers=hdrs),
                self._update(rec.id, lambda r: lifecycle.ordered(r, rec.attempt, nodes, now, d.segment)),
            )

    async def _expire_inflight(self, rec: JobRecord, now: float) -> None:
        held = await self.store.allocation(rec.id)
        if held is not None:
            return  # committed; the Committed event is on its way
        attempt = rec.attempt
        await self._update(rec.id, lambda r: lifecycle.order_timed_out(r, attempt, now))

    async def _resize(self, d: Resize, topo: Any, now: float) -> None:
        """Shrink an elastic job (the cycle's `Resize`): a move of its own onto the part of its GPUs it keeps —
        checkpoint, release, restore there with the smaller world size (torchrun's elastic restart)."""
        rec = await self.store.get_job(d.job_id)
        if rec is None or rec.state is not JobState.RUNNING:
            return
        target = [NodeGpus(n, list(g)) for n, g in Allocate(d.job_id, d.nodes, d.masks, 0.0).gpus_by_node(topo).items()]
        attempt = rec.attempt
        await self.on_move(
            MoveOrder(
                migration_id=f"{RESIZE_PREFIX}{d.job_id}-{attempt}",
                job_id=d.job_id,
                attempt=attempt,
                target=target,
                reason=d.reason,
                at=now,
            )
        )

    async def _resend_stuck_resizes(self, now: float) -> None:
        """The cycle's own moves have no migration service watching them: a queue killed between writing the job
        migrating and sending its checkpoint order left nobody to send it. The full cycle sends the order again for
        one still migrating after the in-flight timeout (`_order_checkpoint`; the agents ignore an order for ranks
        already checkpointed). Not an abort: a checkpoint
        order held up by a placement restart arrives one ack wait late, and aborting would lose the job's work."""
        for rec in self.jobs.records().values():  # a copy: the sends await
            mv = rec.move
            if rec.state is not JobState.MIGRATING or mv is None or not mv.migration_id.startswith(RESIZE_PREFIX):
                continue
            if overdue(self.hearing, mv.since, now, INFLIGHT_TIMEOUT_S):
                await self._order_checkpoint(rec)

    async def _preempt(self, d: Preempt, now: float) -> bool:
        """Move the victim out; False when it isn't placed or running any more (its GPUs aren't freed)."""
        rec, changed = await self._update(d.job_id, lambda r: lifecycle.preempted(r, d.for_job, now))
        if rec is None or not changed:
            return False
        await self.emit(rec)
        await self.release(rec, rec.reason, checkpoint=d.checkpoint)
        attempt = rec.attempt
        rec, changed = await self._update(d.job_id, lambda r: lifecycle.requeued(r, attempt, d.for_job, now))
        if rec is not None and changed:
            await self.emit(rec)
        return True

    # -- moves: checkpoint → ack → release → place (pinned) → restore --------------------------------------
    async def on_move(self, m: MoveOrder) -> None:
        """The migration service's move. A running checkpointable attempt turns migrating and its ranks
        checkpoint (GPUs still held). An empty target requeues the attempt instead (by on_node_failure): a
        running one is stopped the same way first, so its ranks are gone before it can start again."""
        if not m.target:
            rec = await self.store.get_job(m.job_id)
            if rec is not None and rec.state is JobState.PLACED and rec.attempt == m.attempt:
                await self._lose(m.job_id, m.attempt, "", f"evacuated: {m.reason}")  # ranks may not have started
                return
        now = self.now()

        rec, _ = await self._update(m.job_id, lambda r: lifecycle.migrating(r, m, now))
        if rec is None or rec.state is not JobState.MIGRATING or rec.move is None:
            return
        if rec.move.migration_id != m.migration_id or rec.attempt != m.attempt:
            return
        # also on redelivery: the event and the order may not have gone out (msg ids dedupe repeats)
        await self.emit(rec)
        await self._order_checkpoint(rec)

    async def _order_checkpoint(self, rec: JobRecord) -> None:
        """A migrating attempt's checkpoint order to its ranks; sent again under the same msg id, a repeat within
        the bus's duplicate window is dropped."""
        await self.bus.publish(
            self.names.orders,
            CheckpointOrder(job_id=rec.id, attempt=rec.attempt, reason=rec.reason),
            msg_id=f"{rec.id}:{rec.attempt}:checkpoint",
            headers=_trace(rec),
        )

    async def on_checkpointed(self, ev: RankExited) -> None:
        """A rank's checkpoint is written (the agent's ack). With every rank's: release the old GPUs and
        place the next attempt on the move's target, restoring from the checkpoint."""
        now = self.now()

        rec, changed = await self._update(ev.job_id, lambda r: lifecycle.checkpointed(r, ev, now))
        if rec is None or (changed and rec.state is JobState.MIGRATING):
            return
        # a redelivered ack finds the record past the move: the handling that wrote it may have died before the
        # release and the restore order went out (the job would wait for ever, its old GPUs held), so they go
        # out again (msg ids dedupe the repeat; the release frees only the checkpointed attempt's GPUs)
        if not changed and not lifecycle.restoring_from(rec, ev.attempt):
            return
        await self.emit(rec)
        if rec.state is not JobState.PENDING or rec.inflight_since is None:  # requeued or failed: free the GPUs
            await self.bus.publish(
                self.names.orders,
                ReleaseOrder(job_id=rec.id, reason=rec.reason, cause=rec.end or lifecycle.MOVED),
                msg_id=f"{rec.id}:{ev.attempt}:release:evacuate",
                headers=_trace(rec),
            )
            self.wake()
            return
        # release first: placement handles orders in order, so the pinned commit finds the GPUs free
        await self.bus.publish(
            self.names.orders,
            ReleaseOrder(
                job_id=rec.id, reason="migrating: checkpoint written", only_attempt=ev.attempt, cause=lifecycle.MOVED
            ),
            msg_id=f"{rec.id}:{ev.attempt}:release:migrate",
            headers=_trace(rec),
        )
        order = self._place_order(rec, now)
        await self.bus.publish(self.names.orders, order, msg_id=f"{rec.id}:{rec.attempt}:place", headers=_trace(rec))

    async def on_move_abort(self, m: MoveAbort) -> None:
        """A move whose checkpoint never completed: requeue the job from its last complete checkpoint."""
        now = self.now()
        rec, changed = await self._update(m.job_id, lambda r: lifecycle.move_aborted(r, m, now))
        if rec is None or not changed:
            return
        await self.emit(rec)
        await self.bus.publish(
            self.names.orders,
            ReleaseOrder(job_id=rec.id, reason=rec.reason, cause=lifecycle.MOVED),
            msg_id=f"{rec.id}:{rec.floor}:release:abort",  # the aborted attempt's (now the floor)
            headers=_trace(rec),
        )
        self.wake()

    async def _hold_back(self, sifted: Sifted, jobs: Mapping[str, JobRecord], now: float) -> None:
        """The jobs the gate holds out of the cycle: each held one's reason said, each doomed one cancelled (a
        dependency that can never be met), with why."""
        writes: list[Coroutine[Any, Any, None]] = [
            self._set_reason(j, reason, now) for j, reason in sifted.held.items() if jobs[j].reason != reason
        ]
        writes += [self.on_cancel(JobCancel(job_id=j, at=now, reason=why)) for j, why in sifted.doomed.items()]
        await in_groups(writes, CYCLE_WRITES_AT_ONCE)

    async def _set_reason(self, job_id: str, reason: str, now: float) -> None:
        await self._update(job_id, lambda r: lifecycle.pending_reason(r, reason, now))
