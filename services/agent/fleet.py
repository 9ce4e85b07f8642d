"""A simulated fleet: many agents in one process, sharing one NATS connection (`rackscale up`).

`sim_fleet` builds the backends with `Topology.uniform`'s names (nodes `d03-n07`, domains `d03`, cliques
`d03.0`), so the topology inventory rebuilds from the agents' reports is the uniform one.

`AgentFleet` runs one `AgentService` per backend on shared `Deps`. Instead of one pull consumer per node
(hundreds of fetch loops), it binds one durable consumer on every node's command subject and hands each
command to the agent of its node; commands for nodes it doesn't run are acked and logged.

Faults (services/agent/faults.py): the fleet hands each simulated node its entries of the fault plan
(`plan`, by default RACKSCALE_FAULT_PLAN), and `inject(fault)` applies one now to a running fleet. A plan
entry or an injected fault that hits no node of the fleet is an error naming it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from services.agent.backends import GpuBackend, SimBackend
from services.agent.faults import FaultPlanError, check_fault, faults_for, load_plan
from services.agent.service import AgentService
from shared.bus import Retry
from shared.runtime import Deps, Service
from shared.schemas import AGENT_COMMANDS, AgentCommand, Fault

log = logging.getLogger("rackscale.agent.fleet")


def _node(cmd: AgentCommand) -> str:
    return cmd.node


def sim_fleet(
    domains: int,
    nodes_per_domain: int = 18,
    gpus: int = 4,
    *,
    cliques_per_domain: int = 1,
    seed: int = 0,
) -> list[SimBackend]:
    """One SimBackend per node of `Topology.uniform(domains, nodes_per_domain, gpus, cliques_per_domain=...)`.

    Node i of the fleet (in that order) gets seed `seed + i`, so every node's GPU UUIDs differ and a
    fleet is the same for the same arguments.
    """
    if domains < 1 or nodes_per_domain < 1:
        raise ValueError("a fleet needs at least one domain of at least one node")
    if cliques_per_domain < 1 or nodes_per_domain % cliques_per_domain:
        raise ValueError(f"cliques_per_domain={cliques_per_domain} must divide nodes_per_domain={nodes_per_domain}")
    per_clique = nodes_per_domain // cliques_per_domain
    fleet = []
    for d in range(domains):
        for n in range(nodes_per_domain):
            fleet.append(
                SimBackend(
                    f"d{d:02d}-n{n:02d}",
                    f"d{d:02d}",
                    clique_id=n // per_clique,
                    gpus=gpus,
                    seed=seed + d * nodes_per_domain + n,
                )
            )
    return fleet


class AgentFleet(Service):
    """Many agents, one process, one command consumer. Stopping the fleet stops every agent."""

    name = "agent"

    def __init__(
        self,
        deps: Deps,
        backends: Sequence[GpuBackend],
        *,
        durable: str = "fleet",
        stop_grace_s: float = 10.0,
        log_dir: Path | None = None,
        plan: Sequence[Fault] | None = None,
    ) -> None:
        """`plan`: scripted faults; None reads RACKSCALE_FAULT_PLAN (none when unset)."""
        super().__init__(deps)
        self.agents = {
            b.node: AgentService(deps, b, stop_grace_s=stop_grace_s, log_dir=log_dir, consume=False) for b in backends
        }
        if len(self.agents) != len(backends):
            raise ValueError("two backends of the fleet have the same node name")
        self.durable = durable
        self.ready = asyncio.Event()
        self.misrouted = 0
        faults = list(plan) if plan is not None else load_plan(deps.settings.fault_plan_file)
        for i, f in enumerate(faults):
            hit = self._targets(check_fault(f, f"fault plan[{i}]"))
            if not hit:
                raise FaultPlanError(
                    f"fault plan[{i}].{'node' if f.node else 'domain'}: {f.node or f.domain} "
                    "is no simulated node or domain of this fleet"
                )
        for b in backends:
            if isinstance(b, SimBackend):
                b.schedule(faults_for(b.node, b.domain, faults))

    def _targets(self, fault: Fault) -> list[SimBackend]:
        sims = [a.backend for a in self.agents.values() if isinstance(a.backend, SimBackend)]
        return [b for b in sims if faults_for(b.node, b.domain, [fault])]

    def inject(self, fault: Fault) -> list[str]:
        """Apply a fault now to the simulated nodes it names; the nodes hit. Raises ValueError if none."""
        hit = self._targets(check_fault(fault))
        if not hit:
            raise FaultPlanError(f"fault: {fault.node or fault.domain} is no simulated node or domain of this fleet")
        for b in hit:
            b.inject(fault)
        return [b.node for b in hit]

    async def start(self) -> None:
        await asyncio.gather(*(a.start() for a in self.agents.values()))
        self.spawn(
            self.bus.consume(
                self.names.agent_cmd_all,
                self.names.consumer(self.name, self.durable),
                AGENT_COMMANDS,
                self.handle,
                self.stop_event,
                ready=self.ready,
                key=_node,  # one lane per node: a node's commands in order, different nodes' concurrently
            ),
            "commands",
        )

    async def handle(self, cmd: AgentCommand, headers: Mapping[str, str]) -> None:
        agent = self.agents.get(cmd.node)
        if agent is None:
            self.misrouted += 1
            log.warning("command for node %s, which this fleet doesn't run: %s", cmd.node, cmd)
            return
        if agent.stop_event.is_set():
            # a stopped agent's commands wait in the stream, as they would for its own durable consumer
            raise Retry(f"the agent of {cmd.node} is stopped")
        await agent.handle(cmd, headers)

    async def on_stop(self) -> None:
        await asyncio.gather(*(a.stop(grace_s=self.stop_grace_s) for a in self.agents.values()))

    @property
    def stop_grace_s(self) -> float:
        return next(iter(self.agents.values())).stop_grace_s if self.agents else 0.0
