#!/usr/bin/env python3
"""Simulator speed: replay the whole Philly trace (82k jobs) on 278 NVL72 domains, per policy.

    python bench/sim_bench.py [--traces DIR] [--domains 278] [--policies flat,tree,block,rackscale]
                              [--load X] [--limit N] [--cycle-interval S] [--profile POLICY] [--migration]

Default: the trace's own submit times ("replaying the trace as recorded"), failures on (seed 1), a
cycle at every event time (no tick batching), every pending job handed to each cycle. One JSON line per
policy (wall seconds, events, events/s, cycles, seconds inside `Scheduler.cycle`), then a summary line
checking the target: under 120 s per policy. ``--profile rackscale`` adds a cProfile of that policy's
run (top functions by own time) so it's clear whether the simulator or the core costs the time.

Traces: DIR/philly with --traces DIR, else $RACKSCALE_TRACES/philly if there is one, else the repository's
data/traces/philly.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.core import MigrationBudget
from shared.sim.engine import SimConfig, simulate
from shared.sim.fleet import FailureModel, FleetConfig
from shared.sim.mapping import MappingConfig, map_jobs, scale_to_load
from shared.sim.traces import load_trace, trace_folder

TARGET_S = 120.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=None, metavar="DIR", help="folder holding philly/ (default: data/traces)")
    ap.add_argument("--domains", type=int, default=278)
    ap.add_argument("--policies", default="flat,tree,block,rackscale")
    ap.add_argument("--load", type=float, default=None, help="scale submits to this load (default: as recorded)")
    ap.add_argument("--limit", type=int, default=None, help="first N rows only (quick check)")
    ap.add_argument("--cycle-interval", type=float, default=0.0)
    ap.add_argument("--queue-depth", type=int, default=0, help="0: every pending job each cycle")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", default=None, help="cProfile this policy's run")
    ap.add_argument("--migration", action="store_true", help="with the migration planner (sim --migration on)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    trace = load_trace(trace_folder("philly", args.traces), limit=args.limit)
    load_s = time.perf_counter() - t0
    fleet = FleetConfig(domains=args.domains)
    rows = trace.jobs
    if args.load is not None:
        rows, _ = scale_to_load(rows, fleet.gpus, args.load)
    jobs = map_jobs(rows, MappingConfig(), fleet.topology(), args.seed).jobs
    print(
        json.dumps(
            {
                "bench": "setup",
                "jobs": len(jobs),
                "load_trace_s": round(load_s, 2),
                "domains": args.domains,
                "gpus": fleet.gpus,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
            }
        ),
        flush=True,
    )
    worst = 0.0
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        cfg = SimConfig(
            policy=policy,
            seed=args.seed,
            fleet=fleet,
            failures=FailureModel(),
            cycle_interval_s=args.cycle_interval,
            queue_depth=args.queue_depth or None,
            migration=args.migration,
            migration_budget=MigrationBudget(max_moves=16, early=True),
        )
        prof = cProfile.Profile() if policy == args.profile else None
        t0 = time.perf_counter()
        if prof:
            prof.enable()
        res = simulate(jobs, cfg, timer=time.perf_counter)
        if prof:
            prof.disable()
        wall = time.perf_counter() - t0
        worst = max(worst, wall)
        print(
            json.dumps(
                {
                    "bench": "replay",
                    "policy": policy,
                    "wall_s": round(wall, 1),
                    "events": res.events,
                    "events_per_s": round(res.events / wall),
                    "batches": res.batches,
                    "cycles": res.cycles,
                    "cycle_s": round(res.cycle_time_s, 1),
                    "sim_s": round(wall - res.cycle_time_s, 1),
                    "finished": sum(1 for r in res.jobs if r.end is not None),
                    "jobs": len(res.jobs),
                    **(
                        {
                            "plan_s": round(res.migration.plan_time_s, 1),
                            "plan_calls": res.migration.plan_calls,
                            "moves": res.migration.defrag_moves + res.migration.evac_moves,
                        }
                        if res.migration
                        else {}
                    ),
                }
            ),
            flush=True,
        )
        if prof:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
            print(buf.getvalue(), file=sys.stderr)
    print(
        json.dumps(
            {"bench": "summary", "target_s_per_policy": TARGET_S, "worst_s": round(worst, 1), "met": worst < TARGET_S}
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
