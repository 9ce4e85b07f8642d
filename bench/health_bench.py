#!/usr/bin/env python3
"""Health-rule benchmark: how many telemetry samples per second the rules and inventory take.

    python bench/health_bench.py [--nodes 1152] [--rounds 20] [--live-domains 16 --live-s 10 --telemetry-s 0.5]

- ``rules``: the pure path per sample (4-GPU node): decode the node's rule state, `shared.health.evaluate`,
  encode it back — over `--nodes` simulated nodes for `--rounds` samples each (healthy, with a few faults).
- ``live`` (with `--live-domains`): embedded NATS and Valkey, one inventory, a simulated fleet of that many
  NVL72 domains sending telemetry every `--telemetry-s`; reports samples sent and evaluated per second
  (evaluated < sent means inventory falls behind). 64 domains at the default 5 s send ~230 samples/s.

One JSON line per measurement on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.agent.fleet import AgentFleet, sim_fleet
from services.inventory.service import InventoryService
from shared.embedded import EmbeddedNats, EmbeddedValkey
from shared.health import HealthRules, evaluate
from shared.runtime import Deps
from shared.schemas import NODE_HEALTH_STATE, Fault, NodeHealthState, Telemetry, encode
from shared.settings import Settings


def bench_rules(nodes: int, rounds: int) -> dict[str, object]:
    fleet = sim_fleet(max(1, nodes // 18), 18)[:nodes]
    for b in fleet[::50]:  # a few GPUs with something going on, so rule state is stored
        b.inject(Fault(node=b.node, gpu=0, temp_c=95.0, flap=1))
    rules = HealthRules()
    states = {b.node: encode(NodeHealthState()) for b in fleet}
    samples = [[b.telemetry(frozenset({0, 1})) for b in fleet] for _ in range(rounds)]
    start = time.perf_counter()
    for r, batch in enumerate(samples):
        now = 5.0 * r
        for b, gpus in zip(fleet, batch, strict=True):
            state = NODE_HEALTH_STATE.decode(states[b.node])
            evaluate(rules, state, Telemetry(node=b.node, at=now, gpus=gpus), now)
            states[b.node] = encode(state)
    took = time.perf_counter() - start
    n = nodes * rounds
    return {
        "bench": "rules",
        "nodes": nodes,
        "samples": n,
        "samples_per_s": round(n / took),
        "us_per_sample": round(took / n * 1e6, 1),
    }


async def bench_live(domains: int, seconds: float, telemetry_s: float) -> dict[str, object]:
    # heartbeats as slow as telemetry's defaults allow: the figure is about telemetry
    settings = Settings(heartbeat_s=5.0, telemetry_s=telemetry_s)
    with EmbeddedNats() as nats, EmbeddedValkey() as redis:
        names = settings.names()
        inv_deps = await Deps.connect(settings, "inventory", nats.url, redis.url, names)
        fleet_deps = await Deps.connect(settings, "agent", nats.url, redis.url, names)
        inv = InventoryService(inv_deps)
        fleet = AgentFleet(fleet_deps, sim_fleet(domains, 18), plan=[])
        await inv.start()
        await fleet.start()
        await asyncio.sleep(2 * telemetry_s)  # registrations settle
        sent0 = sum(a.samples for a in fleet.agents.values())
        done0 = inv.health.samples
        await asyncio.sleep(seconds)
        sent = sum(a.samples for a in fleet.agents.values()) - sent0
        done = inv.health.samples - done0
        await fleet.stop(grace_s=2.0)
        await inv.stop(grace_s=2.0)
        await fleet_deps.close()
        await inv_deps.close()
    return {
        "bench": "live",
        "domains": domains,
        "nodes": domains * 18,
        "telemetry_s": telemetry_s,
        "sent_per_s": round(sent / seconds, 1),
        "evaluated_per_s": round(done / seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--nodes", type=int, default=1152)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--live-domains", type=int, default=0, help="also run inventory live on this many domains")
    p.add_argument("--live-s", type=float, default=10.0)
    p.add_argument("--telemetry-s", type=float, default=0.5)
    args = p.parse_args(argv)
    print(json.dumps(bench_rules(args.nodes, args.rounds)), flush=True)
    if args.live_domains:
        print(json.dumps(asyncio.run(bench_live(args.live_domains, args.live_s, args.telemetry_s))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
