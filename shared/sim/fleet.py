"""The modelled fleet and its node failures.

Fleet: `domains` NVLink domains of `nodes_per_domain` nodes x `gpus_per_node` GPUs (NVL72: 18 x 4),
optionally `domains_per_leaf` domains under each scale-out leaf switch. Built with the core's
`Topology.uniform`, so names and indices match what the services use.

Failures (`FailureModel`): each node fails after an exponential time with mean `mtbf_days` (default 60
days per compute tray) and comes back after an exponential repair time with mean `repair_hours`
(default 24 h: a tray swap). In steady state a share ``repair / (mtbf + repair)`` of nodes is down
(1.6% by default: in an 18-node domain P(no node down) = 75%, P(3 or more down) = 0.3%), which is the
availability picture behind planning jobs of 16 of 18 nodes. Every node draws from its own seeded
stream (``Random(f"{seed}:fail:{node}")``), so a seed gives every policy the very same failures.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from shared.core import Topology

DAY = 86400.0
HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class FleetConfig:
    domains: int = 32
    nodes_per_domain: int = 18
    gpus_per_node: int = 4
    domains_per_leaf: int | None = None

    @property
    def gpus(self) -> int:
        return self.domains * self.nodes_per_domain * self.gpus_per_node

    def topology(self) -> Topology:
        return Topology.uniform(
            self.domains, self.nodes_per_domain, self.gpus_per_node, domains_per_leaf=self.domains_per_leaf
        )


@dataclass(frozen=True, slots=True)
class FailureModel:
    enabled: bool = True
    mtbf_days: float = 60.0
    repair_hours: float = 24.0

    @property
    def down_share(self) -> float:
        if not self.enabled:
            return 0.0
        up, down = self.mtbf_days * DAY, self.repair_hours * HOUR
        return down / (up + down)


class NodeFailures:
    """Per-node alternating up/down times, drawn lazily from per-node seeded streams."""

    __slots__ = ("mtbf_s", "repair_s", "rngs")

    def __init__(self, model: FailureModel, nodes: int, seed: int) -> None:
        self.mtbf_s = model.mtbf_days * DAY
        self.repair_s = model.repair_hours * HOUR
        self.rngs = [random.Random(f"{seed}:fail:{n}") for n in range(nodes)]

    def next_failure(self, node: int, after: float) -> float:
        return after + self.rngs[node].expovariate(1.0 / self.mtbf_s)

    def repair_time(self, node: int, at: float) -> float:
        return at + self.rngs[node].expovariate(1.0 / self.repair_s)
