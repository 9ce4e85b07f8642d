#!/usr/bin/env python3
"""End-to-end benchmark: the whole system (`services.stack.Stack`) on a 64-domain simulated fleet, over HTTP.

    python bench/e2e_bench.py [--domains 64] [--latency-jobs 300] [--throughput-s 10] [--clients 8]
                              [--same-process] [--profile FILE.prof] [--agents-process]
                              [--process inventory,migration,placement] [--services-process] [--busy N]
                              [--blocked GPUS]

The stack runs in this process with embedded NATS and Valkey: 64 NVL72 domains = 1,152 simulated agents
(in-process, one fleet), heartbeat 1 s. `--agents-process` runs the agents in a child process instead (as
they would run on their own nodes); `--process NAMES` runs those services as child processes, as they are
deployed (`--services-process`: every service but the gateway). With everything in one event loop, the
1,152 agents' heartbeats and telemetry that inventory handles queue in front of every job's messages. A
load generator — by default in a child process, as a real client would be, so it doesn't share the
stack's event loop (`--same-process` puts it in) — then measures:

(a) latency: ~300 small jobs (1-4 GPUs, duration 0.2 s) submitted one at a time; for each, from the start of
    the POST to the `running` JobEvent for it, heard on a core NATS subscription to `names.job_events_all`;
    p50/p99, with the intermediate marks (202 answered, pending, placed) to show where the time goes;
(b) throughput: several concurrent HTTP clients submit as fast as they can for 10 s; accepted submissions/s;
    then every accepted job must reach a terminal state (succeeded/failed/cancelled), counted both from the
    events and from the API (`GET /v1/jobs?tenant=...&state=...` totals): nothing lost means
    accepted == terminal.

(c) where the CPU goes: every process's CPU time (the stack's, nats-server's, Valkey's, the fleet's and the
    service processes') is sampled through both phases; `cpu_latency_phase` gives each one's idle rate (5 s
    before the load), its rate during (a) and the CPU per job beyond idle (`cpu_ms_per_job`, Linux only).

`--busy N` first starts N 1-GPU jobs that run for a day, so (a) and (b) decide next to N held allocations;
(c)'s idle window and the profile come after that (the busy cluster's background is then idle load).
`--blocked GPUS` then submits one day-long job of that many GPUs (4 per node, NVLink required, segments of 16
nodes) that must wait: every cycle of (a) and (b) decides next to its reservation, as on a busy cluster where
a large job waits for domains to drain. The bench checks that it is still pending, reserved, at the end.

One JSON document on stdout. Targets on the 2-core dev machine: p50 < 10 ms, p99 < 50 ms, >= 300
submissions/s, nothing lost. `--profile` runs cProfile over the stack's process during (a) and (b), writes
the .prof and adds the hottest functions and the time per component (service, library) to the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import json
import multiprocessing
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import msgspec
import nats
from nats.aio.msg import Msg

from shared.names import Names
from shared.schemas import EVENTS, JobEvent

TERMINAL = ("succeeded", "failed", "cancelled")
IDLE_CALLS = frozenset({"<method 'poll' of 'select.epoll' objects>", "<method 'select' of 'select.epoll' objects>"})
IDLE_WINDOW_S = 5.0  # the processes' idle CPU rate is measured this long before the load starts
TARGETS = {"latency_p50_ms": 10.0, "latency_p99_ms": 50.0, "submissions_per_s": 300.0}


@dataclass(frozen=True, slots=True)
class BenchConfig:
    domains: int = 64
    heartbeat_s: float = 1.0
    latency_jobs: int = 300
    warmup_jobs: int = 10
    throughput_s: float = 10.0
    clients: int = 8
    drain_timeout_s: float = 600.0
    register_timeout_s: float = 60.0
    seed: int = 1
    same_process: bool = False
    profile: str | None = None
    # where the parts run: all in this process (default), or agents / services as child processes, as
    # they would be deployed (agents on their own nodes)
    agents_process: bool = False
    services_process: bool = False
    # services run as child processes besides those (--process inventory,migration); the gateway stays here
    processes: tuple[str, ...] = ()
    busy: int = 0  # long 1-GPU jobs started before the latency phase, so it runs on a busy cluster
    blocked: int = 0  # GPUs of a large job that waits (reserved) through the measured phases; 0: none


def small_job(rng: random.Random, tenant: str, i: int) -> dict[str, Any]:
    return {"name": f"{tenant}-{i}", "tenant": tenant, "gpus": rng.choice((1, 2, 4)), "duration_s": 0.2}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def summary_ms(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "p50": round(percentile(ms, 50), 2),
        "p90": round(percentile(ms, 90), 2),
        "p99": round(percentile(ms, 99), 2),
        "max": round(max(ms), 2) if ms else float("nan"),
        "mean": round(statistics.fmean(ms), 2) if ms else float("nan"),
    }


# -- the load generator ---------------------------------------------------------------------------------------


class Events:
    """JobEvents heard on a core subscription: when each job first reached each state (perf_counter)."""

    def __init__(self) -> None:
        self.first: dict[str, dict[str, float]] = {}
        self.terminal: set[str] = set()
        self.waiters: dict[str, asyncio.Future[tuple[str, float]]] = {}
        self.count = 0

    async def on_msg(self, m: Msg) -> None:
        now = time.perf_counter()
        try:
            ev = EVENTS.decode(m.data)
        except msgspec.DecodeError:
            return
        if not isinstance(ev, JobEvent):
            return
        self.count += 1
        state = ev.state.value
        seen = self.first.setdefault(ev.job_id, {})
        seen.setdefault(state, now)
        if state in TERMINAL:
            self.terminal.add(ev.job_id)
        if state == "running" or state in TERMINAL:
            fut = self.waiters.pop(ev.job_id, None)
            if fut is not None and not fut.done():
                fut.set_result((state, now))

    def started(self, job_id: str) -> asyncio.Future[tuple[str, float]]:
        """Resolves with ("running", t) — or (terminal state, t) for a job that ended without a running event."""
        fut: asyncio.Future[tuple[str, float]] = asyncio.get_running_loop().create_future()
        seen = self.first.get(job_id, {})
        done = [(s, t) for s, t in seen.items() if s == "running" or s in TERMINAL]
        if done:
            fut.set_result(min(done, key=lambda st: st[1]))
        else:
            self.waiters[job_id] = fut
        return fut


async def post_job(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with http.post(f"{url}/v1/jobs", json=body) as r:
        return r.status, await r.json()


async def busy_phase(http: aiohttp.ClientSession, url: str, events: Events, cfg: BenchConfig) -> dict[str, Any]:
    """Start `cfg.busy` 1-GPU jobs that run for a day (tenant "busy") and wait until they all run: the latency
    phase then decides next to that many held allocations, as on a busy cluster."""
    ids: list[str] = []
    refused: Counter[str] = Counter()
    todo = iter(range(cfg.busy))
    start = time.perf_counter()

    async def client() -> None:
        for i in todo:
            body = {"name": f"busy-{i}", "tenant": "busy", "gpus": 1, "duration_s": 86_400.0}
            status, doc = await post_job(http, url, body)
            if status == 202:
                ids.append(doc["id"])
            else:
                refused[f"HTTP {status}: {doc.get('error')}"] += 1

    await asyncio.gather(*(client() for _ in range(cfg.clients)))
    submitted_s = time.perf_counter() - start
    running = 0
    while time.perf_counter() - start < 300:
        running = sum(1 for j in ids if "running" in events.first.get(j, {}))
        if running == len(ids):
            break
        await asyncio.sleep(0.2)
    return {
        "jobs": len(ids),
        "running": running,
        "refused": dict(refused),
        "submitted_s": round(submitted_s, 2),
        "all_running_s": round(time.perf_counter() - start, 2),
    }


async def latency_phase(
    http: aiohttp.ClientSession, url: str, events: Events, cfg: BenchConfig, rng: random.Random
) -> dict[str, Any]:
    marks: dict[str, list[float]] = {"accepted": [], "pending": [], "placed": [], "running": []}
    failures: Counter[str] = Counter()
    t_start = time.time()
    skipped: list[dict[str, Any]] = []
    for i in range(cfg.warmup_jobs + cfg.latency_jobs):
        if i == cfg.warmup_jobs:
            t_start = time.time()  # the measured jobs' window
        t0 = time.perf_counter()
        status, doc = await post_job(http, url, small_job(rng, "lat", i))
        t_acc = time.perf_counter()
        if status != 202:
            failures[f"HTTP {status}: {doc.get('error')}"] += 1
            continue
        job_id = doc["id"]
        try:
            state, t_run = await asyncio.wait_for(events.started(job_id), 30)
        except TimeoutError:
            async with http.get(f"{url}/v1/jobs/{job_id}") as r:
                rec = await r.json()
            seen = sorted(events.first.get(job_id, {}))
            failures[f"not running within 30 s (job #{i}: {rec.get('state')} {rec.get('reason')!r}, heard {seen})"] += 1
            events.waiters.pop(job_id, None)
            continue
        if state != "running":
            # the queue saw the rank exit with no running transition (see the report): no latency to measure
            async with http.get(f"{url}/v1/jobs/{job_id}") as r:
                rec = await r.json()
            skipped.append({"job": job_id, "state": state, "started_at": rec.get("started_at")})
            continue
        if i < cfg.warmup_jobs:
            continue
        seen = events.first.get(job_id, {})
        marks["accepted"].append(t_acc - t0)
        marks["running"].append(t_run - t0)
        for state in ("pending", "placed"):
            if state in seen:
                marks[state].append(seen[state] - t0)
    return {
        "jobs": len(marks["running"]),
        "window": [t_start, time.time()],  # wall clock, so the stack's process can account its CPU to the phase
        "submit_to_running_ms": summary_ms(marks["running"]),
        "marks_ms_p50": {k: round(percentile([v * 1000 for v in vs], 50), 2) for k, vs in marks.items()},
        "marks_ms_p99": {k: round(percentile([v * 1000 for v in vs], 99), 2) for k, vs in marks.items()},
        "failures": dict(failures),
        "ended_without_running_event": len(skipped),
        "ended_without_running_event_sample": skipped[:3],
    }


async def api_terminal_counts(http: aiohttp.ClientSession, url: str, tenant: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for state in ("pending", "placed", "running", "preempted", *TERMINAL):
        async with http.get(f"{url}/v1/jobs", params={"tenant": tenant, "state": state, "limit": 1}) as r:
            counts[state] = int((await r.json())["total"])
    return counts


async def throughput_phase(
    http: aiohttp.ClientSession, url: str, events: Events, cfg: BenchConfig, rng: random.Random
) -> dict[str, Any]:
    accepted: list[str] = []
    answer_s: list[float] = []
    refused: Counter[str] = Counter()
    seq = 0

    async def client(deadline: float) -> None:
        nonlocal seq
        while time.perf_counter() < deadline:
            seq += 1
            t0 = time.perf_counter()
            try:
                status, doc = await post_job(http, url, small_job(rng, "tput", seq))
            except aiohttp.ClientError as e:
                refused[type(e).__name__] += 1
                continue
            answer_s.append(time.perf_counter() - t0)
            if status == 202:
                accepted.append(doc["id"])
            else:
                refused[f"HTTP {status}: {doc.get('error')}"] += 1

    start = time.perf_counter()
    deadline = start + cfg.throughput_s
    await asyncio.gather(*(client(deadline) for _ in range(cfg.clients)))
    elapsed = time.perf_counter() - start
    ids = set(accepted)

    # every accepted job must end: wait on the events, then check the API's record
    drain_start = time.perf_counter()
    while not ids <= events.terminal and time.perf_counter() - drain_start < cfg.drain_timeout_s:
        await asyncio.sleep(0.2)
    drain_s = time.perf_counter() - drain_start
    heard = len(ids & events.terminal)
    counts = await api_terminal_counts(http, url, "tput")
    for _ in range(50):  # the last terminal record may land just after its event
        if sum(counts[s] for s in TERMINAL) >= len(ids):
            break
        await asyncio.sleep(0.1)
        counts = await api_terminal_counts(http, url, "tput")
    api_terminal = sum(counts[s] for s in TERMINAL)
    runs = [
        events.first[j]["running"] - events.first[j].get("pending", 0.0)
        for j in ids
        if "running" in events.first.get(j, {})
    ]
    return {
        "clients": cfg.clients,
        "seconds": round(elapsed, 2),
        "accepted": len(ids),
        "accepted_per_s": round(len(ids) / elapsed, 1),
        "refused": dict(refused),
        "answer_ms": summary_ms(answer_s),
        "terminal_by_events": heard,
        "terminal_by_api": api_terminal,
        "states_by_api": counts,
        "lost": len(ids) - api_terminal,
        "drain_s_after_submitting": round(drain_s, 2),
        "completed_per_s": round(len(ids) / (elapsed + drain_s), 1),
        "pending_to_running_ms": summary_ms(runs) if runs else {},
    }


@contextlib.asynccontextmanager
async def session(
    url: str, nats_url: str, prefix: str, cfg: BenchConfig
) -> AsyncIterator[tuple[aiohttp.ClientSession, Events]]:
    """An HTTP session to the gateway and the job events heard on a core NATS subscription."""
    events = Events()
    nc = await nats.connect(nats_url)
    try:
        await nc.subscribe(Names(prefix=prefix).job_events_all, cb=events.on_msg, pending_msgs_limit=1_000_000)
        await nc.flush()
        conn = aiohttp.TCPConnector(limit=cfg.clients)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60)) as http:
            yield http, events
    finally:
        await nc.close()


async def drive(url: str, nats_url: str, prefix: str, cfg: BenchConfig) -> dict[str, Any]:
    """Both phases against a running system; the results as a dict."""
    rng = random.Random(cfg.seed)
    async with session(url, nats_url, prefix, cfg) as (http, events):
        latency = await latency_phase(http, url, events, cfg, rng)
        throughput = await throughput_phase(http, url, events, cfg, rng)
    return {"latency": latency, "throughput": throughput, "job_events_heard": events.count}


async def make_busy(url: str, nats_url: str, prefix: str, cfg: BenchConfig) -> dict[str, Any]:
    """The busy phase, from this process, before the idle window and the load generator start."""
    async with session(url, nats_url, prefix, cfg) as (http, events):
        return await busy_phase(http, url, events, cfg)


BLOCKED_SEGMENT_NODES = 16


async def submit_blocked(url: str, cfg: BenchConfig) -> dict[str, Any]:
    """The large job that waits through the measured phases (`--blocked`), until the queue has reserved it."""
    body = {
        "name": "blocked",
        "tenant": "blocked",
        "gpus": cfg.blocked,
        "gpus_per_node": 4,
        "topology": {"nvlink": "required", "segment": BLOCKED_SEGMENT_NODES},
        "duration_s": 86_400.0,
    }
    async with aiohttp.ClientSession() as http:
        status, doc = await post_job(http, url, body)
        if status != 202:
            raise SystemExit(f"--blocked {cfg.blocked}: the job was refused: HTTP {status} {doc}")
        job_id = doc["id"]
        rec = await blocked_state(http, url, job_id)
        start = time.perf_counter()
        while "reserved" not in rec["reason"] and time.perf_counter() - start < 30:
            await asyncio.sleep(0.2)
            rec = await blocked_state(http, url, job_id)
        if rec["state"] != "pending" or "reserved" not in rec["reason"]:
            raise SystemExit(f"--blocked {cfg.blocked}: the job should wait reserved, it is {rec}")
        return rec


async def blocked_state(http: aiohttp.ClientSession, url: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{url}/v1/jobs/{job_id}") as r:
        doc = await r.json()
        if r.status == 404:  # accepted, not stored yet by the queue
            return {"id": job_id, "state": "accepted", "reason": ""}
    return {"id": job_id, "state": doc["state"], "reason": doc.get("reason", "")}


def _child(url: str, nats_url: str, prefix: str, cfg: BenchConfig, conn: Connection) -> None:
    try:
        conn.send(("ok", asyncio.run(drive(url, nats_url, prefix, cfg))))
    except BaseException as e:
        conn.send(("error", repr(e)))
        raise


async def drive_in_child(url: str, nats_url: str, prefix: str, cfg: BenchConfig) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(url, nats_url, prefix, cfg, theirs), daemon=True)
    proc.start()
    theirs.close()
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(mine.fileno(), ready.set)
    try:
        while not ready.is_set():
            if not proc.is_alive() and not mine.poll():
                raise RuntimeError(f"the load generator exited with {proc.exitcode} without a result")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), 1.0)
        kind, payload = mine.recv()
    finally:
        loop.remove_reader(mine.fileno())
        proc.join(10)
    if kind != "ok":
        raise RuntimeError(f"the load generator failed: {payload}")
    return dict(payload)


# -- the stack ----------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux /proc); None when it can't be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CpuSampler:
    """Every process's CPU time, sampled every `period_s` (wall clock), to account it to a phase afterwards:
    the job path's CPU per job is what the latency phase used beyond the processes' idle rate."""

    def __init__(self, pids: dict[str, int], period_s: float = 0.25) -> None:
        self.pids = pids
        self.period_s = period_s
        self.samples: list[tuple[float, dict[str, float]]] = []

    def sample(self) -> None:
        now = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.samples.append((time.time(), {k: v for k, v in now.items() if v is not None}))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.period_s)

    def _between(self, t0: float, t1: float) -> tuple[float, dict[str, float]]:
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return 0.0, {}
        (ta, a), (tb, b) = inside[0], inside[-1]
        return tb - ta, {k: b[k] - a[k] for k in b if k in a}

    def report(self, idle: tuple[float, float], phase: tuple[float, float], jobs: int) -> dict[str, Any]:
        idle_s, idle_cpu = self._between(*idle)
        phase_s, phase_cpu = self._between(*phase)
        out: dict[str, Any] = {"idle_window_s": round(idle_s, 1), "phase_window_s": round(phase_s, 1), "processes": {}}
        if not idle_s or not phase_s or not jobs:
            return out
        total = {"idle_pct": 0.0, "phase_pct": 0.0, "cpu_ms_per_job": 0.0}
        rate = jobs / phase_s
        for name in phase_cpu:
            idle_pct = 100 * idle_cpu.get(name, 0.0) / idle_s
            phase_pct = 100 * phase_cpu[name] / phase_s
            row = {"idle_pct": idle_pct, "phase_pct": phase_pct, "cpu_ms_per_job": 10 * (phase_pct - idle_pct) / rate}
            out["processes"][name] = {k: round(v, 2) for k, v in row.items()}
            total = {k: total[k] + row[k] for k in total}
        out["total"] = {k: round(v, 2) for k, v in total.items()}
        return out


def component(filename: str) -> str:
    """Which part of the system a profiled function belongs to."""
    path = filename.replace("\\", "/")
    for mark in ("/services/", "/shared/"):
        if mark in path:
            rest = path.split(mark, 1)[1]
            head = rest.split("/", 1)[0]
            return f"{mark.strip('/')}/{head.removesuffix('.py')}"
    for lib in ("nats", "redis", "aiohttp", "msgspec", "asyncio", "opentelemetry", "multidict", "yarl"):
        if f"/{lib}/" in path:
            return lib
    if path.startswith("~") or path.startswith("<"):
        return "builtins"
    return "other"


def profile_report(prof: cProfile.Profile, path: str, top: int = 25) -> dict[str, Any]:
    """Where the stack's process spent its time: busy share per component, the hottest functions by self time,
    and Rackscale's own functions by cumulative time. `entries` counts calls with every resume of a coroutine."""
    prof.dump_stats(path)
    stats = pstats.Stats(prof)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    # the event loop waiting in epoll is idle time, not work
    idle = sum(v[2] for k, v in raw.items() if k[2] in IDLE_CALLS)
    raw_total = sum(v[2] for v in raw.values())
    busy = max(raw_total - idle, 1e-9)
    by_component: Counter[str] = Counter()
    for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in raw.items():
        if name not in IDLE_CALLS:
            by_component[component(filename)] += tt
    rows = sorted(((k, v) for k, v in raw.items() if k[2] not in IDLE_CALLS), key=lambda kv: kv[1][2], reverse=True)
    rows = rows[:top]
    cum_rows = sorted(
        ((k, v) for k, v in raw.items() if "/services/" in k[0] or "/shared/" in k[0]),
        key=lambda kv: kv[1][3],
        reverse=True,
    )[:top]

    def where(k: tuple[str, int, str]) -> str:
        filename, line, name = k
        short = filename.split("/work/main/")[-1].split("site-packages/")[-1]
        return f"{short}:{line}:{name}"

    return {
        "file": path,
        "profiled_wall_s": round(raw_total, 2),
        "event_loop_idle_s": round(idle, 2),
        "busy_s": round(busy, 2),
        "busy_share_by_component": {k: round(v / busy, 3) for k, v in by_component.most_common() if v / busy >= 0.005},
        "top_self_time": [
            {"function": where(k), "self_s": round(v[2], 3), "entries": v[1], "cum_s": round(v[3], 3)} for k, v in rows
        ],
        "top_cumulative_in_rackscale": [
            {"function": where(k), "cum_s": round(v[3], 3), "entries": v[1]} for k, v in cum_rows
        ],
    }


