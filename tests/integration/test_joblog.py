"""The log read back (`shared.joblog.read_log`) on a real JetStream server."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from shared.joblog import read_log

pytestmark = pytest.mark.asyncio


async def _stream(nc: NatsClient, namespace: str, count: int) -> tuple[JetStreamContext, str]:
    js = nc.jetstream()
    name = f"{namespace}_LOG"
    await js.add_stream(name=name, subjects=[f"{namespace}.>"])
    for i in range(count):
        await js.publish(f"{namespace}.ev.{i % 3}", str(i).encode())
    await js.publish(f"{namespace}.other", b"-")
    return js, name


async def test_reads_every_message_past_a_position_in_order(nats_client: NatsClient, namespace: str) -> None:
    js, stream = await _stream(nats_client, namespace, 300)
    got = [e async for e in read_log(js, stream, f"{namespace}.ev.>", after=100)]
    assert [int(e.data) for e in got] == list(range(100, 300))
    assert [e.seq for e in got] == list(range(101, 301))
    assert [e async for e in read_log(js, stream, f"{namespace}.nothing.>")] == []


class _HeldDelivery:
    """A JetStream context whose subscriptions' callbacks wait until the reader has asked the consumer how much
    is pending, and whose consumer_info answers only once the server has sent every message: the order a busy
    machine can produce, made certain."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self.asked = asyncio.Event()

    async def stream_info(self, name: str, **kw: Any) -> Any:
        return await self.js.stream_info(name, **kw)

    async def get_last_msg(self, stream: str, subject: str) -> Any:
        return await self.js.get_last_msg(stream, subject)

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]], **kw: Any) -> Any:
        async def held(m: Msg) -> None:
            await self.asked.wait()
            await cb(m)

        sub = await self.js.subscribe(subject, cb=held, **kw)
        asked = self.asked
        real_info = sub.consumer_info

        async def consumer_info() -> Any:
            while (info := await real_info()).num_pending:
                await asyncio.sleep(0.01)
            asked.set()
            return info

        sub.consumer_info = consumer_info
        return sub


async def test_messages_sent_before_the_pending_count_is_asked_are_read(
    nats_client: NatsClient, namespace: str
) -> None:
    """The server has sent the whole stream (nothing pending) before any message reached the reader: the read
    still hands them all over (it once returned none, and a rebuilt view lost every event). A wildcard on part
    of the stream read from a position: the one read whose end the server's pending count tells."""
    js, stream = await _stream(nats_client, namespace, 50)
    held = _HeldDelivery(js)
    got = [e async for e in read_log(held, stream, f"{namespace}.ev.>", after=1)]  # type: ignore[arg-type]
    assert held.asked.is_set()
    assert [int(e.data) for e in got] == list(range(1, 50))


async def test_each_kind_of_end_stops_where_the_stream_was_when_the_read_began(
    nats_client: NatsClient, namespace: str
) -> None:
    js, stream = await _stream(nats_client, namespace, 30)  # .ev.0-2 for 1-30, .other at 31
    for i in range(5):
        await js.publish(f"{namespace}.ev.{i % 3}", b"later")  # 32-36: past `upto` below
    one = f"{namespace}.ev.1"  # an exact subject, with later messages on it past `upto`
    exact = [e.seq async for e in read_log(js, stream, one, upto=31)]
    assert exact == [s for s in range(1, 31) if (s - 1) % 3 == 1]
    counted = [e.seq async for e in read_log(js, stream, f"{namespace}.ev.>")]  # a wildcard from the start
    assert counted == [*range(1, 31), *range(32, 37)]
    whole = [e.seq async for e in read_log(js, stream, f"{namespace}.>", after=20, upto=33)]  # the whole stream
    assert whole == list(range(21, 34))
    assert [e async for e in read_log(js, stream, f"{namespace}.other", after=31)] == []
