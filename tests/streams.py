"""Test helpers shared by the integration and e2e suites: reading a stream whole, polling until a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from shared.names import Names

T = TypeVar("T")


async def read_stream(nc: NatsClient, names: Names, subject: str, *, timeout: float = 1.0) -> list[Msg]:
    """Every message the stream holds on `subject` now, in stream order (an ephemeral consumer reads it)."""
    # no acks: an explicit-ack consumer stops delivering after max_ack_pending unacked messages
    config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
    sub = await nc.jetstream().pull_subscribe(subject, stream=names.stream_for(subject), config=config)
    out: list[Msg] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(512, timeout=timeout)
            except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either, depending on the step
                break
            out += msgs
            if not msgs or msgs[-1].metadata.num_pending == 0:
                break
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    out.sort(key=lambda m: m.metadata.sequence.stream)
    return out


async def wait_until(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float, *, poll_s: float = 0.05) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last saw {value!r}")
        await asyncio.sleep(poll_s)
