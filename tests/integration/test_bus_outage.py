"""A bus outage is not a node's silence: nats-server SIGKILLed and restarted on its store, for longer than the
node-down limit, marks no node down; after its reconnect inventory gives every node a fresh grace.

The test runs its own nats-server (with a JetStream store dir) whatever RACKSCALE_NATS_URL says: it kills it.
Inventory's time is an injected clock the test advances (its own timer sees the same clock, so it can only
judge at the times the test sets), so no judgement depends on how fast this machine runs. Simulated agents
beat on real time, as in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats
import pytest
import pytest_asyncio

from services.agent.fleet import AgentFleet, sim_fleet
from services.inventory.service import InventoryService
from shared.bus import Bus
from shared.embedded import EmbeddedNats
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import EVENTS, NodeChanged
from shared.settings import Settings
from shared.store import Store
from shared.tracing import noop_tracer
from tests import streams
from tests.integration.conftest import delete_redis_namespace

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
WAIT_S = 20.0  # bound on waiting for something to happen; never an assertion
SETTINGS = Settings(heartbeat_s=0.2, missed_heartbeats=3)
LIMIT = SETTINGS.missed_heartbeats * SETTINGS.heartbeat_s
NODES = [f"d00-n{i:02d}" for i in range(4)]


class FakeClock:
    def __init__(self, t: float = 2_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


async def wait_until(probe: Callable[[], Awaitable[T | None]], what: str) -> T:
    return await streams.wait_until(probe, what, WAIT_S, poll_s=0.02)


class Outage:
    """Own nats-server; inventory on a fake clock; a fleet of simulated agents on real time."""

    def __init__(self, server: EmbeddedNats, redis_url: str, names: Names) -> None:
        self.server, self.redis_url, self.names = server, redis_url, names
        self.clock = FakeClock()
        self.deps: list[Deps] = []
        self.inventory: InventoryService | None = None
        self.fleet: AgentFleet | None = None

    async def connect(self, service: str, clock: Callable[[], float]) -> Deps:
        bus = await Bus.connect(self.server.url, self.names, service)
        await bus.ensure_streams()
        store = Store.from_url(self.redis_url, self.names)
        deps = Deps(SETTINGS, self.names, bus, store, tracer=noop_tracer(service), clock=clock)
        self.deps.append(deps)
        return deps

    async def start(self) -> None:
        self.inventory = InventoryService(await self.connect("inventory", self.clock))
        await self.inventory.start()
        self.fleet = AgentFleet(await self.connect("agent", time.time), sim_fleet(1, len(NODES)), plan=[])
        await self.fleet.start()

    @property
    def inv(self) -> InventoryService:
        assert self.inventory is not None
        return self.inventory

    async def heard_at(self) -> dict[str, float]:
        """Each node's last heartbeat as inventory recorded it (its fake time)."""
        recs = await self.inv.store.get_nodes(NODES)
        return {r.name: r.last_heartbeat for r in recs if r is not None}

    async def all_heard_since(self, t: float, nodes: list[str] = NODES) -> bool:
        heard = await self.heard_at()
        return all(heard.get(n, float("-inf")) >= t for n in nodes)

    async def node_events(self) -> list[NodeChanged]:
        nc = await nats.connect(self.server.url, connect_timeout=5, max_reconnect_attempts=0)
        try:
            msgs = await streams.read_stream(nc, self.names, self.names.node_events)
        finally:
            await nc.close()
        return [e for e in (EVENTS.decode(m.data) for m in msgs) if isinstance(e, NodeChanged)]

    async def close(self) -> None:
        for svc in (self.fleet, self.inventory):
            if svc is not None:
                with contextlib.suppress(Exception):
                    await svc.stop(grace_s=5.0)
        for deps in self.deps:
            with contextlib.suppress(Exception):
                await deps.close()


@pytest_asyncio.fixture
async def outage(tmp_path: Path, redis_url: str, namespace: str) -> AsyncIterator[Outage]:
    server = EmbeddedNats(store_dir=tmp_path / "jetstream").start()
    o = Outage(server, redis_url, Names(prefix=namespace))
    try:
        await o.start()
        yield o
    finally:
        await o.close()
        server.stop()
        await delete_redis_namespace(redis_url, namespace)


