#!/usr/bin/env python3
"""Simulator speed on a standard workload, run exactly as `rackscale sim --workload NAME` runs it.

    python bench/workload_bench.py [--workload heavy] [--load 0.9] [--policies block,ceiling,rackscale]
                                   [--seed 1] [--migration] [--limit N] [--profile POLICY]

One JSON line for the workload (jobs, offered load, setup seconds), one per policy (wall seconds of the
simulation alone, events, cycles, seconds inside `Scheduler.cycle`, migration planning), then a summary
against the target: one policy and seed in 180 s or less on this machine (issue "Past the rigid ceiling",
part 6). ``--profile POLICY`` adds a cProfile of that policy's run (top functions by own time) on stderr.
Any other `rackscale sim` flag can follow ``--`` (e.g. ``-- --queue-depth 0``).
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

from services.cli import sim_cmd
from shared.sim.experiment import prepare, run_one

TARGET_S = 180.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="heavy")
    ap.add_argument("--load", default="0.9")
    ap.add_argument("--policies", default="block,ceiling,rackscale")
    ap.add_argument("--seed", default="1")
    ap.add_argument("--migration", action="store_true", help="with the migration planner (sim --migration on)")
    ap.add_argument("--limit", default=None, help="first N jobs of each trace (a quick check)")
    ap.add_argument("--profile", default=None, help="cProfile this policy's run")
    ap.add_argument("rest", nargs="*", help="more `rackscale sim` flags, after --")
    args = ap.parse_args(argv)

    sim_args = ["--workload", args.workload, "--load", args.load, "--seed", args.seed, "--out", "unused"]
    sim_args += ["--policy", args.policies, *(["--migration", "on"] if args.migration else [])]
    sim_args += [*(["--limit", args.limit] if args.limit else []), *args.rest]
    parser = argparse.ArgumentParser()
    sim_cmd.add_arguments(parser)
    exp = sim_cmd.build_experiment(parser.parse_args(sim_args))
    t0 = time.perf_counter()
    work = prepare(exp)
    setup = {
        "bench": "setup",
        "workload": args.workload,
        "jobs": len(work.jobs),
        "offered_load": round(work.offered, 3),
        "prepare_s": round(time.perf_counter() - t0, 1),
        "gpus": exp.sim.fleet.gpus,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(setup), flush=True)
    worst = 0.0
    for policy in exp.policies:
        prof = cProfile.Profile() if policy == args.profile else None
        if prof:
            prof.enable()
        out = run_one(exp, work, policy, exp.seeds[0])
        if prof:
            prof.disable()
        m = out.metrics
        worst = max(worst, out.wall_s)
        line = {
            "bench": "run",
            "policy": policy,
            "wall_s": round(out.wall_s, 1),
            "events": m["events"],
            "cycles": m["cycles"],
            "goodput": round(m["goodput"], 4) if m["goodput"] is not None else None,
            "finished": m["finished"],
            "jobs": m["jobs"],
        }
        print(json.dumps(line), flush=True)
        if prof:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(20)
            print(buf.getvalue(), file=sys.stderr)
    print(json.dumps({"bench": "summary", "target_s": TARGET_S, "worst_s": round(worst, 1), "met": worst <= TARGET_S}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
