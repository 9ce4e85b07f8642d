#!/usr/bin/env python3
"""The running system at fleet scale: 278 NVL72 domains (5,004 nodes, 20,016 GPUs) by default, as `rackscale up
--domains 278` runs it (services in this process, the simulated agents in child processes of their own).

    python bench/scale_bench.py [--domains 278] [--fleet-processes N] [--idle-s 600] [--latency-jobs 100]
                                [--running-jobs 5000] [--cluster-gets 20]

Measures, in order (one JSON document on stdout):
(a) start: seconds from launching the fleet processes until every node is up (target ≤ 60 s);
(b) idle: for `--idle-s` at the default periods (heartbeat 1 s, telemetry 5 s), every node verdict heard on
    `names.node_events` (target: no node marked down) and each process's CPU (target: the control plane —
    every process but the agents: this one with the services, nats-server, Valkey — ≤ 35% of one core);
(c) `GET /v1/cluster`: `--cluster-gets` requests one after the other, p50 and max (target ≤ 100 ms);
(d) single jobs: `--latency-jobs` 1-GPU jobs submitted one at a time, POST → `running` p50/p99 (target p99 ≤
    100 ms);
(e) a full cycle next to `--running-jobs` running 1-GPU jobs: the queue's timer cycles (which read every active
    job and allocation) timed while they all run (target ≤ 250 ms), and `/v1/cluster` again.

Figures, with the day and the machine, go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import nats
from nats.aio.msg import Msg

from bench.e2e_bench import BenchConfig, CpuSampler, Events, busy_phase, percentile, post_job, summary_ms
from shared.schemas import EVENTS, NodeChanged

TARGETS = {"all_up_s": 60.0, "control_plane_idle_pct": 35.0, "cluster_ms": 100.0, "latency_p99_ms": 100.0}
FULL_CYCLE_TARGET_MS = 250.0
CONTROL_PLANE = ("stack", "nats-server", "valkey", "gateway")  # "gateway": when in a process of its own


class Verdicts:
    """Every NodeChanged heard: how many nodes went to each state, and the reasons of the downs."""

    def __init__(self) -> None:
        self.states: Counter[str] = Counter()
        self.down: list[str] = []

    async def on_msg(self, m: Msg) -> None:
        ev = EVENTS.decode(m.data)
        if isinstance(ev, NodeChanged):
            self.states[ev.state] += 1
            if ev.state == "down":
                self.down.append(f"{ev.node}: {ev.reason}")


async def time_cluster(http: aiohttp.ClientSession, url: str, n: int) -> dict[str, Any]:
    took = []
    nodes = 0
    for _ in range(n):
        t0 = time.perf_counter()
        async with http.get(f"{url}/v1/cluster") as r:
            body = await r.read()
        took.append(time.perf_counter() - t0)  # the response whole; parsing it is the client's own time
        nodes = sum(len(d["nodes"]) for d in json.loads(body)["domains"])
    return {"requests": n, "nodes": nodes, **summary_ms(took)}


async def single_jobs(http: aiohttp.ClientSession, url: str, events: Events, n: int) -> dict[str, Any]:
    took, failures = [], Counter[str]()
    for i in range(n + 5):  # the first five warm up
        t0 = time.perf_counter()
        status, doc = await post_job(http, url, {"name": f"lat-{i}", "tenant": "lat", "gpus": 1, "duration_s": 0.2})
        if status != 202:
            failures[f"HTTP {status}: {doc.get('error')}"] += 1
            continue
        try:
            state, t_run = await asyncio.wait_for(events.started(doc["id"]), 30)
        except TimeoutError:
            failures["not running within 30 s"] += 1
            continue
        if state == "running" and i >= 5:
            took.append(t_run - t0)
    return {"jobs": len(took), "submit_to_running_ms": summary_ms(took), "failures": dict(failures)}


def time_cycles(queue: Any) -> list[tuple[bool, float]]:
    """Wrap the in-process queue's `run_cycle` so each cycle's kind and duration is recorded (bench only)."""
    cycles: list[tuple[bool, float]] = []
    inner = queue.run_cycle

    async def timed(*, full: bool = True) -> None:
        t0 = time.perf_counter()
        try:
            await inner(full=full)
        finally:
            cycles.append((full, time.perf_counter() - t0))

    queue.run_cycle = timed
    return cycles


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from services.cli.up import fleet_processes_for, in_process_for
    from services.stack import Stack, StackOptions
    from shared.settings import Settings

    prefix = f"scale{uuid.uuid4().hex[:6]}"
    settings = Settings(prefix=prefix, gateway_port=0, log_level="WARNING")
    nodes = args.domains * 18
    shards = args.fleet_processes if args.fleet_processes is not None else fleet_processes_for(nodes)
    in_process = StackOptions.in_process if args.gateway_in_process else in_process_for(shards)
    stack = Stack(
        StackOptions(
            domains=args.domains,
            settings=settings,
            agents=False,
            fleet_timeout_s=args.up_timeout,
            in_process=in_process,
        )
    )
    out: dict[str, Any] = {
        "config": vars(args) | {"fleet_processes": shards},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_at_start": os.getloadavg()},
        "fleet": {"domains": args.domains, "nodes": nodes, "gpus": nodes * 4},
    }
    await stack.start()
    if "gateway" in stack.processes:
        await stack.wait_gateway(60.0)
    names = settings.names()
    nc = await nats.connect(stack.nats_url)
    verdicts, events = Verdicts(), Events()
    await nc.subscribe(names.node_events, cb=verdicts.on_msg)
    await nc.subscribe(names.job_events_all, cb=events.on_msg)
    queue = stack.services["queue"]
    cycles = time_cycles(queue)
    try:
        t0 = time.perf_counter()
        await stack.start_fleet_processes(shards)
        out["start"] = {"all_up_s": round(time.perf_counter() - t0, 1), "verdicts": dict(verdicts.states)}
        pids = {"stack": os.getpid()}
        for name, server in (("nats-server", stack.nats), ("valkey", stack.redis)):
            if server is not None and server.pid is not None:
                pids[name] = server.pid
        pids.update({f"fleet-{i}": p.pid for i, p in enumerate(stack.fleet_shards)})
        pids.update({name: p.pid for name, p in stack.processes.items()})
        sampler = CpuSampler(pids, period_s=1.0)
        sampling = asyncio.ensure_future(sampler.run())
        verdicts.states.clear()
        await asyncio.sleep(5.0)  # the registrations' wake settles
        t_idle = time.time()
        await asyncio.sleep(args.idle_s)
        sampler.sample()
        span, cpu = sampler._between(t_idle, time.time())
        per = {k: round(100 * v / span, 1) for k, v in cpu.items()}
        out["idle"] = {
            "s": round(span, 1),
            "cpu_pct": per,
            "control_plane_pct": round(sum(per.get(k, 0.0) for k in CONTROL_PLANE), 1),
            "agents_pct": round(sum(v for k, v in per.items() if k.startswith("fleet-")), 1),
            "verdicts": dict(verdicts.states),
            "down": verdicts.down[:10],
            "full_cycles_ms": [round(1000 * s, 1) for full, s in cycles if full][-5:],
        }
        async with aiohttp.ClientSession() as http:
            out["cluster_idle_ms"] = await time_cluster(http, stack.gateway_url, args.cluster_gets)
            out["single_jobs"] = await single_jobs(http, stack.gateway_url, events, args.latency_jobs)
            if args.running_jobs:
                # day-long 1-GPU jobs by 8 clients, until all run (e2e_bench's busy cluster)
                out["fill"] = await busy_phase(http, stack.gateway_url, events, BenchConfig(busy=args.running_jobs))
                before = len(cycles)
                deadline = time.perf_counter() + 6 * settings.cycle_interval_s + 30
                while sum(full for full, _ in cycles[before:]) < 5 and time.perf_counter() < deadline:
                    await asyncio.sleep(0.5)
                full = [s for is_full, s in cycles[before:] if is_full]
                out["busy"] = {
                    "running": args.running_jobs,
                    "full_cycle_ms": [round(1000 * s, 1) for s in full],
                    "full_cycle_median_ms": round(1000 * statistics.median(full), 1) if full else None,
                    "kicked_cycle_p50_ms": round(1000 * percentile([s for f, s in cycles[before:] if not f], 50), 2),
                }
                t_busy = time.time()
                await asyncio.sleep(10.0)  # the busy cluster's background, before the requests below add to it
                sampler.sample()
                span, cpu = sampler._between(t_busy, time.time())
                out["busy"]["cpu_pct"] = {k: round(100 * v / span, 1) for k, v in cpu.items()}
                out["cluster_busy_ms"] = await time_cluster(http, stack.gateway_url, args.cluster_gets)
        out["verdicts_total_after_up"] = dict(verdicts.states)
        sampling.cancel()
    finally:
        await nc.close()
        await stack.stop()
    out["machine"]["load_at_end"] = os.getloadavg()
    lat = out["single_jobs"]["submit_to_running_ms"]["p99"]
    full_ms = out.get("busy", {}).get("full_cycle_median_ms")
    out["targets"] = {
        "all_up_s": {"target": TARGETS["all_up_s"], "got": out["start"]["all_up_s"]},
        "none_down_idle": {"target": 0, "got": out["idle"]["verdicts"].get("down", 0)},
        "control_plane_idle_pct": {
            "target": TARGETS["control_plane_idle_pct"],
            "got": out["idle"]["control_plane_pct"],
        },
        "cluster_p50_ms": {"target": TARGETS["cluster_ms"], "got": out["cluster_idle_ms"]["p50"]},
        "latency_p99_ms": {"target": TARGETS["latency_p99_ms"], "got": lat},
        "full_cycle_ms": {"target": FULL_CYCLE_TARGET_MS, "got": full_ms},
    }
    for row in out["targets"].values():
        row["met"] = row["got"] is not None and row["got"] <= row["target"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", type=int, default=278)
    p.add_argument("--fleet-processes", type=int, default=None, help="default: as `rackscale up` chooses")
    p.add_argument("--idle-s", type=float, default=600.0)
    p.add_argument("--latency-jobs", type=int, default=100)
    p.add_argument("--running-jobs", type=int, default=5000)
    p.add_argument("--cluster-gets", type=int, default=20)
    p.add_argument("--up-timeout", type=float, default=300.0)
    p.add_argument(
        "--gateway-in-process",
        action="store_true",
        help="the gateway in the services' process (default: as `rackscale up` chooses: its own past 576 nodes)",
    )
    args = p.parse_args()
    print(json.dumps(asyncio.run(bench(args)), indent=2, default=str))


if __name__ == "__main__":
    main()
