"""`rackscale sim`: replay a trace on a modelled NVL72 fleet under several policies, side by side.

    rackscale sim --trace data/traces/philly --domains 32 --policy flat,tree,block,rackscale \\
                  --load 0.9 --seeds 1,2,3,4,5 --out out/philly-0.9

Writes DIR/report.json, DIR/report.md and DIR/{occupancy,wait_cdf,free_runs}.png. Several --trace
flags make a mix (each trace stretched onto the longest span, then merged). The repository carries the
Philly and Kalos traces (data/traces/philly, data/traces/kalos); the Alibaba ones are not carried (no
licence): give their folder, e.g. --trace "$RACKSCALE_TRACES/alibaba-openb". Run standalone with
``python -m services.cli.sim_cmd ...``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

from services.cli.args import positive_int
from shared.core import LEND_MIN_NODES, POLICIES, SlowdownModel

DEFAULT_POLICIES = "flat,tree,block,rackscale"


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one number")
    return vals


def _window(text: str) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected START:END in days, got {text!r}") from None
    if b <= a:
        raise argparse.ArgumentTypeError(f"window end {b} must be after its start {a}")
    return a, b


def _outage(text: str) -> tuple[str, float, float]:
    """NODE:DOWN_H:UP_H, e.g. d03-n07:30:54 (node d03-n07 down from hour 30 to hour 54 of the trace)."""
    try:
        node, down, up = text.rsplit(":", 2)
        a, b = float(down), float(up)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NODE:DOWN_HOURS:UP_HOURS, got {text!r}") from None
    if b <= a or a < 0:
        raise argparse.ArgumentTypeError(f"outage {text!r}: up time must come after a non-negative down time")
    return node, a, b


def _segments(text: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        try:
            g, s = part.split(":")
            out.append((int(g), int(s)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected MIN_GPUS:SEGMENT,..., got {text!r}") from None
    return tuple(sorted(out))


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share from 0 to 1, got {text!r}")
    return value


def _half_lives(text: str) -> tuple[float, ...]:
    """`7d` or `0,7d,6h`: fair share's half-lives (each a duration: 7d, 6h, 90m, 3600; 0 or off: no usage)."""
    from shared.sim.experiment import duration

    try:
        vals = tuple(duration(x) for x in text.split(",") if x.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not vals:
        raise argparse.ArgumentTypeError("expected at least one half-life")
    if len(set(vals)) < len(vals):
        raise argparse.ArgumentTypeError(f"half-lives repeat in {text!r}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    from shared.sim.experiment import WORKLOADS
    from shared.sim.traces import FORMATS

    p.add_argument(
        "--trace",
        action="append",
        metavar="PATH",
        help="trace file or real-trace folder (e.g. data/traces/philly, data/traces/kalos); repeat to mix traces",
    )
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default=None,
        help="a standard workload instead of --trace/--window-days: light (Kalos + Philly days 50-57), heavy "
        "(Kalos + Philly days 14-104), philly (days 88-108)",
    )
    p.add_argument(
        "--format",
        action="append",
        choices=FORMATS,
        default=None,
        help="trace format per --trace (default: detected from the header)",
    )
    p.add_argument(
        "--window-days",
        action="append",
        type=_window,
        default=None,
        metavar="A:B",
        help="use only jobs submitted in trace days [A, B) (per --trace, in order)",
    )
    p.add_argument("--limit", type=int, default=None, help="first N jobs of each trace (smoke runs)")
    p.add_argument("--domains", type=int, default=32, help="NVLink domains in the fleet (default 32)")
    p.add_argument("--nodes-per-domain", type=int, default=18)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--domains-per-leaf", type=int, default=None, help="group domains under leaf switches")
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"comma-separated, of {', '.join(sorted(POLICIES))}; NAME+migration runs that one with the planner",
    )
    p.add_argument(
        "--load",
        type=float,
        default=None,
        help="scale submit times so the trace offers this many times the fleet's capacity",
    )
    p.add_argument("--seed", type=int, default=1, help="one seed (estimates, checkpointable draws, failures)")
    p.add_argument("--seeds", type=_ints, default=None, help="several seeds, e.g. 1,2,3,4,5: mean and spread")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--failures", choices=("on", "off"), default="on")
    p.add_argument(
        "--migration",
        choices=("on", "off"),
        default="off",
        help="the core's migration planner: evacuate failed nodes, defragment for blocked jobs (default off)",
    )
    p.add_argument(
        "--migration-interval", type=float, default=300.0, help="simulated seconds between defragmentation plans"
    )
    p.add_argument("--max-moves", type=int, default=16, help="moves in flight at once (migration budget)")
    p.add_argument(
        "--consolidate-early",
        choices=("on", "off"),
        default="on",
        help="defragment also while the free total is short of the blocked job (empty whole domains ahead)",
    )
    p.add_argument(
        "--lend-reserved",
        choices=("on", "off", "auto"),
        default="auto",
        help="checkpointable jobs may backfill into reserved nodes and are preempted (keeping their progress) "
        "when a reserved job fits without them (default auto: the policy's default, on for rackscale and off for "
        "the baselines; on for every policy with --migration on; off: Slurm's rule)",
    )
    p.add_argument(
        "--lend-min-nodes",
        type=positive_int,
        default=LEND_MIN_NODES,
        help=f"jobs of fewer nodes never borrow reserved nodes (default {LEND_MIN_NODES}; 1: any size)",
    )
    p.add_argument(
        "--move-segments",
        choices=("on", "off"),
        default="off",
        help="defragmentation may move a multi-domain job's whole segments out of a domain (the rest stay)",
    )
    p.add_argument(
        "--outage",
        action="append",
        type=_outage,
        default=None,
        metavar="NODE:DOWN_H:UP_H",
        help="scripted fault plan: node (e.g. d03-n07) down between these hours of simulated time; repeat",
    )
    p.add_argument("--mtbf-days", type=float, default=60.0, help="mean time between failures per node")
    p.add_argument("--repair-hours", type=float, default=24.0, help="mean repair time")
    p.add_argument(
        "--comm-share", type=float, default=0.05, help="share of step time in NVLink collectives (slowdown model)"
    )
    p.add_argument("--bandwidth-ratio", type=float, default=36.0, help="NVLink / scale-out bandwidth per GPU")
    p.add_argument(
        "--segments",
        type=_segments,
        default=None,
        metavar="G:S,...",
        help="segment size by job size: from G GPUs segment S nodes (default 32:4,65:16)",
    )
    p.add_argument(
        "--no-pad-segments",
        action="store_true",
        help="a node count the segment doesn't divide takes its largest divisor (the earlier rounds), not padding",
    )
    p.add_argument(
        "--flexible-share",
        type=_share,
        default=0.0,
        metavar="F",
        help="share of the jobs over 16 nodes that also accept segments of 8 (flexible; default 0)",
    )
    p.add_argument(
        "--elastic-share",
        type=_share,
        default=0.0,
        metavar="F",
        help="share of the jobs over 16 nodes that run with half to all of their nodes (elastic; default 0)",
    )
    p.add_argument(
        "--outer-share",
        type=float,
        default=SlowdownModel().outer_share,
        help="share of a flexible job's step time between its smaller segments (slowdown model)",
    )
    p.add_argument("--nvlink-min-gpus", type=int, default=8, help="jobs of this many GPUs or more need NVLink")
    p.add_argument("--exact-estimates", action="store_true", help="the scheduler sees true runtimes")
    p.add_argument("--estimate-sigma", type=float, default=0.5)
    p.add_argument("--estimate-median", type=float, default=1.5)
    p.add_argument("--ckpt-share", type=float, default=0.5, help="share of jobs that are checkpointable")
    p.add_argument("--reservations", type=int, default=4)
    p.add_argument("--no-backfill", action="store_true")
    p.add_argument("--no-preemption", action="store_true")
    p.add_argument(
        "--cycle-interval",
        type=float,
        default=30.0,
        help="simulated seconds between scheduling cycles (0: a cycle at every event time)",
    )
    p.add_argument(
        "--queue-depth", type=int, default=100, help="oldest pending jobs per tenant each cycle tests (0: all)"
    )
    p.add_argument(
        "--half-life",
        type=_half_lives,
        default=(0.0,),
        metavar="H[,H...]",
        help="fair share with memory: tenants' GPU-seconds decayed with this half-life weigh in the order (7d, 6h, "
        "90m, seconds; default 0: off, the GPUs held now only; the queue's default is 7d). Several: each policy "
        "runs under each, side by side (labels `POLICY hl=H`), with a per-tenant wait table",
    )
    p.add_argument("--workers", type=int, default=1, help="runs in parallel processes")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sim",
        help="replay a job trace on a modelled fleet and compare policies",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)


