"""NATS and JetStream for the services: streams, publishing, and consumer loops that never die.

- `ensure_streams` creates (or updates) every stream in `Names.streams`.
- `publish` goes to JetStream with a `Nats-Msg-Id` (dedup inside the stream's window) and whatever
  headers the caller adds (trace context rides in `traceparent`).
- `consume` runs a durable pull consumer shared by a service's replicas: at-least-once, so handlers
  are idempotent. A message that doesn't decode is logged with the field path, published to the
  service's dead-letter subject and terminated; a handler that raises is retried later (nak with
  delay). Neither ends the loop. On stop, the batch in hand is finished and acked before returning.
- `subscribe` does the same for core NATS subjects (fire-and-forget reports, request/reply).
- The link: `connected`, `reconnects` (counts every reconnect) and `answers()` (a round trip to the server
  now) tell a service that judges silence whether it could hear (`shared.liveness`); `on_link` callbacks
  hear of a disconnect or reconnect at once. Pings every `PING_INTERVAL_S` find a connection that died
  without a word (a host gone, a network cut) within a few pings, not nats-py's default 4-6 minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from shared.names import Names
from shared.schemas import DeadLetter, encode

log = logging.getLogger("rackscale.bus")

T = TypeVar("T")
Handler = Callable[[T, Mapping[str, str]], Awaitable[None]]

DUPLICATE_WINDOW_S = 120.0
RETRY_FIRST_S = 0.01  # first redelivery delay of a message whose handler raised Retry
PUBLISH_TIMEOUT_S = 5.0  # for the acks of publish_all (nats-py's own default for one publish)
TOP_UP_S = 0.02  # bound on fetching a backlog that another replica took meanwhile
PING_INTERVAL_S = 10  # client pings; `MAX_OUTSTANDING_PINGS` unanswered ones count as a dead connection
MAX_OUTSTANDING_PINGS = 3
LinkListener = Callable[[bool], None]  # called with True on a reconnect, False on a disconnect


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One durable message for `Bus.publish_all`."""

    subject: str
    msg: msgspec.Struct
    msg_id: str | None = None
    headers: Mapping[str, str] | None = None


_UNDECODABLE = object()


def _backlog(m: Msg) -> int:
    """How many more messages the consumer had waiting when `m` was delivered (0 if it can't tell)."""
    try:
        return max(0, int(m.metadata.num_pending))
    except Exception:
        return 0


def _merged(lane: list[tuple[Msg, Any]], merge: Callable[[Any, Any], Any | None] | None) -> list[tuple[list[Msg], Any]]:
    """A lane's messages with neighbours `merge` joins taken as one (each with the messages it stands for)."""
    out: list[tuple[list[Msg], Any]] = []
    for m, obj in lane:
        if merge is not None and out and (joined := merge(out[-1][1], obj)) is not None:
            out[-1] = ([*out[-1][0], m], joined)
        else:
            out.append(([m], obj))
    return out


def _lane(key: Callable[[Any], str], obj: Any) -> str:
    """The message's ordering key; one without (an unexpected type) shares the lane of the keyless."""
    try:
        return key(obj)
    except Exception:
        return ""


class Retry(Exception):
    """Raised by a handler for a message that arrived before what it depends on: redeliver it later."""


