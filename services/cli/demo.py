"""`rackscale up` until the services exist: the scheduling core live on a simulated fleet, in the terminal.

Each tick advances simulated time, ends jobs whose time is up, submits a seeded random mix (single-node
jobs, 4-16-node NVLink jobs, segmented jobs of 32-64 nodes) and runs one scheduling cycle; the picture
shows every domain GPU by GPU and the pending jobs with their reasons. Ctrl-C stops it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.core import Allocate, ClusterState, CycleConfig, JobSpec, Preempt, Reserve, Scheduler, Topology
from shared.picture import job_letters, render


@dataclass(frozen=True, slots=True)
class DemoOptions:
    domains: int = 4
    policy: str = "rackscale"
    seed: int = 1
    tick_s: float = 300.0  # simulated seconds per tick
    interval_s: float = 1.0  # wall seconds between ticks
    ticks: int | None = None  # None: until Ctrl-C


def _random_job(rng: random.Random, i: int, now: float) -> JobSpec:
    kind = rng.random()
    if kind < 0.55:
        gpus, seg = rng.choice([1, 2, 4]), None
    elif kind < 0.9:
        gpus, seg = 4 * rng.choice([2, 4, 8, 16]), None
    else:
        gpus, seg = 4 * rng.choice([32, 48, 64]), 16
    return JobSpec(
        f"job-{i:04d}",
        gpus,
        segment=seg,
        tenant=rng.choice(["alice", "bob", "carol"]),
        priority=rng.choice([0, 0, 0, 1]),
        checkpointable=rng.random() < 0.5,
        expected_runtime_s=rng.choice([600, 1800, 3600, 7200]),
        submit_time=now,
    )


def run_demo(opts: DemoOptions, out: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep) -> int:
    topo = Topology.uniform(opts.domains)
    state = ClusterState(topo)
    sched = Scheduler(CycleConfig(policy=opts.policy))
    rng = random.Random(opts.seed)
    pending: dict[str, JobSpec] = {}
    ends: dict[str, float] = {}
    now, seq, tick = 0.0, 0, 0
    try:
        while opts.ticks is None or tick < opts.ticks:
            for job_id in [j for j, end in ends.items() if end <= now]:
                state.release(job_id)
                del ends[job_id]
            for _ in range(rng.randint(1, 4)):
                job = _random_job(rng, seq, now)
                pending[job.id] = job
                seq += 1
            result = sched.cycle(state, list(pending.values()), now)
            for d in result.decisions:
                if isinstance(d, Allocate):
                    job = pending.pop(d.job_id)
                    # the simulated job runs a little shorter or longer than its estimate
                    ends[d.job_id] = now + (job.expected_runtime_s or 600) * rng.uniform(0.6, 1.1)
                elif isinstance(d, Preempt):
                    ends.pop(d.job_id, None)
            letters = job_letters(state)
            lines = [f"rackscale demo — policy {opts.policy}, t={now / 60:.0f} min, {len(pending)} pending", ""]
            lines.append(render(state, letters))
            lines.append("")
            for d in result.decisions:
                if isinstance(d, Reserve):
                    lines.append(f"  {d.job_id}: {d.reason}")
            waiting = [d for d in result.by_job().values() if not isinstance(d, Allocate | Reserve)]
            for d in waiting[:8]:
                lines.append(f"  {d.job_id}: {d.reason}")  # type: ignore[union-attr]
            out("\n".join(lines) + "\n")
            now += opts.tick_s
            tick += 1
            if opts.ticks is None or tick < opts.ticks:
                sleep(opts.interval_s)
    except KeyboardInterrupt:
        out("stopped")
    return 0
