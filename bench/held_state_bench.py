#!/usr/bin/env python3
"""What a busy cluster adds to the queue's kicked cycle: putting the held GPUs into the cycle's state.

    python bench/held_state_bench.py [--domains 64] [--running 12,200,1000,3000] [--cycles 30]

N running 1-GPU jobs hold GPUs of a 64-domain fleet. Between two cycles one job ends and another starts on
its GPU (the usual churn), then a 2-GPU job is decided. Per cycle, median over `--cycles`:

- `scratch_ms`: the state built from every held allocation (`occupy_held` on a copy of the empty state),
  as the queue did before `HeldState`;
- `scan_ms`: `HeldState.sync` finding the change by a pass over every id, and handing out a copy;
- `kept_ms`: `HeldState.sync` told which jobs changed (what the queue does), and handing out a copy;
- `cycle_ms`: the core's cycle on that state;
- `blocked_ms` / `blocked_kept_ms`: the same cycle with a large job waiting ahead of it (64 segments of 16
  nodes: it can't start before most running jobs end, so it is reserved every cycle), forecasting its
  reservation anew (the timer's cycles) / keeping last cycle's while it holds (kicked cycles,
  `reuse_forecasts`).

One JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.core import ClusterState, CycleConfig, Reserve, Scheduler, Topology
from shared.held import HeldState, occupy_held
from shared.jobs import job_spec
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, NodeGpus, TopologyBody


def _running(i: int, node: str, gpu: int, now: float) -> tuple[AllocationRecord, JobRecord]:
    job = f"r{i}"
    nodes = [NodeGpus(node, [gpu])]
    body = JobBody(name=job, tenant="t", gpus=1, duration_s=3600.0, checkpointable=i % 2 == 0)
    rec = JobRecord(id=job, spec=body, state=JobState.RUNNING, attempt=1, allocation=nodes, started_at=now)
    return AllocationRecord(job_id=job, attempt=1, nodes=nodes, committed_at=now), rec


def measure(domains: int, running: int, cycles: int) -> dict[str, float | int]:
    topo = Topology.uniform(domains, nodes_per_domain=18, gpus_per_node=4)
    base = ClusterState(topo)
    slots = [(node, gpu) for node in topo.node_names for gpu in range(4)]
    if running >= len(slots):
        raise SystemExit(f"--running {running}: the fleet has only {len(slots)} GPUs")
    now = 1000.0
    allocs: dict[str, AllocationRecord] = {}
    jobs: dict[str, JobRecord] = {}
    for i in range(running):
        a, r = _running(i, *slots[i], now)
        allocs[a.job_id], jobs[r.id] = a, r
    pending = job_spec(JobBody(name="p", tenant="t", gpus=2), "p", now)
    big = JobBody(name="big", tenant="u", gpus=64 * 16 * 4, gpus_per_node=4, topology=TopologyBody(segment=16))
    blocked = job_spec(big, "big", now - 60.0)
    sched = Scheduler(CycleConfig(policy="rackscale"))
    fresh_sched, kept_sched = Scheduler(CycleConfig(policy="rackscale")), Scheduler(CycleConfig(policy="rackscale"))
    kept_state, scan_state = HeldState(), HeldState()
    for h in (kept_state, scan_state):
        h.sync(base, allocs, jobs, now)  # the first sync builds it (not measured)
    scratch_ms: list[float] = []
    scan_ms: list[float] = []
    kept_ms: list[float] = []
    cycle_ms: list[float] = []
    blocked_ms: list[float] = []
    blocked_kept_ms: list[float] = []
    for c in range(cycles):
        now += 1.0
        gone = f"r{c}"  # one job ends, the next starts on its GPU
        slot = allocs.pop(gone).nodes[0]
        del jobs[gone]
        a, r = _running(running + c, slot.node, slot.gpus[0], now)
        allocs[a.job_id], jobs[r.id] = a, r
        t0 = time.perf_counter()
        scratch = base.copy()
        occupy_held(scratch, list(allocs.values()), jobs, now)
        t1 = time.perf_counter()
        scan_state.sync(base, allocs, jobs, now)
        tb = time.perf_counter()
        state = kept_state.sync(base, allocs, jobs, now, changed={gone, r.id})
        t2 = time.perf_counter()
        if scratch.free != state.free:
            raise SystemExit("the kept state differs from the one built from scratch")
        t3 = time.perf_counter()
        sched.cycle(state, [pending], now)
        t4 = time.perf_counter()
        fresh_state = kept_state.sync(base, allocs, jobs, now, changed=())
        kept_copy = kept_state.sync(base, allocs, jobs, now, changed=())
        t5 = time.perf_counter()
        fresh_sched.cycle(fresh_state, [blocked, pending], now)
        t6 = time.perf_counter()
        kept = kept_sched.cycle(kept_copy, [blocked, pending], now, reuse_forecasts=c > 0)
        t7 = time.perf_counter()
        if not any(isinstance(d, Reserve) and d.job_id == "big" for d in kept.decisions):
            raise SystemExit(f"the large job should be reserved: {kept.decisions}")
        if c:
            blocked_ms.append((t6 - t5) * 1e3)
            blocked_kept_ms.append((t7 - t6) * 1e3)
        scratch_ms.append((t1 - t0) * 1e3)
        scan_ms.append((tb - t1) * 1e3)
        kept_ms.append((t2 - tb) * 1e3)
        cycle_ms.append((t4 - t3) * 1e3)
    return {
        "running": running,
        "scratch_ms": round(statistics.median(scratch_ms), 3),
        "scan_ms": round(statistics.median(scan_ms), 3),
        "kept_ms": round(statistics.median(kept_ms), 3),
        "cycle_ms": round(statistics.median(cycle_ms), 3),
        "blocked_ms": round(statistics.median(blocked_ms), 3),
        "blocked_kept_ms": round(statistics.median(blocked_kept_ms), 3),
        "rebuilds": kept_state.rebuilds + scan_state.rebuilds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--domains", type=int, default=64)
    p.add_argument("--running", default="12,200,1000,3000", help="running jobs, comma-separated")
    p.add_argument("--cycles", type=int, default=30)
    args = p.parse_args(argv)
    rows = [measure(args.domains, int(n), args.cycles) for n in args.running.split(",")]
    print(json.dumps({"domains": args.domains, "cycles": args.cycles, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
