"""The `rackscale` command line.

    rackscale up [--domains 4] [--policy rackscale] [--port 8080]   run everything locally until Ctrl-C
    rackscale submit --gpus 64 --name demo --tenant me -- python train.py
    rackscale submit -f job.yaml [flags over the file's fields]   a job body in YAML (docs/jobs.md)
    rackscale sbatch [OPTIONS] script.sh [-- ARGS]                  an sbatch script (#SBATCH, #RACKSCALE lines)
    rackscale submit --array 0-9%2 --dependency afterok:ID ... -- cmd   an array of 10, 2 at once, after job ID
    rackscale jobs | job ID | cancel ID | cluster | drain NODE | undrain NODE | clear-health NODE
    rackscale usage [--tenant T] [--from D] [--to D] [--by day|week] [--csv]   GPU-hours per tenant
    rackscale demo                                                   the scheduling core alone, in the terminal
    rackscale sim --trace FILE ...                                   replay a trace, compare policies

Every command but `up` and `demo` talks HTTP to --url (default $RACKSCALE_URL or http://127.0.0.1:8080),
with $RACKSCALE_TOKEN as its bearer token when set: a gateway, or a router over several cells (`--cell` picks
one for `cluster`, the node commands and the lists).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from services.cli.args import env_pair, non_negative_int, port, positive_int, seconds, segment_sizes
from shared.core.policies import RUNNABLE

Out = Callable[[str], None]

JOB_STATES = ("pending", "placed", "running", "succeeded", "failed", "cancelled", "preempted")


def build_parser() -> argparse.ArgumentParser:
    from services.cli.client import default_url

    parser = argparse.ArgumentParser(prog="rackscale", description="Topology-aware GPU scheduler for NVLink racks")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run Rackscale locally (servers, services, a simulated fleet) until Ctrl-C")
    up.add_argument("--domains", type=positive_int, default=4, help="NVL72 domains to simulate (default 4 = 288 GPUs)")
    up.add_argument("--policy", choices=RUNNABLE, default=None, help="placement policy (default rackscale)")
    up.add_argument("--host", default=None, help="gateway bind address (default 127.0.0.1)")
    up.add_argument("--port", type=port, default=None, help="gateway port (default 8080; 0 picks a free one)")
    up.add_argument("--nats-url", default=None, help="use this NATS server (default $RACKSCALE_NATS_URL or embedded)")
    up.add_argument("--redis-url", default=None, help="use this Redis (default $RACKSCALE_REDIS_URL or embedded)")
    up.add_argument("--log-level", default=None, type=str.upper, help="service logs (default WARNING)")
    up.add_argument("--log-dir", type=Path, default=None, help="write each rank's output under this directory")
    up.add_argument(
        "--fleet-processes",
        type=non_negative_int,
        default=None,
        help="child processes for the simulated agents (default: none up to 32 domains, then one per 1,800 nodes)",
    )

    demo = sub.add_parser("demo", help="the scheduling core alone, live in the terminal (no services)")
    demo.add_argument("--domains", type=positive_int, default=4, help="NVL72 domains to simulate (default 4)")
    demo.add_argument("--policy", choices=RUNNABLE, default="rackscale")
    demo.add_argument("--seed", type=int, default=1)
    demo.add_argument("--interval", type=float, default=1.0, help="wall seconds between scheduling ticks")
    demo.add_argument("--ticks", type=int, default=None, help="stop after this many ticks (default: until Ctrl-C)")

    from services.cli import sim_cmd

    sim_cmd.add_parser(sub)  # `rackscale sim`: trace replay on a modelled fleet (services/cli/sim_cmd.py)

    api = argparse.ArgumentParser(add_help=False)
    api.add_argument("--url", default=default_url(), help="gateway URL (default $RACKSCALE_URL or %(default)s)")
    api.add_argument("--json", action="store_true", help="print the API's JSON answer")
    # behind a router over several cells (services/router); a plain gateway is one cell and takes no --cell
    in_cell = argparse.ArgumentParser(add_help=False)
    in_cell.add_argument("--cell", default=None, help="through a router: one cell's (lists: default every cell's)")
    node_cell = argparse.ArgumentParser(add_help=False)
    node_cell.add_argument("--cell", default=None, help="through a router over several cells: the node's cell")

    s = sub.add_parser(
        "submit", parents=[api], help="submit a job", usage="%(prog)s (--gpus N | -f JOB.yaml) [options] [-- CMD ...]"
    )
    s.add_argument("-f", "--file", default=None, help="the job body in YAML (docs/jobs.md); flags override its fields")
    s.add_argument("--gpus", type=positive_int, default=None, help="GPUs in all (an elastic job's most)")
    s.add_argument(
        "--min-gpus",
        type=positive_int,
        default=None,
        help="elastic: anything from this many GPUs to --gpus, resized at checkpoints (needs --checkpointable)",
    )
    s.add_argument("--name", default=None, help="job name (default: the command's name, or 'job')")
    s.add_argument("--tenant", default=None, help="tenant (default $RACKSCALE_TENANT or your user name)")
    s.add_argument("--gpus-per-node", type=positive_int, default=None, help="GPUs on each node (default: whole nodes)")
    s.add_argument("--nvlink", choices=("required", "preferred", "none"), default=None, help="(default required)")
    s.add_argument(
        "--segment",
        type=segment_sizes,
        default=None,
        help="nodes per NVLink segment; several (16,8): any of them, preferred first",
    )
    s.add_argument("--level", default=None, help="topology level the job must fit in (default domain)")
    s.add_argument("--priority", type=int, default=None, help="-1000..1000 (default 0)")
    s.add_argument("--checkpointable", action="store_true", help="may be preempted with a checkpoint")
    s.add_argument("--exclusive", action="store_true", help="no other job on its nodes")
    s.add_argument("--duration", type=seconds, default=None, help="seconds a simulated agent runs it (default 60)")
    s.add_argument("--expected-runtime", type=seconds, default=None, help="your runtime estimate in seconds")
    s.add_argument("--on-node-failure", choices=("requeue", "fail"), default=None, help="(default requeue)")
    s.add_argument("--time-limit", type=seconds, default=None, help="seconds; stopped past it, ends failed")
    s.add_argument("--env", type=env_pair, action="append", default=[], metavar="NAME=VALUE", help="(repeatable)")
    s.add_argument("--workdir", default=None, help="absolute directory the processes start in")
    s.add_argument("--per-gpu", action="store_true", help="one process per GPU (srun style; default one per node)")
    s.add_argument("--slurm-env", action="store_true", help="also SLURM_* aliases of the launch contract")
    s.add_argument(
        "--array", default=None, metavar="INDICES[%N]", help="an array of tasks, Slurm's syntax: 0-99%%8, 1,3,5-7"
    )
    s.add_argument(
        "--dependency",
        "-d",
        default=None,
        metavar="KIND:ID[:ID...][,...]",
        help="wait for other jobs (Slurm's syntax): afterok:ID, afterany:ID, afternotok:ID, singleton",
    )
    s.add_argument("--idempotency-key", default=None, help="a retry with the same key names the same job")
    s.add_argument(
        "--test-only",
        action="store_true",
        help="submit nothing: say where the job would start now, or when and why it would wait (a dry run)",
    )
    s.add_argument("cmd", nargs="*", metavar="-- CMD", help="the command each rank runs (none: a simulated run)")

    # an sbatch script: its words are read by services/cli/jobfiles.py (sbatch's options before and after the
    # script, so argparse takes none of them: "+" is no option's prefix)
    sb = sub.add_parser(
        "sbatch", help="submit an sbatch script (#SBATCH lines; see rackscale sbatch --help)", prefix_chars="+",
        add_help=False, usage="%(prog)s [OPTIONS] SCRIPT [OPTIONS] [-- ARGS ...]",
    )  # fmt: skip
    sb.add_argument("words", nargs=argparse.REMAINDER)
    sb.set_defaults(url=default_url(), json=False)

    js = sub.add_parser("jobs", parents=[api, in_cell], help="list jobs")
    js.add_argument("--tenant", default=None)
    js.add_argument("--state", choices=JOB_STATES, default=None)
    js.add_argument("--array", default=None, metavar="ID", help="only this array's tasks, in index order")
    js.add_argument("--limit", type=positive_int, default=50, help="at most this many (max 500, default 50)")
    js.add_argument("--offset", type=int, default=0)

    j = sub.add_parser("job", parents=[api], help="one job: state, pending reason, allocation (an array: its tasks)")
    j.add_argument("id")
    lg = sub.add_parser("logs", parents=[api], help="what a job's processes wrote (stdout and stderr)")
    lg.add_argument("id")
    lg.add_argument("-f", "--follow", action="store_true", help="go on as they write, until the job has ended")
    lg.add_argument("--rank", type=non_negative_int, default=None, help="one process's (RANK) alone")
    lg.add_argument("--tail", type=non_negative_int, default=None, help="the last N lines")
    lg.add_argument("--attempt", type=positive_int, default=None, help="an earlier attempt's (default the latest)")
    c = sub.add_parser("cancel", parents=[api], help="cancel a job (an array's id: every task not ended)")
    c.add_argument("id")
    sub.add_parser("cluster", parents=[api, in_cell], help="the fleet, one row of GPUs per NVLink domain")
    d = sub.add_parser("drain", parents=[api, node_cell], help="let a node's jobs finish, place nothing new on it")
    d.add_argument("node")
    d.add_argument("--reason", default="", help="why (shown with the node)")
    u = sub.add_parser("undrain", parents=[api, node_cell], help="put a drained node back in service")
    u.add_argument("node")
    ch = sub.add_parser(
        "clear-health", parents=[api, node_cell], help="lift the GPU health rules' verdicts (fatal XIDs too)"
    )
    ch.add_argument("node")
    ch.add_argument("--reason", default="", help="why (shown in the node's event)")
    ms = sub.add_parser(
        "migrations", parents=[api, in_cell], help="moves of running jobs: job, from, to, why, state, timings"
    )
    ms.add_argument("--tenant", default=None)
    ms.add_argument("--job", default=None, help="only this job's moves")
    ms.add_argument("--limit", type=positive_int, default=50, help="at most this many (max 500, default 50)")
    ms.add_argument("--offset", type=int, default=0)
    us = sub.add_parser("usage", parents=[api], help="GPU-hours per tenant and day or week, from the job log")
    us.add_argument("--tenant", default=None, help="one tenant's (a user token: always its own)")
    us.add_argument(
        "--from", dest="start", default=None, metavar="D", help="ISO date or Unix seconds (default: 7 days ago)"
    )
    us.add_argument(
        "--to", dest="end", default=None, metavar="D", help="ISO date or Unix seconds, exclusive (default: now)"
    )
    us.add_argument("--by", choices=("day", "week"), default="day", help="period (default day; weeks from Monday)")
    us.add_argument("--csv", action="store_true", help="CSV: tenant,period,start,gpu_hours,jobs")
    return parser


def _print(text: str) -> None:
    print(text, flush=True)


def _print_err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None, out: Out = _print, err: Out = _print_err) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "submit" and args.gpus is None and args.file is None:
        parser.error("submit: give --gpus N, or a job file with -f JOB.yaml")
    if args.command == "up":
        from services.cli.up import UpOptions, run_up

        opts = UpOptions(
            domains=args.domains,
            policy=args.policy,
            host=args.host,
            port=args.port,
            nats_url=args.nats_url,
            redis_url=args.redis_url,
            log_level=args.log_level,
            log_dir=args.log_dir,
            fleet_processes=args.fleet_processes,
        )
        return run_up(opts, out, err)
    if args.command == "sim":
        from services.cli import sim_cmd

        return sim_cmd.run(args)
    if args.command == "demo":
        from services.cli.demo import DemoOptions, run_demo

        return run_demo(
            DemoOptions(
                domains=args.domains, policy=args.policy, seed=args.seed, interval_s=args.interval, ticks=args.ticks
            ),
            out,
        )
    from services.cli.client import Client, CliError, default_token
    from services.cli.commands import COMMANDS

    try:
        return COMMANDS[args.command](args, Client(args.url, token=default_token()), out)
    except CliError as e:
        err(str(e))
        return 1
    except KeyboardInterrupt:
        return 130
