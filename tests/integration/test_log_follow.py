"""A followed log against real NATS JetStream and Redis: a line a process writes reaches a follower within 1 s.

Timing is on an injected clock: the agent's LogShipper waits on `FakeTime`, which moves only when the test moves
it, so "within 1 s" is counted in that clock's seconds, never the machine's. The gateway's follower polls the
job's state once an hour here: a line that reaches it does so because it was pushed, not because a poll came.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from services.agent.logs import FLUSH_S, LogShipper
from services.gateway.service import build_app
from shared import sse
from shared.api import LogLine
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import JobBody, JobRecord, JobState, StartRank
from shared.settings import Settings
from shared.store import ViewMark
from shared.tracing import noop_tracer
from tests.integration.conftest import delete_nats_namespace, delete_redis_namespace

pytestmark = pytest.mark.asyncio

WAIT_S = 30.0  # bound on waiting for what must come; never an assertion
STEP_S = 0.05  # the fake clock moves this far at a time


class FakeTime:
    """A clock that moves when `advance` says, and a `wait` (LogShipper's) that times out on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waiting = asyncio.Event()  # someone waits on this clock (the shipper is idle)
        self._moved = asyncio.Event()

    def clock(self) -> float:
        return self.now

    async def wait(self, event: asyncio.Event, timeout: float) -> None:
        deadline = self.now + timeout
        while not event.is_set() and self.now < deadline:
            self._moved.clear()
            self.waiting.set()
            woken = asyncio.ensure_future(event.wait())
            moved = asyncio.ensure_future(self._moved.wait())
            try:
                await asyncio.wait({woken, moved}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                woken.cancel()
                moved.cancel()
        self.waiting.clear()

    async def advance(self, dt: float) -> None:
        """Move the clock, then let whoever waits on it run until it waits again."""
        self.waiting.clear()
        self.now += dt
        self._moved.set()
        await asyncio.wait_for(self.waiting.wait(), WAIT_S)


@pytest_asyncio.fixture
async def deps(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Deps]:
    names = Names(prefix=namespace)
    d = await Deps.connect(Settings(), "gateway", nats_url, redis_url, names, tracer=noop_tracer("gateway"))
    await d.store.open_view(ViewMark(), time.time())
    try:
        yield d
    finally:
        await d.close()
        await delete_nats_namespace(nats_url, namespace.upper())
        await delete_redis_namespace(redis_url, namespace)


async def test_a_line_reaches_a_follower_within_1s_of_the_shippers_clock(deps: Deps) -> None:
    spec = JobBody(name="talker", tenant="a", gpus=4, command=["python"])
    rec = JobRecord(id="j1", spec=spec, state=JobState.RUNNING, reason="", submitted_at=0.0, updated_at=0.0, attempt=1)
    await deps.store.put_job(rec, new=True)
    cmd = StartRank(
        job_id="j1", attempt=1, node="n0", gpus=[0, 1, 2, 3], rank=0, world_size=1, master_addr="", command=["python"],
        duration_s=0.0,
    )  # fmt: skip
    fake = FakeTime()
    shipper = LogShipper(deps.bus, cmd, fake.clock, fake.wait)
    app = build_app(deps, tokens=None, follow_poll_s=3600.0)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/v1/jobs/j1/logs", params={"follow": "true"})
        assert resp.status == 200 and resp.content_type == sse.MEDIA_TYPE
        reader = sse.Reader()

        async def next_line() -> LogLine:
            while True:
                raw = await resp.content.readline()
                assert raw, "the stream closed"
                ev = reader.feed(raw.decode())
                if ev is not None and ev.event == "line":
                    return msgspec.json.decode(ev.data, type=LogLine)

        await asyncio.wait_for(fake.waiting.wait(), WAIT_S)  # the shipper waits for lines
        for n in range(3):  # each line on its own: nothing else fills a chunk to send it early
            written = fake.now
            shipper.sink(0, f"line {n}\n".encode())
            while shipper.shipped == n:
                await fake.advance(STEP_S)
            assert fake.now - written <= min(FLUSH_S + STEP_S, 1.0)
            line = await asyncio.wait_for(next_line(), WAIT_S)  # pushed on: the follower polls hourly
            assert (line.rank, line.text) == (0, f"line {n}")
        resp.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(shipper.close(), WAIT_S)
