"""python -m services.fleet [--domains 4 --nodes-per-domain 18 --gpus 4 --seed 0]

Simulated GPU agents for whole NVL72 domains in one process (`services.agent.fleet.AgentFleet` over
`sim_fleet`), for docker compose and demos. Like an agent it talks only to NATS (RACKSCALE_NATS_URL)
and connects as the "agent" user.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.agent.fleet import AgentFleet, sim_fleet
from shared.bus import Bus
from shared.runtime import Deps, run, setup_logging
from shared.settings import Settings, SettingsError
from shared.store import Store
from shared.tracing import Tracer, make_provider

# Deps carries a Store, but agents never touch Redis: this client is never connected.
_UNUSED_REDIS = "redis://127.0.0.1:6379/0"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.fleet", description="a simulated fleet of GPU agents")
    p.add_argument("--domains", type=int, default=4, help="NVLink domains (default 4)")
    p.add_argument("--nodes-per-domain", type=int, default=18, help="nodes per domain (default 18)")
    p.add_argument("--gpus", type=int, default=4, help="GPUs per node (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed for GPU UUIDs")
    return p


async def _serve(settings: Settings, nats_url: str, args: argparse.Namespace) -> None:
    names = settings.names()
    bus = await Bus.connect(nats_url, names, AgentFleet.name)
    await bus.ensure_streams(settings.stream_replicas)
    tracer = Tracer(make_provider(AgentFleet.name, settings.trace_exporter, settings.otlp_endpoint), AgentFleet.name)
    store = Store.from_url(settings.redis_url or _UNUSED_REDIS, names)
    deps = Deps(settings=settings, names=names, bus=bus, store=store, tracer=tracer)
    backends = sim_fleet(args.domains, args.nodes_per_domain, args.gpus, seed=args.seed)
    await run(AgentFleet(deps, backends))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        sys.exit(f"fleet: {e}")
    if not settings.nats_url:
        sys.exit("fleet: set RACKSCALE_NATS_URL (or use `rackscale up`)")
    if min(args.domains, args.nodes_per_domain, args.gpus) < 1:
        sys.exit("fleet: --domains, --nodes-per-domain and --gpus must be >= 1")
    setup_logging(settings.log_level)
    asyncio.run(_serve(settings, settings.nats_url, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
