"""The `rackscale` command line."""

from __future__ import annotations

import argparse

from shared.core import POLICIES


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rackscale", description="Topology-aware GPU scheduler for NVLink racks")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run Rackscale locally on a simulated fleet")
    up.add_argument("--domains", type=int, default=4, help="NVL72 domains to simulate (default 4 = 288 GPUs)")
    up.add_argument("--policy", choices=sorted(POLICIES), default="rackscale")
    up.add_argument("--seed", type=int, default=1)
    up.add_argument("--interval", type=float, default=1.0, help="wall seconds between scheduling ticks")
    up.add_argument("--ticks", type=int, default=None, help="stop after this many ticks (default: until Ctrl-C)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        from services.cli.demo import DemoOptions, run_demo

        if args.domains < 1:
            raise SystemExit("--domains must be at least 1")
        return run_demo(
            DemoOptions(
                domains=args.domains, policy=args.policy, seed=args.seed, interval_s=args.interval, ticks=args.ticks
            )
        )
    return 2