class Bus:
    def __init__(self, nc: NatsClient, names: Names, service: str) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.names = names
        self.service = service
        self.dead_letters = 0  # count, for metrics and tests
        self._closing = False  # close() was called: the link going down is expected
        self._link_listeners: list[LinkListener] = []

    @classmethod
    async def connect(cls, url: str, names: Names, service: str) -> Bus:
        bus: Bus | None = None  # the callbacks below are made before the bus they report to

        async def disconnected() -> None:
            if bus is not None:
                bus._link_changed(False)

        async def reconnected() -> None:
            if bus is not None:
                bus._link_changed(True)

        nc = await nats.connect(
            # nats-py takes a comma-separated list as one URL: split it, so every server (with its
            # credentials) is in the pool (RACKSCALE_NATS_URL on a cluster)
            [u.strip() for u in url.split(",") if u.strip()],
            name=f"rackscale-{service}",
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            ping_interval=PING_INTERVAL_S,
            max_outstanding_pings=MAX_OUTSTANDING_PINGS,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
        )
        bus = cls(nc, names, service)
        return bus

    async def close(self) -> None:
        # consumers have stopped by now: flush what was published, then close (drain would wait on
        # the idle pull subscriptions)
        self._closing = True  # the disconnect that follows is ours: no "connection lost" warning
        with contextlib.suppress(Exception):
            await self.nc.flush(timeout=2)
        with contextlib.suppress(Exception):
            await self.nc.close()

    # -- the link ----------------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """Whether the connection is up now (False while nats-py reconnects)."""
        return self.nc.is_connected

    @property
    def reconnects(self) -> int:
        """How many times the connection came back: a change means a break, however short."""
        return int(self.nc.stats.get("reconnects", 0))

    def on_link(self, listener: LinkListener) -> None:
        """Call `listener(False)` when the connection drops and `listener(True)` when it is back (only on a
        bus made by `connect`; `connected` and `reconnects` work on any)."""
        self._link_listeners.append(listener)

    async def answers(self, timeout: float = 2.0) -> bool:
        """Whether the server answers a round trip now: a connection can look up and be dead (a network cut
        no packet announced), and only a round trip tells."""
        if not self.nc.is_connected:
            return False
        try:
            await self.nc.flush(timeout=timeout)
        except Exception:
            return False
        return True

    def _link_changed(self, up: bool) -> None:
        if self._closing:
            return
        if up:
            log.warning("%s: NATS connection back (reconnect %d)", self.service, self.reconnects)
        else:
            log.warning("%s: NATS connection lost; reconnecting", self.service)
        for listener in list(self._link_listeners):
            try:
                listener(up)
            except Exception:
                log.exception("%s: a link listener failed", self.service)

    # -- streams ---------------------------------------------------------------------------------------
    async def ensure_streams(self, replicas: int = 1) -> None:
        for spec in self.names.streams:
            cfg = StreamConfig(
                name=spec.name,
                subjects=list(spec.subjects),
                storage=StorageType.FILE,
                num_replicas=replicas,
                duplicate_window=DUPLICATE_WINDOW_S,
                max_msgs_per_subject=spec.per_subject or -1,
                max_bytes=spec.max_bytes or -1,
                max_age=spec.max_age_s or None,
            )
            try:
                await self.js.stream_info(spec.name)
                await self.js.update_stream(cfg)
            except NotFoundError:
                await self.js.add_stream(cfg)

    # -- publishing ------------------------------------------------------------------------------------
    async def publish(
        self, subject: str, msg: msgspec.Struct, *, msg_id: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        """Durable publish: returns once JetStream has stored the message."""
        hdrs = dict(headers or {})
        if msg_id:
            hdrs["Nats-Msg-Id"] = msg_id
        await self.js.publish(subject, encode(msg), headers=hdrs or None)

    async def publish_all(self, messages: Sequence[Outgoing]) -> None:
        """Durable publish of several messages for the wait of one: all go out in the given order, then every
        ack is awaited. One connection's messages reach JetStream in the order sent, so messages to one
        stream are stored in this order, as with one publish after the other."""
        if len(messages) == 1:
            m = messages[0]
            await self.publish(m.subject, m.msg, msg_id=m.msg_id, headers=m.headers)
            return
        acks = []
        for m in messages:
            hdrs = dict(m.headers or {})
            if m.msg_id:
                hdrs["Nats-Msg-Id"] = m.msg_id
            acks.append(await self.js.publish_async(m.subject, encode(m.msg), headers=hdrs or None))
        await asyncio.wait_for(asyncio.gather(*acks), PUBLISH_TIMEOUT_S)

    async def publish_core(self, subject: str, msg: msgspec.Struct, headers: Mapping[str, str] | None = None) -> None:
        await self.nc.publish(subject, encode(msg), headers=dict(headers) if headers else None)

    async def request(self, subject: str, msg: msgspec.Struct, timeout: float = 2.0) -> bytes:
        reply = await self.nc.request(subject, encode(msg), timeout=timeout)
        return reply.data

    # -- consuming -------------------------------------------------------------------------------------
    async def dead_letter(self, subject: str, data: bytes, error: str) -> None:
        self.dead_letters += 1
        log.error("dead-lettered a message on %s: %s", subject, error)
        letter = DeadLetter(service=self.service, subject=subject, error=error, data=data, at=time.time())
        try:
            await self.publish(self.names.dead_letter(self.service), letter)
        except Exception:  # the log line above is the record of last resort
            log.exception("could not publish the dead letter for %s", subject)

    async def consume(
        self,
        subject: str,
        durable: str,
        decoder: msgspec.msgpack.Decoder[Any],
        handler: Handler[Any],
        stop: asyncio.Event,
        *,
        batch: int = 64,
        ack_wait_s: float = 30.0,
        retry_delay_s: float = 0.5,
        ready: asyncio.Event | None = None,
        key: Callable[[Any], str] | None = None,
        filters: Sequence[str] = (),
        merge: Callable[[Any, Any], Any | None] | None = None,
    ) -> None:
        """Run a durable pull consumer until `stop` is set.

        `filters`: the subjects it takes, when not all of `subject` (its stream is found from `subject`): one
        shard of a simulated fleet takes its own nodes' commands. `merge(a, b)`: with `key`, two messages next to
        each other in a key's lane as one (None: not mergeable), handled once and acked (or redelivered)
        together: a gang's rank starts, recorded in one update.

        Without `key` a fetched batch is handled one message after the other. With it, messages of different
        keys (say, job ids) are handled concurrently and those of one key in stream order: a handler's round
        trips overlap with other jobs' instead of queueing behind them."""
        stream = self.names.stream_for(subject)
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_s,
            max_ack_pending=10_000,
            filter_subjects=list(filters) or None,
        )
        sub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        if ready is not None:
            ready.set()
        # A waiting fetch of n > 1 returns only when n messages came or it times out (nats-py waits for the
        # batch to fill once the first message is in). So the waiting fetch asks for one message, which goes
        # through the moment it comes, and a second fetch takes what the consumer's backlog says is ready.
        while not stop.is_set():
            try:
                msgs = await sub.fetch(1, timeout=0.25)
                if ready_too := min(batch - 1, _backlog(msgs[-1])):
                    with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
                        msgs += await sub.fetch(ready_too, timeout=TOP_UP_S)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except Exception:
                if stop.is_set():
                    break
                log.exception("fetch on %s failed; retrying", subject)
                await asyncio.sleep(retry_delay_s)
                continue
            if key is None or len(msgs) == 1:
                for m in msgs:
                    await self._handle(m, decoder, handler, retry_delay_s)
                continue
            lanes: dict[str, list[tuple[Msg, Any]]] = {}
            for m in msgs:
                obj = await self._decode(m, decoder)
                if obj is not _UNDECODABLE:
                    lanes.setdefault(_lane(key, obj), []).append((m, obj))
            await asyncio.gather(*(self._lane(_merged(lane, merge), handler, retry_delay_s) for lane in lanes.values()))

    async def _lane(self, lane: list[tuple[list[Msg], Any]], handler: Handler[Any], delay: float) -> None:
        """One key's messages in stream order. One that isn't handled (yet) holds back those after it: they are
        redelivered with it, after it, rather than applied before it."""
        for i, (ms, obj) in enumerate(lane):
            held_back = await self._dispatch(ms, obj, handler, delay)
            if held_back is not None:
                for later, _ in lane[i + 1 :]:
                    for m in later:
                        with contextlib.suppress(Exception):
                            await m.nak(delay=held_back)
                return

    async def _decode(self, m: Msg, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
        """The message decoded, or _UNDECODABLE once it is dead-lettered and terminated."""
        try:
            return decoder.decode(m.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            await self.dead_letter(m.subject, m.data, str(e))
            with contextlib.suppress(Exception):
                await m.term()
            return _UNDECODABLE

    async def _handle(self, m: Msg, decoder: msgspec.msgpack.Decoder[Any], handler: Handler[Any], delay: float) -> None:
        obj = await self._decode(m, decoder)
        if obj is not _UNDECODABLE:
            await self._dispatch([m], obj, handler, delay)

    async def _dispatch(self, ms: list[Msg], obj: Any, handler: Handler[Any], delay: float) -> float | None:
        """Handle and ack one message (or several merged into `obj`); when the handler can't (yet), nak them and
        return the redelivery delay."""
        first = ms[0]
        try:
            await handler(obj, first.headers or {})
        except Retry as e:
            # what it waits for is usually milliseconds behind: back off from 10 ms up to `delay`
            tries = 1
            with contextlib.suppress(Exception):
                tries = max(1, first.metadata.num_delivered)
            log.debug("%s: not yet (%s); redelivering later", first.subject, e)
            later = min(delay, RETRY_FIRST_S * 2 ** (tries - 1))
            for m in ms:
                with contextlib.suppress(Exception):
                    await m.nak(delay=later)
            return later
        except Exception:
            log.exception("handler for %s failed; will retry", first.subject)
            for m in ms:
                with contextlib.suppress(Exception):
                    await m.nak(delay=delay)
            return delay
        for m in ms:
            with contextlib.suppress(Exception):
                await m.ack()
        return None

    async def subscribe(
        self,
        subject: str,
        decoder: msgspec.msgpack.Decoder[Any],
        handler: Callable[[Any, Msg], Awaitable[None]],
        *,
        queue: str = "",
    ) -> Any:
        """Core NATS subscription (queue group across replicas) with the same dead-letter rule."""

        async def on_msg(m: Msg) -> None:
            try:
                obj = decoder.decode(m.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                await self.dead_letter(m.subject, m.data, str(e))
                return
            try:
                await handler(obj, m)
            except Exception:
                log.exception("handler for %s failed", m.subject)

        return await self.nc.subscribe(subject, queue=queue, cb=on_msg)
