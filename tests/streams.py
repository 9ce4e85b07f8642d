"""Test helpers shared by the integration and e2e suites: reading a stream whole, polling until a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nats.aio.client import Client as NatsClient

from shared.joblog import LogEntry, read_log
from shared.names import Names

T = TypeVar("T")


async def read_stream(nc: NatsClient, names: Names, subject: str) -> list[LogEntry]:
    """Every message the stream holds on `subject` now, in stream order (as a rebuild of the view reads it)."""
    return [e async for e in read_log(nc.jetstream(), names.stream_for(subject), subject)]


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