class ProgressBar:
    def __init__(self, stream: TextIO, width: int = 40) -> None:
        self.stream = stream
        self.width = width
        self.start = time.monotonic()
        self.last = -1

    def __call__(self, frac: float) -> None:
        frac = min(max(frac, 0.0), 1.0)
        step = int(frac * 200)
        if step == self.last:
            return
        self.last = step
        filled = int(frac * self.width)
        elapsed = time.monotonic() - self.start
        self.stream.write(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {100 * frac:5.1f}%  {elapsed:6.0f} s")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def build_experiment(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from shared.core import MigrationBudget
    from shared.sim.engine import SimConfig
    from shared.sim.experiment import MIGRATION, WORKLOADS, Experiment, TraceSpec, split_policy, with_half_life
    from shared.sim.fleet import FailureModel, FleetConfig
    from shared.sim.mapping import MappingConfig

    policies = tuple(p.strip() for p in args.policy.split(",") if p.strip())
    bad = [p for p in policies if split_policy(p)[0] not in POLICIES or split_policy(p)[1] not in ("", MIGRATION)]
    if bad or not policies:
        raise SystemExit(
            f"unknown policy {bad}; choose from {', '.join(sorted(POLICIES))}, each optionally +{MIGRATION}"
        )
    if (args.workload is None) == (not args.trace):
        raise SystemExit("give either --workload or --trace (one or more)")
    if args.workload is not None:
        if args.format or args.window_days:
            raise SystemExit("--workload sets the traces and their windows: no --format or --window-days with it")
        traces = tuple(replace(t, limit=args.limit) for t in WORKLOADS[args.workload])
    else:
        n = len(args.trace)
        fmts = args.format or []
        wins = args.window_days or []
        if len(fmts) > n or len(wins) > n:
            raise SystemExit("give at most one --format and one --window-days per --trace")
        traces = tuple(
            TraceSpec(path, fmts[i] if i < len(fmts) else None, wins[i] if i < len(wins) else None, args.limit)
            for i, path in enumerate(args.trace)
        )
    if args.domains < 1:
        raise SystemExit("--domains must be at least 1")
    mapping = MappingConfig(
        gpus_per_node=args.gpus_per_node,
        nvlink_min_gpus=args.nvlink_min_gpus,
        exact_estimates=args.exact_estimates,
        estimate_sigma=args.estimate_sigma,
        estimate_median=args.estimate_median,
        ckpt_share=args.ckpt_share,
        pad_segments=not args.no_pad_segments,
        flexible_share=args.flexible_share,
        elastic_share=args.elastic_share,
        **({"segments": args.segments} if args.segments else {}),
    )
    fleet = FleetConfig(args.domains, args.nodes_per_domain, args.gpus_per_node, args.domains_per_leaf)
    outages = []
    if args.outage:
        index = fleet.topology().node_index
        for node, down, up in args.outage:
            if node not in index:
                raise SystemExit(f"--outage: no node {node!r} in the fleet (names look like d00-n00)")
            outages.append((index[node], down * 3600.0, up * 3600.0))
    sim = SimConfig(
        fleet=fleet,
        outages=tuple(outages),
        failures=FailureModel(args.failures == "on", args.mtbf_days, args.repair_hours),
        slowdown=SlowdownModel(
            nvlink_gbps=50.0 * args.bandwidth_ratio,
            scaleout_gbps=50.0,
            comm_share=args.comm_share,
            outer_share=args.outer_share,
        ),
        reservations=args.reservations,
        backfill=not args.no_backfill,
        preemption=not args.no_preemption,
        cycle_interval_s=args.cycle_interval,
        queue_depth=args.queue_depth or None,
        migration=args.migration == "on",
        migration_interval_s=args.migration_interval,
        lend_reserved=None if args.lend_reserved == "auto" else args.lend_reserved == "on",
        lend_min_nodes=args.lend_min_nodes,
        migration_budget=MigrationBudget(
            max_moves=args.max_moves, early=args.consolidate_early == "on", segments=args.move_segments == "on"
        ),
    )
    half_lives = args.half_life
    if len(half_lives) > 1:  # each policy under each half-life, side by side
        policies = tuple(with_half_life(p, h) for p in policies for h in half_lives)
    else:
        sim = replace(sim, usage_half_life_s=half_lives[0])
    seeds = args.seeds or (args.seed,)
    return Experiment(traces, policies, seeds, args.load, sim, mapping, max(1, args.workers))


def run(args: argparse.Namespace) -> int:
    from shared.sim import experiment, report
    from shared.sim.traces import TraceFormatError

    exp = build_experiment(args)
    bar = None if args.quiet else ProgressBar(sys.stderr)
    try:
        work, outs = experiment.run(exp, bar)
    except (TraceFormatError, FileNotFoundError, ValueError) as e:
        if bar:
            bar.close()
        print(f"rackscale sim: {e}", file=sys.stderr)
        return 2
    if bar:
        bar.close()
    summary = experiment.summarise(exp, work, outs)
    title = "Simulation: " + " + ".join(t.path.rstrip("/").split("/")[-1] for t in exp.traces)
    paths = report.write(args.out, summary, outs, title, plots=not args.no_plots)
    print(report.markdown(summary, title))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rackscale sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
