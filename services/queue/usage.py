"""The usage view and the decayed usage fair share takes, kept by the queue's leader.

The job log is the truth (shared/usage_log.py says what a run is). While this replica holds the leader lease it
follows the log's job events from the position the view in Redis records (an ordered consumer, no acks: it
changes nothing on the server) and, every pass, folds what came into a `UsageBatch` and writes it with the new
position in one script (`UsageStore.apply`), only if the stored position is still the one it folded from.
Hence:

- a new leader (a failover, a restart) starts where the view stands: nothing is lost or counted twice;
- Redis that came back empty, or behind (a stale replica promoted), shows a position other than the leader's
  own: it reads the view as it is and folds the log again from there, through the same transitions — from the
  start when nothing is left, so the view is rebuilt from the log like the job records (services/queue/rebuild.py);
  meanwhile the view says `rebuilding` and the gateway answers 503 for it;
- two leaders for a moment (a lease that changed hands) can't both add one stretch: the second's write finds
  the position moved and it reads the view again.

The leader's decayed usage (`UsageLedger`, shared/core/usage.py) is made at takeover from the view — its hourly
GPU-seconds of the last `HORIZON_HALF_LIVES` half-lives and the runs open — and then moved by each batch's
changes, the same holding changes the simulator makes as attempts start and end. A run counts up to now. The
cycle takes it as `usage` (`shares`); with RACKSCALE_USAGE_HALF_LIFE_S=0 none is kept, the view still is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from shared.bus import Bus
from shared.core.usage import UsageLedger
from shared.redis_client import UNAVAILABLE
from shared.schemas import EVENTS, JobEvent, UsageRun
from shared.usage_log import HOUR, UsageBatch, fold
from shared.usage_store import READY, REBUILDING, UsageStore

log = logging.getLogger("rackscale.queue.usage")

CHUNK = 2000  # job events per batch (one script each)
HORIZON_HALF_LIVES = 30  # older hours weigh under 2^-30 of their use: not read at takeover


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    data: bytes


class UsageKeeper:
    def __init__(self, bus: Bus, store: UsageStore, half_life_s: float) -> None:
        self.bus = bus
        self.store = store
        self.names = store.names
        self.half_life_s = half_life_s
        self.ledger: UsageLedger | None = None  # the decayed usage while leading (None: not leading, or off)
        self.mark = 0  # the log position folded up to, as written
        self.ready = False  # caught up with the log at the last look
        self.open: dict[str, UsageRun] = {}  # the view's open runs, as written
        self._sub: Any = None
        self._buffer: list[_Entry] = []
        self.more = asyncio.Event()  # a batch's worth is waiting

    @property
    def following(self) -> bool:
        return self._sub is not None

    def shares(self, now: float, tenants: Iterable[str]) -> dict[str, float] | None:
        """The cycle's `usage`: GPUs per tenant (of `tenants`) as of `now`; None while there is none to give."""
        return self.ledger.shares(now, tenants) if self.ledger is not None else None

    async def run(
        self, leading: Callable[[], bool], stop: asyncio.Event, interval_s: float, clock: Callable[[], float]
    ) -> None:
        """A pass every `interval_s` (sooner when a batch's worth came) while the service runs. `leading` says
        whether this replica holds the leader lease; the keeper never takes the lease itself (the cycle does)."""
        try:
            while not stop.is_set():
                try:
                    await self.step(leading(), clock())
                except (*UNAVAILABLE, nats.errors.Error, TimeoutError) as e:  # an outage: the next pass goes on
                    log.warning("usage view: a pass cut short, a backend is unavailable: %r", e)
                    await self.let_go()
                except Exception:
                    log.exception("usage view: a pass failed; the next one takes it up again")
                    await self.let_go()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.more.wait(), interval_s)
                self.more.clear()
        finally:
            await self.let_go()

    async def step(self, leading: bool, now: float) -> None:
        """One pass: follow the log while leading (taking over first), fold what came; let go otherwise."""
        if not leading:
            await self.let_go()
            return
        if self._sub is None:
            await self._take_over(now)
        if not await self._fold(now):
            await self.let_go()  # the view is not where this leader left it: read it again, fold from there
            await self._take_over(now)
            await self._fold(now)

    async def let_go(self) -> None:
        sub, self._sub = self._sub, None
        self._buffer = []
        self.ledger = None
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    # -- taking over ----------------------------------------------------------------------------------------
    async def _take_over(self, now: float) -> None:
        status = await self.store.status()
        self.mark = status.events_seq if status is not None else 0
        self.ready = status is not None and status.state == READY
        self.open = await self.store.open_runs()
        self.ledger = await self._ledger(now) if self.half_life_s > 0 else None
        self._buffer = []
        n = self.names

        async def on_msg(m: Msg) -> None:
            self._buffer.append(_Entry(m.metadata.sequence.stream, m.data))
            if len(self._buffer) >= CHUNK:
                self.more.set()

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.mark + 1)
        stream = n.stream_for(n.job_events_all)
        self._sub = await self.bus.js.subscribe(
            n.job_events_all, stream=stream, cb=on_msg, ordered_consumer=True, config=config
        )
        log.info("usage view: following the job log from %d (%s)", self.mark + 1, "ready" if self.ready else "behind")

    async def _ledger(self, now: float) -> UsageLedger:
        """The decayed usage as the view has it: each hour's GPU-seconds spread over that hour, each open run
        held from its start."""
        ledger = UsageLedger(self.half_life_s)
        days = await self.store.days(now - HORIZON_HALF_LIVES * self.half_life_s, float("inf"))
        for day, fields in (await self.store.hours(days)).items():
            for name, gpu_s in fields.items():
                tenant, _, hh = name.rpartition("/")
                hour = day + int(hh) * HOUR
                ledger.charge(tenant, gpu_s, hour, hour + HOUR)
        for run in self.open.values():
            ledger.hold(run.tenant, run.gpus, run.since)
        return ledger

    # -- folding ----------------------------------------------------------------------------------------------
    async def _fold(self, now: float) -> bool:
        """Fold what came, a batch at a time; False when the view's position is not this leader's (nothing of the
        batch written). A pass with nothing to fold checks the position, and whether the log is all folded."""
        folded = False
        while self._buffer:
            entries = [e for e in self._buffer[:CHUNK] if e.seq > self.mark]
            del self._buffer[:CHUNK]
            if not entries:
                continue
            events = [ev for e in entries if isinstance(ev := _decode(e.data), JobEvent)]
            floors = await self.store.floors(ev.job_id for ev in events)
            batch = fold(self.open, floors, events)
            seq = entries[-1].seq
            state = READY if self.ready else REBUILDING
            if not await self.store.apply(batch, self.mark, seq, state, now):
                return False
            self._applied(batch, seq)
            folded = True
        if not folded:
            status = await self.store.status()
            if (status.events_seq if status is not None else 0) != self.mark:
                return False
            if status is not None and status.state == READY:
                self.ready = True
                return True
        if not self.ready and await self._caught_up():
            if not await self.store.apply(UsageBatch(), self.mark, self.mark, READY, now):
                return False
            self.ready = True
            log.info("usage view: caught up with the job log at %d", self.mark)
        return True

    def _applied(self, batch: UsageBatch, seq: int) -> None:
        self.mark = seq
        for job in batch.gone:
            self.open.pop(job, None)
        self.open.update(batch.open)
        if self.ledger is not None:
            for tenant, delta, at in batch.changes:
                self.ledger.hold(tenant, delta, at)

    async def _caught_up(self) -> bool:
        """Every job event the log holds is folded: the consumer has none left to send, none is on its way to
        this process (a message the server sent before answering is read before its answer) and none waits here."""
        if self._sub is None or self._buffer:
            return False
        try:
            info = await self._sub.consumer_info()
        except Exception:
            return False
        return info.num_pending == 0 and self._sub.pending_msgs == 0 and not self._buffer


def _decode(data: bytes) -> Any:
    try:
        return EVENTS.decode(data)
    except msgspec.DecodeError:
        return None  # dead-lettered when it came; its position still counts as folded
