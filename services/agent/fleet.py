"""A simulated fleet: many agents in one process, sharing one NATS connection (`rackscale up`).

`sim_fleet` builds the backends with `Topology.uniform`'s names (nodes `d03-n07`, domains `d03`, cliques
`d03.0`), so the topology inventory rebuilds from the agents' reports is the uniform one.

`AgentFleet` runs one `AgentService` per backend on shared `Deps`. Instead of one pull consumer per node
(hundreds of fetch loops), it binds one durable consumer on every node's command subject and hands each
command to the agent of its node; commands for nodes it doesn't run are acked and logged. A fleet too big for
one process runs as shards (`shard=`, `python -m services.fleet --first-domain`), each a child process whose
consumer takes only its own nodes' commands (filter subjects: NATS 2.10 and later; an older server ignores them,
and each shard's own consumer then sees every command and passes over the others': correct, each command is
delivered once to every shard).

Instead of a message per agent and period, the fleet sends its agents' reports (`AgentReports`) and telemetry
samples (`TelemetryBatch`) together: every `REPORT_TICK_S` the agents whose `phase` falls in that slot of the
period, as one message. At 278 domains that is ~100 messages a second instead of ~6,000, for the same reports.

Faults (services/agent/faults.py): the fleet hands each simulated node its entries of the fault plan
(`plan`, by default RACKSCALE_FAULT_PLAN), and `inject(fault)` applies one now to a running fleet. A plan
entry or an injected fault that hits no node of the fleet is an error naming it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from services.agent.backends import GpuBackend, SimBackend
from services.agent.faults import FaultPlanError, check_fault, faults_for, load_plan
from services.agent.service import AgentService, phase
from shared.bus import Retry
from shared.runtime import Deps, Service
from shared.schemas import AGENT_COMMANDS, AgentCommand, AgentReports, Fault, TelemetryBatch

log = logging.getLogger("rackscale.agent.fleet")

REPORT_TICK_S = 0.05  # the fleet's periodic sends go out in slots this long (late by at most this: nothing next to 3 s)
BATCH_MAX = 200  # reports or samples per message (a registration is ~0.5 KB: well under NATS's 1 MB payload)

Make = Callable[[AgentService], msgspec.Struct | None]


def _node(cmd: AgentCommand) -> str:
    return cmd.node


def sim_fleet(
    domains: int,
    nodes_per_domain: int = 18,
    gpus: int = 4,
    *,
    cliques_per_domain: int = 1,
    seed: int = 0,
    first_domain: int = 0,
) -> list[SimBackend]:
    """One SimBackend per node of `Topology.uniform(domains, nodes_per_domain, gpus, cliques_per_domain=...)`,
    or of its domains `first_domain .. first_domain + domains - 1` (one shard of a fleet run by several processes).

    Node i of the whole fleet (in that order) gets seed `seed + i`, so every node's GPU UUIDs differ and a
    fleet is the same for the same arguments, however it is sharded.
    """
    if domains < 1 or nodes_per_domain < 1:
        raise ValueError("a fleet needs at least one domain of at least one node")
    if first_domain < 0:
        raise ValueError(f"first_domain={first_domain} must be >= 0")
    if cliques_per_domain < 1 or nodes_per_domain % cliques_per_domain:
        raise ValueError(f"cliques_per_domain={cliques_per_domain} must divide nodes_per_domain={nodes_per_domain}")
    per_clique = nodes_per_domain // cliques_per_domain
    fleet = []
    for d in range(first_domain, first_domain + domains):
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
        shard: str | None = None,
        stop_grace_s: float = 10.0,
        log_dir: Path | None = None,
        plan: Sequence[Fault] | None = None,
    ) -> None:
        """`shard`: a name for this part of a fleet run by several processes (its consumer takes only its nodes'
        commands); None: the whole fleet. `plan`: scripted faults; None reads RACKSCALE_FAULT_PLAN (none when unset)."""
        super().__init__(deps)
        self.agents = {
            b.node: AgentService(deps, b, stop_grace_s=stop_grace_s, log_dir=log_dir, consume=False, periodic=False)
            for b in backends
        }
        if len(self.agents) != len(backends):
            raise ValueError("two backends of the fleet have the same node name")
        self.shard = shard
        self.durable = "fleet" if shard is None else f"fleet-{shard}"
        self.sent = 0  # messages of reports and samples sent (count, for tests and benchmarks)
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
        agents = list(self.agents.values())
        await self._send_reports(agents)  # every node registers before anything else
        s = self.deps.settings
        self.spawn(self._periodic(s.heartbeat_s, self._send_reports), "reports")
        self.spawn(self._periodic(s.telemetry_s, self._send_samples), "telemetry")
        own = [self.names.agent_cmd(node) for node in self.agents] if self.shard is not None else []
        self.spawn(
            self.bus.consume(
                self.names.agent_cmd_all,
                self.names.consumer(self.name, self.durable),
                AGENT_COMMANDS,
                self.handle,
                self.stop_event,
                ready=self.ready,
                key=_node,  # one lane per node: a node's commands in order, different nodes' concurrently
                filters=own,
            ),
            "commands",
        )

    # -- periodic reports, batched ----------------------------------------------------------------------
    async def _periodic(self, period: float, send: Callable[[list[AgentService]], Awaitable[None]]) -> None:
        """Every `period`, each agent's report (or sample) at its `phase` of the period, one message per slot of
        `REPORT_TICK_S`. A late loop catches up slot by slot: no agent misses a beat because others made it late."""
        slots = max(1, round(period / REPORT_TICK_S))
        by_slot: list[list[AgentService]] = [[] for _ in range(slots)]
        for agent in self.agents.values():
            by_slot[min(slots - 1, int(phase(agent.node) * slots))].append(agent)
        loop = asyncio.get_running_loop()
        tick = period / slots
        start, k = loop.time(), 0  # slot k % slots of period k // slots is due at start + k * tick
        while not self.stop_event.is_set():
            due = start + k * tick
            if (wait := due - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self.stop_event.wait(), timeout=wait)
                    return
                except TimeoutError:
                    pass
            agents = [a for a in by_slot[k % slots] if not a.stop_event.is_set()]
            if agents:
                await send(agents)
            k += 1

    async def _send_reports(self, agents: list[AgentService]) -> None:
        subject = self.names.agent_heartbeat
        await self._send(agents, AgentService.next_report, subject, lambda items: AgentReports(reports=items))

    async def _send_samples(self, agents: list[AgentService]) -> None:
        subject = self.names.telemetry_batch(self.shard or "fleet")
        await self._send(agents, AgentService.next_sample, subject, lambda items: TelemetryBatch(samples=items))

    async def _send(
        self, agents: list[AgentService], make: Make, subject: str, wrap: Callable[[list[Any]], msgspec.Struct]
    ) -> None:
        items = []
        for agent in agents:
            try:
                item = make(agent)
            except Exception:
                log.exception("%s: report not made; the next one will be", agent.node)
                continue
            if item is not None:
                items.append(item)
        for i in range(0, len(items), BATCH_MAX):
            chunk = items[i : i + BATCH_MAX]
            try:
                await self.bus.publish_core(subject, wrap(chunk))
                self.sent += 1
            except Exception:
                log.exception("%d reports not sent; the next ones will be", len(chunk))

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

    async def takes_own_commands_only(self) -> bool:
        """Whether this shard's consumer is filtered to its nodes' commands (the server kept the filter subjects)."""
        n = self.names
        info = await self.bus.js.consumer_info(n.stream_for(n.agent_cmd_all), n.consumer(self.name, self.durable))
        return bool(info.config.filter_subjects)

    async def on_stop(self) -> None:
        await asyncio.gather(*(a.stop(grace_s=self.stop_grace_s) for a in self.agents.values()))

    @property
    def stop_grace_s(self) -> float:
        return next(iter(self.agents.values())).stop_grace_s if self.agents else 0.0
