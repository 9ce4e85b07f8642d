"""python -m services.fleet [--domains 4 --nodes-per-domain 18 --gpus 4 --seed 0 --first-domain 0]

Simulated GPU agents for whole NVL72 domains in one process (`services.agent.fleet.AgentFleet` over
`sim_fleet`), for docker compose and demos. Like an agent it talks only to NATS (RACKSCALE_NATS_URL)
and connects as the "agent" user. With `--first-domain F` it runs domains F .. F+domains-1 as one shard of a
fleet split over several processes (`rackscale up` does that for a large fleet): it takes only its own nodes'
commands.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.agent.faults import FaultPlanError
from services.agent.fleet import AgentFleet, sim_fleet
from services.agent.process import agent_deps, agent_settings
from shared.runtime import run, setup_logging
from shared.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.fleet", description="a simulated fleet of GPU agents")
    p.add_argument("--domains", type=int, default=4, help="NVLink domains (default 4)")
    p.add_argument("--nodes-per-domain", type=int, default=18, help="nodes per domain (default 18)")
    p.add_argument("--gpus", type=int, default=4, help="GPUs per node (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed for GPU UUIDs")
    p.add_argument(
        "--first-domain", type=int, default=None, help="run domains from this one on, as one shard of a larger fleet"
    )
    return p


async def _serve(settings: Settings, args: argparse.Namespace) -> None:
    deps = await agent_deps(settings, AgentFleet.name)
    first = args.first_domain or 0
    backends = sim_fleet(args.domains, args.nodes_per_domain, args.gpus, seed=args.seed, first_domain=first)
    shard = None if args.first_domain is None else f"d{first}-d{first + args.domains - 1}"
    try:
        fleet = AgentFleet(deps, backends, shard=shard)  # with RACKSCALE_FAULT_PLAN's faults
    except (FaultPlanError, ValueError) as e:
        await deps.close()
        sys.exit(f"fleet: {e}")
    await run(fleet)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = agent_settings("fleet")
    if min(args.domains, args.nodes_per_domain, args.gpus) < 1:
        sys.exit("fleet: --domains, --nodes-per-domain and --gpus must be >= 1")
    if args.first_domain is not None and args.first_domain < 0:
        sys.exit("fleet: --first-domain must be >= 0")
    setup_logging(settings.log_level)
    asyncio.run(_serve(settings, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