async def node_counts(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with http.get(f"{url}/v1/cluster") as r:
        doc = await r.json()
    states = Counter(n["state"] for d in doc["domains"] for n in d["nodes"])
    return {"registered": sum(states.values()), **{s: states.get(s, 0) for s in ("up", "draining", "down")}}


async def wait_registered(url: str, nodes: int, timeout_s: float) -> dict[str, Any]:
    """Until every node is registered and up, or `timeout_s`: an overloaded stack may never get there (the
    load then runs on the nodes that are up, and the result says how many were)."""
    start = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        while True:
            counts = await node_counts(http, url)
            waited = time.perf_counter() - start
            if counts["up"] >= nodes or waited > timeout_s:
                return {"waited_s": round(waited, 2), "all_up": counts["up"] >= nodes, **counts}
            await asyncio.sleep(0.5)


async def bench(cfg: BenchConfig) -> dict[str, Any]:
    from services.stack import Stack, StackOptions
    from shared.settings import Settings

    prefix = f"bench{uuid.uuid4().hex[:6]}"
    settings = Settings(prefix=prefix, gateway_port=0, heartbeat_s=cfg.heartbeat_s, log_level="WARNING")
    # the gateway stays here: the bench needs its port, which a child picks on its own
    in_process = ("gateway",) if cfg.services_process else StackOptions.in_process
    in_process = tuple(n for n in in_process if n not in cfg.processes)
    migration_process = cfg.services_process or "migration" in cfg.processes
    stack = Stack(
        StackOptions(
            domains=cfg.domains,
            settings=settings,
            agents=not cfg.agents_process,
            in_process=in_process,
            migration="process" if migration_process else "in_process",
        )
    )
    t0 = time.perf_counter()
    await stack.start()
    fleet: subprocess.Popen[bytes] | None = None
    if cfg.agents_process:
        cmd = [sys.executable, "-m", "services.fleet", "--domains", str(cfg.domains)]
        fleet = subprocess.Popen(cmd, env=stack._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "fleet": {"domains": cfg.domains, "nodes": cfg.domains * 18, "gpus": cfg.domains * 72},
    }
    try:
        started = time.perf_counter() - t0
        result["startup"] = {
            "stack_s": round(started, 2),
            "nodes_before_load": await wait_registered(stack.gateway_url, cfg.domains * 18, cfg.register_timeout_s),
        }
        pids = {"stack": os.getpid()}
        for name, server in (("nats-server", stack.nats), ("valkey", stack.redis)):
            if server is not None and server.pid is not None:
                pids[name] = server.pid
        if fleet is not None:
            pids["fleet"] = fleet.pid
        pids.update({f"service:{name}": p.pid for name, p in stack.processes.items()})
        if cfg.busy:
            result["busy"] = await make_busy(stack.gateway_url, stack.nats_url, prefix, cfg)
        if cfg.blocked:
            result["blocked"] = await submit_blocked(stack.gateway_url, cfg)
        sampler = CpuSampler(pids)
        sampling = asyncio.ensure_future(sampler.run())
        idle = (time.time(), time.time() + IDLE_WINDOW_S)
        await asyncio.sleep(IDLE_WINDOW_S)
        prof = cProfile.Profile() if cfg.profile else None
        if prof is not None:
            prof.enable()
        try:
            if cfg.same_process:
                load = await drive(stack.gateway_url, stack.nats_url, prefix, cfg)
            else:
                load = await drive_in_child(stack.gateway_url, stack.nats_url, prefix, cfg)
        finally:
            if prof is not None:
                prof.disable()
        sampling.cancel()
        sampler.sample()
        window = load["latency"].pop("window")
        result["cpu_latency_phase"] = sampler.report(idle, (window[0], window[1]), load["latency"]["jobs"])
        result.update(load)
        queue = stack.services.get("queue")
        result["queue_cycles"] = getattr(queue, "cycles", None)
        async with aiohttp.ClientSession() as http:
            result["nodes_at_end"] = await node_counts(http, stack.gateway_url)
            if cfg.blocked:
                result["blocked_at_end"] = await blocked_state(http, stack.gateway_url, result["blocked"]["id"])
        if prof is not None and cfg.profile:
            result["profile"] = profile_report(prof, cfg.profile)
    finally:
        if fleet is not None:
            fleet.terminate()
            fleet.wait(30)
        await stack.stop()
    result["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    lat = result["latency"]["submit_to_running_ms"]
    tput = result["throughput"]
    result["targets"] = {
        "latency_p50_ms": {"target": TARGETS["latency_p50_ms"], "got": lat["p50"], "met": lat["p50"] < 10},
        "latency_p99_ms": {"target": TARGETS["latency_p99_ms"], "got": lat["p99"], "met": lat["p99"] < 50},
        "submissions_per_s": {
            "target": TARGETS["submissions_per_s"],
            "got": tput["accepted_per_s"],
            "met": tput["accepted_per_s"] >= 300,
        },
        "nothing_lost": {"accepted": tput["accepted"], "terminal": tput["terminal_by_api"], "met": tput["lost"] == 0},
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--domains", type=int, default=64)
    p.add_argument("--heartbeat", type=float, default=1.0, help="agent heartbeat period (s)")
    p.add_argument("--latency-jobs", type=int, default=300)
    p.add_argument("--throughput-s", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--drain-timeout", type=float, default=600.0, help="bound on waiting for accepted jobs to end")
    p.add_argument("--register-timeout", type=float, default=60.0, help="bound on waiting for every node to be up")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--same-process", action="store_true", help="run the load generator in the stack's event loop")
    p.add_argument("--profile", default=None, metavar="FILE", help="cProfile the stack's process into FILE")
    p.add_argument("--agents-process", action="store_true", help="run the simulated agents in a child process")
    p.add_argument(
        "--services-process", action="store_true", help="run every service but the gateway as a child process"
    )
    p.add_argument(
        "--process",
        default="",
        metavar="NAMES",
        help="services to run as child processes, comma-separated (inventory, queue, placement, migration)",
    )
    p.add_argument(
        "--busy", type=int, default=0, metavar="N", help="start N day-long 1-GPU jobs before the latency phase"
    )
    p.add_argument(
        "--blocked",
        type=int,
        default=0,
        metavar="GPUS",
        help="then submit a day-long job of GPUS GPUs (segments of 16 nodes) that waits reserved throughout",
    )
    a = p.parse_args(argv)
    processes = tuple(x.strip() for x in a.process.split(",") if x.strip())
    unknown = set(processes) - {"inventory", "queue", "placement", "migration"}
    if unknown:
        p.error(f"--process: unknown service(s) {', '.join(sorted(unknown))}")
    cfg = BenchConfig(
        domains=a.domains,
        heartbeat_s=a.heartbeat,
        latency_jobs=a.latency_jobs,
        throughput_s=a.throughput_s,
        clients=a.clients,
        drain_timeout_s=a.drain_timeout,
        register_timeout_s=a.register_timeout,
        seed=a.seed,
        same_process=a.same_process,
        profile=a.profile,
        agents_process=a.agents_process,
        services_process=a.services_process,
        processes=processes,
        busy=a.busy,
        blocked=a.blocked,
    )
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    result = asyncio.run(bench(cfg))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