async def test_a_nats_restart_longer_than_the_node_down_limit_marks_no_node_down(outage: Outage) -> None:
    o, inv, clock = outage, outage.inv, outage.clock

    async def registered() -> bool:
        recs = await inv.store.get_nodes(NODES)
        return all(r is not None and r.state == "up" for r in recs)

    await wait_until(registered, "every node registered and up")
    clock.t += 0.5 * LIMIT
    await wait_until(lambda: o.all_heard_since(clock.t), "every node's heartbeat at the fake time")
    last_beat = clock.t

    # nats-server dies: inventory hears nothing, nor do the agents
    o.server.kill()

    async def deaf() -> bool:
        return not inv.bus.connected

    await wait_until(deaf, "inventory to notice the outage")
    clock.t += 10 * LIMIT  # far past the limit since every node's last heartbeat
    assert await inv.check_once() == []
    assert inv.hearing.deaf
    await asyncio.sleep(3 * LIMIT)  # the outage lasts longer than the limit in real time too
    clock.t += 10 * LIMIT
    assert await inv.check_once() == []

    # back on the same port and store
    await asyncio.to_thread(o.server.restart)

    async def reconnected() -> bool:
        return inv.bus.connected and inv.bus.reconnects >= 1

    await wait_until(reconnected, "inventory's reconnect")
    back = clock.t
    # no heartbeat since `last_beat`, 20 limits ago: a fresh grace, so nobody is judged yet
    assert clock.t - last_beat > 10 * LIMIT
    assert await inv.check_once() == []
    assert (inv.hearing.deaf, inv.hearing.since) == (False, back)
    clock.t = back + 0.5 * LIMIT
    assert await inv.check_once() == []

    # the agents reconnect and beat again; inventory hears them within the grace
    await wait_until(lambda: o.all_heard_since(clock.t), "every node's heartbeat after the reconnect")
    clock.t = back + 1.4 * LIMIT  # past the grace; the last beats are 0.9 limits old
    assert await inv.check_once() == []
    recs = await inv.store.get_nodes(NODES)
    assert [(r.name, r.state) for r in recs if r is not None] == [(n, "up") for n in NODES]
    events = await o.node_events()
    assert {e.node for e in events} == set(NODES)  # their registrations, from the stream that survived
    assert not [e for e in events if e.state == "down"], events

    # the check is live: a node that really goes silent is marked down, and only it
    await wait_until(lambda: o.all_heard_since(clock.t), "every node's heartbeat at this time")
    assert o.fleet is not None
    gone = NODES[0]
    await o.fleet.agents[gone].stop(grace_s=1.0)
    others = NODES[1:]
    # steps shorter than the limit, each until the others beat at its time: only `gone` falls silent for longer
    # (the first step's flush takes a beat of `gone` still on its way, if any)
    for _ in range(4):
        clock.t += 0.6 * LIMIT
        await wait_until(lambda: o.all_heard_since(clock.t, others), "the other nodes' heartbeats")
    await inv.check_once()  # (or the timer's check got there first)

    async def down_events() -> list[NodeChanged]:
        return [e for e in await o.node_events() if e.state == "down"]

    (down,) = await wait_until(down_events, "the silent node's down event")
    assert down.node == gone and "no heartbeat for" in down.reason
    recs = await inv.store.get_nodes(NODES)
    assert [(r.name, r.state) for r in recs if r is not None] == [(gone, "down")] + [(n, "up") for n in others]


async def test_a_server_that_does_not_answer_a_round_trip_judges_nobody(outage: Outage) -> None:
    """A connection can look up and be dead (a network cut nothing announced): a check that finds nodes silent
    asks the server for a round trip first, and without an answer judges nobody; once the server answers again,
    every node gets a fresh grace."""
    o, inv, clock = outage, outage.inv, outage.clock

    async def registered() -> bool:
        return all(r is not None for r in await inv.store.get_nodes(NODES))

    await wait_until(registered, "every node registered")
    assert o.fleet is not None
    await o.fleet.stop(grace_s=1.0)  # every node falls silent in Redis
    clock.t += 2 * LIMIT  # the grace after inventory's start is over: silent nodes would be judged

    probes: list[bool] = []

    async def no_answer(timeout: float = 2.0) -> bool:
        probes.append(False)
        return False

    inv.bus.answers = no_answer  # type: ignore[method-assign]  # a connection that looks up but is dead

    async def probed() -> bool:
        # (a last beat flushed after the stop may stamp a node later: time goes on until the check finds one silent)
        clock.t += 10 * LIMIT
        assert await inv.check_once() == []
        return bool(probes)

    await wait_until(probed, "a check that finds silent nodes and asks the server first")
    assert inv.hearing.deaf
    del inv.bus.answers  # the server answers again: a fresh grace from the next look
    assert await inv.check_once() == []
    assert not inv.hearing.deaf and inv.hearing.since == clock.t
    recs = await inv.store.get_nodes(NODES)
    assert all(r is not None and r.state == "up" for r in recs)
    assert not [e for e in await o.node_events() if e.state == "down"]
    clock.t += LIMIT + 0.01  # still silent a whole limit after the break: now they are judged

    async def all_down() -> bool:
        # (a last beat flushed after the stop may have stamped a node later: time goes on until it is judged)
        clock.t += 0.1 * LIMIT
        await inv.check_once()
        return all(r is not None and r.state == "down" for r in await inv.store.get_nodes(NODES))

    await wait_until(all_down, "every node down")
