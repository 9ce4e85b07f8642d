"""End-to-end harness: the whole system (`services.stack.Stack`) on the session's servers, driven over HTTP.

The servers are the integration fixtures' (`nats_url`, `redis_url`: RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL,
else embedded ones for the session); every test runs under its own `namespace` prefix, deleted at teardown.
Waits poll with a deadline and fail naming what they waited for; no assertion depends on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import msgspec
import nats
import pytest_asyncio
from nats.aio.client import Client as NatsClient

from services.stack import Stack, StackOptions
from shared.joblog import LogEntry
from shared.names import Names
from shared.schemas import EVENTS, JobEvent, JobState, NodeGpus
from shared.settings import Settings
from tests import streams
from tests.history import log_double_bookings
from tests.integration import conftest as integration
from tests.integration.conftest import delete_nats_namespace, delete_redis_namespace

T = TypeVar("T")

# The integration fixtures, shared: the same servers (configured or embedded) and a namespace per test.
nats_url = integration.nats_url
redis_url = integration.redis_url
namespace = integration.namespace

WAIT_S = 60.0  # bound on waiting for a state; never an assertion
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
HOLDING = frozenset({JobState.PLACED, JobState.RUNNING, JobState.MIGRATING})


def e2e_settings(nats_url: str, redis_url: str, prefix: str, **overrides: Any) -> Settings:
    """Fast timers; generous missed_heartbeats so a loaded machine doesn't mark nodes down."""
    base = Settings(
        prefix=prefix,
        nats_url=nats_url,
        redis_url=redis_url,
        gateway_port=0,
        heartbeat_s=0.2,
        cycle_interval_s=0.2,
        missed_heartbeats=10,
    )
    return dataclasses.replace(base, **overrides)


def domain_of(node: str) -> str:
    """The sim fleet names nodes `dNN-nMM` in domain `dNN`."""
    return node.split("-", 1)[0]


async def wait_until(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = WAIT_S) -> T:
    return await streams.wait_until(probe, what, timeout, poll_s=0.1)


