"""The whole system in one process: servers (embedded unless URLs are given), every service, a simulated
fleet of GPU agents. Behind `rackscale up`, the end-to-end tests and `bench/e2e_bench.py`.

Each service gets its own connections (`Deps`), exactly as separate processes would; they share only
the event loop. `start_process`/`kill_process` run one service as a real child process instead, for the
crash tests (SIGKILL is only honest against a real process). A large simulated fleet runs in child processes
of its own (`fleet_processes`, shards of whole domains: `python -m services.fleet --first-domain`), so the
agents' work doesn't share the services' event loop or core; `rackscale up` then runs the gateway in a process of
its own too (as deployed), so its requests don't wait behind the queue's cycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from services.agent.fleet import AgentFleet, sim_fleet
from services.gateway.service import GatewayService
from services.inventory.service import InventoryService
from services.migration.service import MigrationService
from services.placement.service import PlacementService
from services.queue.service import QueueService
from shared.embedded import EmbeddedNats, EmbeddedValkey, free_port
from shared.runtime import Deps, Service, settle_heap
from shared.settings import Settings
from shared.tracing import Tracer

SERVICES: dict[str, type[Service]] = {
    "inventory": InventoryService,
    "placement": PlacementService,
    "queue": QueueService,
    "migration": MigrationService,
    "gateway": GatewayService,
}


@dataclass
class StackOptions:
    domains: int = 4
    nodes_per_domain: int = 18
    gpus_per_node: int = 4
    settings: Settings = field(default_factory=Settings)
    in_process: tuple[str, ...] = ("inventory", "placement", "queue", "gateway")  # others: child processes
    migration: Literal["in_process", "process", "off"] = "in_process"  # the migration service (crash tests: process)
    agents: bool = True
    fleet_processes: int = 0  # > 0: the agents in that many child processes instead of this one (a large fleet)
    fleet_timeout_s: float = 120.0  # how long start() waits for a child fleet's nodes to be up
    tracer_factory: Callable[[str], Tracer] | None = None  # tests: in-memory exporters
    log_dir: Path | None = None


class GatewayStartError(Exception):
    """A gateway in a child process did not come up: the message says why."""


class FleetStartError(Exception):
    """A simulated fleet in child processes did not come up: the message says how far it got."""


class Stack:
    def __init__(self, opts: StackOptions) -> None:
        self.opts = opts
        self.settings = opts.settings
        self.nats: EmbeddedNats | None = None
        self.redis: EmbeddedValkey | None = None
        self.services: dict[str, Service] = {}
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.fleet: AgentFleet | None = None
        self.fleet_shards: list[subprocess.Popen[bytes]] = []

    @property
    def nats_url(self) -> str:
        assert self.settings.nats_url
        return self.settings.nats_url

    @property
    def redis_url(self) -> str:
        assert self.settings.redis_url
        return self.settings.redis_url

    @property
    def gateway_url(self) -> str:
        gw = self.services.get("gateway")
        port = gw.port if isinstance(gw, GatewayService) else self.settings.gateway_port
        return f"http://{self.settings.gateway_host}:{port}"

    async def start(self) -> Stack:
        s = self.settings
        loop = asyncio.get_running_loop()
        if not s.nats_url:
            self.nats = await loop.run_in_executor(None, lambda: EmbeddedNats().start())
            s = dataclasses.replace(s, nats_url=self.nats.url)
        if not s.redis_url:
            self.redis = await loop.run_in_executor(None, lambda: EmbeddedValkey().start())
            s = dataclasses.replace(s, redis_url=self.redis.url)
        if "gateway" not in self.opts.in_process and s.gateway_port == 0:
            s = dataclasses.replace(s, gateway_port=free_port(s.gateway_host))  # a child's port 0 stays its secret
        self.settings = s
        for name in ("inventory", "placement", "queue", "gateway"):
            if name in self.opts.in_process:
                await self.start_service(name)
            else:
                self.start_process(name)
        if self.opts.migration == "in_process":
            await self.start_service("migration")
        elif self.opts.migration == "process":
            self.start_process("migration")
        if self.opts.agents and self.opts.fleet_processes > 0:
            await self.start_fleet_processes(self.opts.fleet_processes)
        elif self.opts.agents:
            deps = await self._deps("agent")
            backends = sim_fleet(self.opts.domains, self.opts.nodes_per_domain, self.opts.gpus_per_node)
            self.fleet = AgentFleet(deps, backends, log_dir=self.opts.log_dir)
            await self.fleet.start()
            await self.fleet.ready.wait()
        settle_heap()
        return self

    async def _deps(self, name: str) -> Deps:
        tracer = self.opts.tracer_factory(name) if self.opts.tracer_factory else None
        s = self.settings
        return await Deps.connect(s, name, self.nats_url, self.redis_url, s.names(), tracer=tracer)

    async def start_service(self, name: str) -> Service:
        service = SERVICES[name](await self._deps(name))
        await service.start()
        self.services[name] = service
        return service

    async def stop_service(self, name: str) -> None:
        service = self.services.pop(name)
        await service.stop()
        await service.deps.close()

    # -- child processes (crash tests) -------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        for row in Settings.describe():
            value = getattr(s, row.field)
            if value is not None:
                env[row.env] = str(value)
        return env

    def start_process(self, name: str) -> subprocess.Popen[bytes]:
        out = (self.opts.log_dir / f"{name}.log").open("ab") if self.opts.log_dir else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"], env=self._env(), stdout=out, stderr=subprocess.STDOUT
        )
        self.processes[name] = proc
        return proc

    def shard_domains(self, shards: int) -> list[tuple[int, int]]:
        """(first domain, domains) of each of `shards` child fleets: whole domains, as even as they split."""
        d = self.opts.domains
        shards = max(1, min(shards, d))
        bounds = [d * i // shards for i in range(shards + 1)]
        return [(bounds[i], bounds[i + 1] - bounds[i]) for i in range(shards)]

    async def start_fleet_processes(self, shards: int) -> None:
        """The simulated agents as `shards` child processes; returns once every node is up (or raises)."""
        o = self.opts
        for first, count in self.shard_domains(shards):
            cmd = [sys.executable, "-m", "services.fleet", "--domains", str(count), "--first-domain", str(first)]
            cmd += ["--nodes-per-domain", str(o.nodes_per_domain), "--gpus", str(o.gpus_per_node)]
            out = (o.log_dir / f"fleet-{first}.log").open("ab") if o.log_dir else subprocess.DEVNULL
            self.fleet_shards.append(subprocess.Popen(cmd, env=self._env(), stdout=out, stderr=subprocess.STDOUT))
        await self.wait_nodes_up(o.domains * o.nodes_per_domain, o.fleet_timeout_s)

    async def wait_nodes_up(self, nodes: int, timeout_s: float) -> None:
        """Until inventory has `nodes` nodes up; FleetStartError naming how many are, or a fleet that exited."""
        deps = await self._deps("stack")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                states = [r.state for r in await deps.store.nodes()]
                up = states.count("up")
                if up >= nodes:
                    return
                if dead := [p.args for p in self.fleet_shards if p.poll() is not None]:
                    raise FleetStartError(f"a simulated fleet process exited: {' '.join(dead[0])}")
                if loop.time() > deadline:
                    raise FleetStartError(f"{up} of {nodes} nodes up after {timeout_s:g}s ({len(states)} registered)")
                await asyncio.sleep(0.5)
        finally:
            await deps.close()

    async def wait_gateway(self, timeout_s: float) -> None:
        """Until the gateway answers /healthz with 200 (one in a child process answers a while after its spawn);
        GatewayStartError when it exited or didn't in time."""
        import aiohttp  # only for a gateway in a child process

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with http.get(f"{self.gateway_url}/healthz") as r:
                        if r.status == 200:
                            return
                proc = self.processes.get("gateway")
                if proc is not None and proc.poll() is not None:
                    raise GatewayStartError(f"the gateway process exited with {proc.returncode}")
                if loop.time() > deadline:
                    raise GatewayStartError(f"the gateway at {self.gateway_url} did not answer in {timeout_s:g}s")
                await asyncio.sleep(0.2)

    def kill_process(self, name: str) -> None:
        proc = self.processes.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    # -- teardown ----------------------------------------------------------------------------------------
    async def stop(self) -> None:
        if self.fleet is not None:
            await self.fleet.stop()
            await self.fleet.deps.close()
            self.fleet = None
        for name in ("migration", "gateway", "queue", "placement", "inventory"):
            if name in self.services:
                await self.stop_service(name)
        children = [*self.fleet_shards, *self.processes.values()]
        for proc in children:
            proc.terminate()
        for proc in children:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.processes.clear()
        self.fleet_shards.clear()
        loop = asyncio.get_running_loop()
        for server in (self.nats, self.redis):
            if server is not None:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(None, server.stop)

    async def __aenter__(self) -> Stack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
