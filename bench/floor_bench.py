#!/usr/bin/env python3
"""The floor under the running system's submit→running latency on this machine: the hops the architecture needs,
with no service logic at all.

    python bench/floor_bench.py [--jobs 300] [--background-domains 64] [--no-sync]

One job at a time, bare clients (aiohttp, nats-py, redis-py) in this one process, against an embedded
nats-server (JetStream, `sync_interval: always` as the stack runs it; `--no-sync` for NATS's default) and
Valkey: an HTTP POST whose handler publishes to JetStream and answers 202; four durable pull consumers, each
fetching one message, doing what its service must at least do and publishing the next message (queue: a Redis
script call, then the order; placement: a Redis script call, then the start command; agent: the started report;
queue: a Redis script call, then the running event); the running event heard on a core subscription, as
`e2e_bench.py` hears it. That is 5 fsynced JetStream writes, 4 fetches and acks and 3 Redis round trips,
fewer than the real path has (its `pending` and `placed` events, the in-flight mark, tracing), and none of
the services' own work (validation, the cycle, records).

`--background-domains N` first starts the embedded stack with an N-domain simulated fleet in a child process
(its own servers; idle: heartbeats, telemetry, the services' timers), as `e2e_bench.py` runs next to its
load: the same two cores are shared. 0 runs the chain alone.

One JSON document on stdout: `post_to_running_ms` p50/p90/p99 and the target it is measured against.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import nats
import redis.asyncio as aioredis
from aiohttp import web
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

from bench.e2e_bench import percentile, wait_registered
from shared.embedded import EmbeddedNats, EmbeddedValkey

TARGET_P50_MS = 10.0  # issue 3's p50 target for the whole system
WARMUP_JOBS = 20
RECORD = b"x" * 400  # about a job record's size
# the services' hops: (consumed subject, published subject, whether the hop makes a Redis round trip)
HOPS = (
    ("floor.submit", "floor.order", True),  # queue: store the job, decide, order
    ("floor.order", "floor.start", True),  # placement: commit, start command
    ("floor.start", "floor.started", False),  # agent: start the rank, report
    ("floor.started", "floor.running", True),  # queue: record the start, running event
)
SET_RETURNING_OLD = "local v = redis.call('GET', KEYS[1]); redis.call('SET', KEYS[1], ARGV[1]); return v"


async def hop(js: Any, script: Any, stop: asyncio.Event, consumed: str, published: str, uses_redis: bool) -> None:
    sub = await js.pull_subscribe(
        consumed, durable=consumed.replace(".", "_"), config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    )
    while not stop.is_set():  # nats-py turns a cancelled fetch into a timeout: the flag ends the loop
        try:
            msgs = await sub.fetch(1, timeout=0.25)
        except (nats.errors.TimeoutError, TimeoutError):
            continue
        for m in msgs:
            if uses_redis:
                await script(keys=[f"floor:{m.data.decode()}"], args=[RECORD])
            await js.publish(published, m.data)
            await m.ack()


async def chain(jobs: int, sync_always: bool) -> list[float]:
    """POST → running for each job, in ms (after the warm-up)."""
    ns, rv = EmbeddedNats(sync_always=sync_always).start(), EmbeddedValkey().start()
    nc = await nats.connect(ns.url)
    r = aioredis.from_url(rv.url)
    runner: web.AppRunner | None = None
    hops: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="FLOOR", subjects=["floor.>"], storage=StorageType.FILE))
        script = r.register_script(SET_RETURNING_OLD)
        hops = [asyncio.create_task(hop(js, script, stop, *h)) for h in HOPS]
        heard: dict[str, asyncio.Future[float]] = {}

        async def on_running(m: Any) -> None:
            fut = heard.pop(m.data.decode(), None)
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter())

        await nc.subscribe(HOPS[-1][1], cb=on_running)

        async def submit(request: web.Request) -> web.Response:
            body = await request.read()
            await js.publish(HOPS[0][0], body)
            return web.json_response({"id": body.decode()}, status=202)

        app = web.Application()
        app.router.add_post("/v1/jobs", submit)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        out: list[float] = []
        async with aiohttp.ClientSession() as http:
            for i in range(WARMUP_JOBS + jobs):
                job = f"j{i}"
                heard[job] = asyncio.get_running_loop().create_future()
                t0 = time.perf_counter()
                async with http.post(f"http://127.0.0.1:{port}/v1/jobs", data=job.encode()) as resp:
                    await resp.read()
                t_run = await asyncio.wait_for(heard[job], 10)
                if i >= WARMUP_JOBS:
                    out.append((t_run - t0) * 1000)
        return out
    finally:
        stop.set()
        for t in hops:
            t.cancel()
        await asyncio.gather(*hops, return_exceptions=True)
        if runner is not None:
            await runner.cleanup()
        await nc.close()
        await r.aclose()
        ns.stop()
        rv.stop()


async def serve_background(domains: int) -> None:
    """The child: the embedded stack with a simulated fleet, idle until told to stop."""
    from services.stack import Stack, StackOptions
    from shared.settings import Settings

    settings = Settings(prefix=f"floor{os.getpid()}", gateway_port=0, heartbeat_s=1.0, log_level="ERROR")
    stack = Stack(StackOptions(domains=domains, settings=settings, agents=False))
    await stack.start()
    cmd = [sys.executable, "-m", "services.fleet", "--domains", str(domains)]
    fleet = subprocess.Popen(cmd, env=stack._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        nodes = await wait_registered(stack.gateway_url, domains * 18, 60)
        print(json.dumps(nodes), flush=True)
        await stop.wait()
    finally:
        fleet.terminate()
        fleet.wait(30)
        await stack.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=300, help="jobs measured, one at a time (after 20 warm-up jobs)")
    p.add_argument("--background-domains", type=int, default=64, help="idle simulated fleet beside it (0: none)")
    p.add_argument("--no-sync", action="store_true", help="NATS's default fsync instead of every write")
    p.add_argument("--serve-background", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.serve_background:
        asyncio.run(serve_background(a.serve_background))
        return 0
    if a.jobs < 1 or a.background_domains < 0:
        p.error("--jobs must be >= 1 and --background-domains >= 0")
    background: subprocess.Popen[str] | None = None
    result: dict[str, Any] = {"jobs": a.jobs, "sync_always": not a.no_sync, "background_domains": a.background_domains}
    try:
        if a.background_domains:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-background", str(a.background_domains)]
            background = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert background.stdout is not None
            result["background_nodes"] = json.loads(background.stdout.readline() or "null")
        lat = asyncio.run(chain(a.jobs, not a.no_sync))
    finally:
        if background is not None:
            background.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                background.wait(60)
    p50 = round(percentile(lat, 50), 2)
    result["post_to_running_ms"] = {q: round(percentile(lat, v), 2) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))}
    result["target_p50_ms"] = {"target": TARGET_P50_MS, "floor_p50": p50, "room_left_ms": round(TARGET_P50_MS - p50, 2)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