@dataclass
class E2E:
    """One running stack plus an HTTP session and a NATS connection of the test's own."""

    stack: Stack
    http: aiohttp.ClientSession
    nc: NatsClient
    log_dir: Path
    submitted: list[str] = field(default_factory=list)

    @property
    def names(self) -> Names:
        return self.stack.settings.names()

    @property
    def url(self) -> str:
        return self.stack.gateway_url

    # -- HTTP ------------------------------------------------------------------------------------------
    async def submit(self, body: dict[str, Any]) -> str:
        async with self.http.post(f"{self.url}/v1/jobs", json=body) as r:
            data = await r.json()
            assert r.status == 202, f"submit {body} → {r.status} {data}"
        self.submitted.append(data["id"])
        return str(data["id"])

    async def submit_all(self, bodies: Iterable[dict[str, Any]], concurrency: int = 16) -> list[str]:
        sem = asyncio.Semaphore(concurrency)

        async def one(body: dict[str, Any]) -> str:
            async with sem:
                return await self.submit(body)

        return list(await asyncio.gather(*(one(b) for b in bodies)))

    async def job(self, job_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.url}/v1/jobs/{job_id}") as r:
            data = await r.json()
            assert r.status == 200, f"GET job {job_id} → {r.status} {data}"
            return dict(data)

    async def maybe_job(self, job_id: str) -> dict[str, Any] | None:
        """None while the job can't be read: the queue hasn't recorded the submit yet (503 while it has submits to
        handle, 404 before it ever ran), or the gateway can't tell now (503)."""
        async with self.http.get(f"{self.url}/v1/jobs/{job_id}") as r:
            if r.status in (404, 503):
                return None
            data = await r.json()
            assert r.status == 200, f"GET job {job_id} → {r.status} {data}"
            return dict(data)

    async def cancel(self, job_id: str) -> tuple[int, dict[str, Any]]:
        async with self.http.delete(f"{self.url}/v1/jobs/{job_id}") as r:
            return r.status, dict(await r.json())

    async def cluster(self) -> dict[str, Any]:
        async with self.http.get(f"{self.url}/v1/cluster") as r:
            assert r.status == 200
            return dict(await r.json())

    async def admin(self, node: str, action: str) -> dict[str, Any]:
        async with self.http.post(f"{self.url}/v1/nodes/{node}/{action}") as r:
            data = await r.json()
            assert r.status == 200, f"{action} {node} → {r.status} {data}"
            return dict(data)

    async def all_jobs(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        offset = 0
        while True:
            async with self.http.get(f"{self.url}/v1/jobs", params={"offset": offset, "limit": 500}) as r:
                page = await r.json()
            out.update({j["id"]: j for j in page["jobs"]})
            offset += len(page["jobs"])
            if not page["jobs"] or offset >= page["total"]:
                return out

    async def wait_state(
        self,
        job_id: str,
        states: Iterable[str],
        timeout: float = WAIT_S,
        check: Callable[[dict[str, Any]], bool] | None = None,
    ) -> dict[str, Any]:
        wanted = set(states)
        last: dict[str, Any] = {}

        async def probe() -> dict[str, Any] | None:
            nonlocal last
            last = await self.maybe_job(job_id) or {}
            ok = last.get("state") in wanted and (check is None or check(last))
            return last if ok else None

        try:
            return await wait_until(probe, f"job {job_id} in {sorted(wanted)}", timeout)
        except AssertionError:
            raise AssertionError(
                f"job {job_id} not in {sorted(wanted)} in {timeout:g}s: {last.get('state')} ({last.get('reason')!r})"
            ) from None

    async def wait_terminal(self, ids: Iterable[str], timeout: float = WAIT_S) -> dict[str, dict[str, Any]]:
        """Every job terminal (polled through the list API); on timeout, the stuck ones with their reasons."""
        want = set(ids)
        deadline = time.monotonic() + timeout
        while True:
            jobs = {i: j for i, j in (await self.all_jobs()).items() if i in want}
            stuck = {i: (j["state"], j["reason"], j["attempt"]) for i, j in jobs.items() if j["state"] not in TERMINAL}
            missing = want - set(jobs)
            if not stuck and not missing:
                return jobs
            if time.monotonic() > deadline:
                sample = dict(list(stuck.items())[:10])
                raise AssertionError(
                    f"{len(stuck)} of {len(want)} jobs not terminal and {len(missing)} unknown after {timeout:g}s; "
                    f"e.g. {sample}"
                )
            await asyncio.sleep(0.25)

    async def wait_nodes(self, count: int) -> None:
        """Until `count` nodes registered and are up (the gateway validates shapes against them)."""

        async def probe() -> int | None:
            async with self.http.get(f"{self.url}/v1/cluster") as r:
                if r.status == 503:  # the view is not ready yet (a queue in a child process still starting)
                    return None
                assert r.status == 200, f"GET /v1/cluster → {r.status} {await r.text()}"
                c = await r.json()
            up = sum(n["state"] == "up" for d in c["domains"] for n in d["nodes"])
            return up if up == count else None

        await wait_until(probe, f"{count} nodes up")

    # -- the bus -----------------------------------------------------------------------------------------
    async def stream(self, subject: str) -> list[LogEntry]:
        """Every message the stream holds on `subject` now, in stream order."""
        return await streams.read_stream(self.nc, self.names, subject)

    async def decoded(self, subject: str, decoder: msgspec.msgpack.Decoder[Any] = EVENTS) -> list[Any]:
        return [decoder.decode(m.data) for m in await self.stream(subject)]

    async def job_events(self) -> list[JobEvent]:
        return [e for e in await self.decoded(self.names.job_events_all) if isinstance(e, JobEvent)]

    async def wait_events(
        self, subject: str, done: Callable[[list[Any]], bool], what: str, timeout: float = WAIT_S
    ) -> list[Any]:
        async def probe() -> list[Any] | None:
            evs = await self.decoded(subject)
            return evs if done(evs) else None

        return await wait_until(probe, what, timeout)


def service_errors(
    records: Iterable[logging.LogRecord], *, allow: Callable[[logging.LogRecord], bool] | None = None
) -> list[str]:
    """ERROR records the services logged (a crashed loop, a failed cycle, a handler that raised)."""
    return [
        f"{r.name}: {r.getMessage()}" + (f" [{r.exc_info[1]!r}]" if r.exc_info else "")
        for r in records
        if r.levelno >= logging.ERROR and r.name.startswith("rackscale") and not (allow and allow(r))
    ]


# -- checks on the event log ------------------------------------------------------------------------------

# A GPU given to a job while another holds it, replaying the job log in stream order: the log half of the
# history checker's property (c) (tests/history.py), which the fault tests run whole.
double_bookings = log_double_bookings


def placements(events: list[JobEvent]) -> dict[str, list[list[NodeGpus]]]:
    """Every `placed` allocation of each job, in order."""
    out: dict[str, list[list[NodeGpus]]] = {}
    for ev in events:
        if ev.state is JobState.PLACED:
            seen = out.setdefault(ev.job_id, [])
            if not seen or seen[-1] != ev.nodes:
                seen.append(list(ev.nodes))
    return out


# -- the fixture ------------------------------------------------------------------------------------------

StackFactory = Callable[..., Awaitable[E2E]]


@pytest_asyncio.fixture
async def open_stack(nats_url: str, redis_url: str, namespace: str, tmp_path: Path) -> AsyncIterator[StackFactory]:
    """`await open_stack(domains=2, settings={...}, token=..., **StackOptions)` → a started E2E (stopped at teardown).

    `token`: the bearer token the E2E's HTTP session sends (with settings={"tokens_file": ...})."""
    opened: list[E2E] = []

    async def open_(*, settings: dict[str, Any] | None = None, token: str | None = None, **opts: Any) -> E2E:
        s = e2e_settings(nats_url, redis_url, namespace, **(settings or {}))
        log_dir = tmp_path / f"stack{len(opened)}"
        log_dir.mkdir()
        stack = Stack(StackOptions(settings=s, log_dir=log_dir, **opts))
        nc = await nats.connect(nats_url, connect_timeout=5)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=headers)
        e2e = E2E(stack, http, nc, log_dir)
        opened.append(e2e)
        await stack.start()
        nodes = stack.opts.domains * stack.opts.nodes_per_domain if stack.opts.agents else 0
        if nodes and "gateway" in stack.services:
            await e2e.wait_nodes(nodes)
        return e2e

    try:
        yield open_
    finally:
        for e2e in opened:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(e2e.stack.stop(), 60)
            await e2e.http.close()
            with contextlib.suppress(Exception):
                await e2e.nc.close()
        await delete_nats_namespace(nats_url, namespace)
        await delete_redis_namespace(redis_url, namespace)
