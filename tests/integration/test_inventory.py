"""inventory against real NATS JetStream and Redis: registration, missed heartbeats, drain, dead letters.

Time in inventory comes from an injected clock (`FakeClock`): the heartbeat timer sees a frozen clock and
does nothing, and the tests call `check_once(now)` themselves. Real waits only bound how long a test waits
for a message to arrive (polling with a deadline); no assertion depends on elapsed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import msgspec
import nats
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from services.agent.backends import SimBackend
from services.agent.service import AgentService
from services.inventory.service import InventoryService
from shared.bus import Bus
from shared.core.topology import GpuState, NodeState
from shared.names import Names
from shared.runtime import Deps, Service
from shared.schemas import (
    ADMIN_REPLY,
    EVENTS,
    AdminReply,
    AgentRegister,
    AgentReports,
    DeadLetter,
    GpuReport,
    Heartbeat,
    NodeAdmin,
    NodeChanged,
    NodeRecord,
    encode,
)
from shared.settings import Settings
from shared.store import Store
from shared.topology_view import topology_from_records
from shared.tracing import noop_tracer
from tests import streams

pytestmark = pytest.mark.asyncio

T = TypeVar("T")
WAIT_S = 10.0  # bound on waiting for a message; never an assertion
DEAD_LETTERS = msgspec.msgpack.Decoder(DeadLetter)
SETTINGS = Settings(heartbeat_s=0.1, missed_heartbeats=3)


class FakeClock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    """One test's namespace on the shared servers, with a raw client and the services it started."""

    nats_url: str
    redis_url: str
    names: Names
    nc: NatsClient
    redis: aioredis.Redis
    settings: Settings = SETTINGS
    services: list[Service] = field(default_factory=list)
    deps: list[Deps] = field(default_factory=list)

    @property
    def bus(self) -> Bus:
        """A bus on the test's own connection, for publishing as another service would."""
        return Bus(self.nc, self.names, "test")

    async def connect(self, service: str, clock: Callable[[], float] = time.time) -> Deps:
        bus = await Bus.connect(self.nats_url, self.names, service)
        await bus.ensure_streams()
        store = Store.from_url(self.redis_url, self.names)
        deps = Deps(self.settings, self.names, bus, store, tracer=noop_tracer(service), clock=clock)
        self.deps.append(deps)
        return deps

    async def start(self, service: Service) -> None:
        await service.start()
        self.services.append(service)

    async def inventory(self, clock: FakeClock) -> InventoryService:
        inv = InventoryService(await self.connect("inventory", clock))
        await self.start(inv)
        await self.until_serving()
        return inv

    async def until_serving(self) -> None:
        """Wait until inventory's subscriptions reach other connections.

        start() flushes its SUBs, yet a publish from another connection right after can still find no
        interest (about 1 in 100 here, right after streams were created; gone a few ms later). A node_admin
        request that gets an answer proves the subscriptions made before it are visible.
        """
        probe = NodeAdmin(node="readiness-probe", action="undrain")
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                await self.bus.request(self.names.node_admin, probe, timeout=1.0)
                return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)

    async def agent(self, backend: SimBackend, **kwargs: Any) -> AgentService:
        agent = AgentService(await self.connect("agent"), backend, **kwargs)
        await self.start(agent)
        await asyncio.wait_for(agent.ready.wait(), WAIT_S)
        return agent

    async def close(self) -> None:
        for svc in reversed(self.services):
            with contextlib.suppress(Exception):
                await svc.stop(grace_s=5.0)
        for deps in self.deps:
            with contextlib.suppress(Exception):
                await deps.close()
        jsm = self.nc.jsm()
        for spec in self.names.streams:
            with contextlib.suppress(NotFoundError):
                await jsm.delete_stream(spec.name)


@contextlib.asynccontextmanager
async def open_harness(
    nats_url: str, redis_url: str, namespace: str, nc: NatsClient, redis: aioredis.Redis
) -> AsyncIterator[Harness]:
    h = Harness(nats_url, redis_url, Names(prefix=namespace), nc, redis)
    await h.bus.ensure_streams()
    try:
        yield h
    finally:
        await h.close()


@pytest_asyncio.fixture
async def harness(
    nats_url: str, redis_url: str, namespace: str, nats_client: NatsClient, redis_client: aioredis.Redis
) -> AsyncIterator[Harness]:
    async with open_harness(nats_url, redis_url, namespace, nats_client, redis_client) as h:
        yield h


# -- waiting and reading streams ---------------------------------------------------------------------------


async def wait_until(probe: Callable[[], Awaitable[T | None]], what: str, timeout: float = WAIT_S) -> T:
    return await streams.wait_until(probe, what, timeout, poll_s=0.02)


async def stream_messages(h: Harness, subject: str, decoder: msgspec.msgpack.Decoder[T]) -> list[T]:
    """Everything the stream holds on `subject` now, in order."""
    return [decoder.decode(m.data) for m in await streams.read_stream(h.nc, h.names, subject)]


async def wait_for_messages(
    h: Harness, subject: str, decoder: msgspec.msgpack.Decoder[Any], done: Callable[[list[Any]], bool], what: str
) -> list[Any]:
    async def probe() -> list[Any] | None:
        msgs = await stream_messages(h, subject, decoder)
        return msgs if done(msgs) else None

    return await wait_until(probe, what)


async def node_events(h: Harness, node: str) -> list[NodeChanged]:
    return [e for e in await stream_messages(h, h.names.node_events, EVENTS) if isinstance(e, NodeChanged)]


async def wait_node_event(h: Harness, node: str, state: str, count: int = 1) -> list[NodeChanged]:
    def done(msgs: list[Any]) -> bool:
        return sum(isinstance(e, NodeChanged) and e.node == node and e.state == state for e in msgs) >= count

    msgs = await wait_for_messages(h, h.names.node_events, EVENTS, done, f"NodeChanged({node}, {state}) x{count}")
    return [e for e in msgs if isinstance(e, NodeChanged) and e.node == node]


async def wait_record(
    inv: InventoryService, node: str, check: Callable[[NodeRecord], bool] = lambda r: True
) -> NodeRecord:
    async def probe() -> NodeRecord | None:
        rec = await inv.store.get_node(node)
        return rec if rec is not None and check(rec) else None

    return await wait_until(probe, f"node record {node}")


# -- reports as an agent would send them ------------------------------------------------------------------


def register_msg(node: str = "d00-n00", domain: str = "d00", gpus: int = 4) -> AgentRegister:
    return AgentRegister(node=node, cluster_uuid=domain, clique_id=0, gpus=[GpuReport(index=i) for i in range(gpus)])


async def send(h: Harness, subject: str, msg: msgspec.Struct | bytes) -> None:
    if isinstance(msg, bytes):
        await h.nc.publish(subject, msg)
    else:
        await h.bus.publish_core(subject, msg)
    await h.nc.flush()


async def registered(h: Harness, inv: InventoryService, node: str = "d00-n00") -> NodeRecord:
    await send(h, h.names.agent_register, register_msg(node))
    return await wait_record(inv, node)


async def admin(h: Harness, node: str, action: Literal["drain", "undrain"], reason: str = "") -> AdminReply:
    raw = await h.bus.request(h.names.node_admin, NodeAdmin(node=node, action=action, reason=reason), timeout=WAIT_S)
    return ADMIN_REPLY.decode(raw)


async def node_state(h: Harness, node: str) -> str | None:
    value = await h.redis.get(h.names.node_state_key(node))  # the client decodes responses to str
    return None if value is None else str(value)


# -- tests -------------------------------------------------------------------------------------------------


async def test_agent_registers_and_the_node_is_up(harness: Harness) -> None:
    h = harness
    inv = await h.inventory(FakeClock())
    await h.agent(SimBackend("d02-n05", "d02", clique_id=1, gpus=4, seed=3))
    rec = await wait_record(inv, "d02-n05")
    assert (rec.state, rec.domain, rec.clique, rec.gpus, rec.backend, rec.drained) == ("up", "d02", 1, 4, "sim", False)
    assert rec.last_heartbeat == inv.now()
    assert await node_state(h, "d02-n05") == "up"
    assert await h.redis.smembers(h.names.nodes_key) == {"d02-n05"}
    (event,) = await wait_node_event(h, "d02-n05", "up")
    assert event.reason == "registered"
    topo, health = topology_from_records(await inv.store.nodes())
    assert topo.node_names == ("d02-n05",) and topo.group_names[topo.domain] == ("d02",)
    assert health.nodes == {} and health.gpus == {}


async def test_missed_heartbeats_mark_the_node_down_and_a_heartbeat_brings_it_back(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)
    limit = h.settings.missed_heartbeats * h.settings.heartbeat_s

    assert await inv.check_once(clock.t + limit - 0.05) == []  # not silent long enough yet
    assert (await inv.store.get_node("d00-n00")).state == "up"  # type: ignore[union-attr]

    (change,) = await inv.check_once(clock.t + limit + 1)
    assert (change.node, change.state) == ("d00-n00", "down")
    assert "no heartbeat" in change.reason
    rec = await inv.store.get_node("d00-n00")
    assert rec is not None and rec.state == "down"
    assert await node_state(h, "d00-n00") == "down"
    await wait_node_event(h, "d00-n00", "down")
    assert await inv.check_once(clock.t + limit + 2) == []  # down once, not again

    clock.t += limit + 2
    await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t))
    rec = await wait_record(inv, "d00-n00", lambda r: r.state == "up")
    assert rec.last_heartbeat == clock.t
    assert await node_state(h, "d00-n00") == "up"
    events = await wait_node_event(h, "d00-n00", "up", count=2)
    assert [(e.state, e.reason) for e in events] == [
        ("up", "registered"),
        ("down", change.reason),
        ("up", "heartbeat resumed"),
    ]


async def test_a_redis_that_went_back_in_time_does_not_make_a_heard_node_silent(harness: Harness) -> None:
    """A stale replica promoted holds old heartbeats: a node this inventory heard lately is not marked down."""
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)
    limit = h.settings.missed_heartbeats * h.settings.heartbeat_s
    clock.t += limit  # a heartbeat heard now...
    await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t))
    await wait_record(inv, "d00-n00", lambda r: r.last_heartbeat == clock.t)
    stale = await inv.store.get_node("d00-n00")
    assert stale is not None
    await inv.store.put_node(msgspec.structs.replace(stale, last_heartbeat=0.0), topology_changed=False)
    await inv.store.touch_nodes({"d00-n00": 0.0})  # ...that Redis, gone back in time, doesn't have
    await h.redis.zadd(h.names.heartbeats_key, {"d00-n00": 0.0})
    assert await inv.check_once(clock.t + limit - 0.05) == []
    (change,) = await inv.check_once(clock.t + limit + 1)  # silent since what it heard: down, as ever
    assert change.node == "d00-n00" and change.state == "down"


async def test_heartbeats_keep_the_node_up_without_bumping_the_topology(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)
    generation = await inv.store.topology_generation()
    for _ in range(3):
        clock.t += h.settings.heartbeat_s
        await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t))
        await wait_record(inv, "d00-n00", lambda r: r.last_heartbeat == clock.t)
        assert await inv.check_once(clock.t + h.settings.heartbeat_s) == []
    assert await inv.store.topology_generation() == generation


async def test_a_batch_of_heartbeats_writes_liveness_once_and_records_only_for_changes(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    for node in ("d00-n00", "d00-n01", "d00-n02"):
        await registered(h, inv, node)
    limit = h.settings.missed_heartbeats * h.settings.heartbeat_s
    assert sorted(c.node for c in await inv.check_once(clock.t + limit + 1)) == ["d00-n00", "d00-n01", "d00-n02"]
    assert {r.state for r in await inv.store.nodes()} == {"down"}
    raw_n00 = await inv.store.r.get(h.names.node_key("d00-n00"))

    clock.t += limit + 2
    sick = [GpuReport(index=0), GpuReport(index=1, health="degraded"), GpuReport(index=2), GpuReport(index=3)]
    out = await inv.heartbeats(
        [
            Heartbeat(node="d00-n01", at=clock.t),
            Heartbeat(node="d09-n99", at=clock.t),  # never registered
            Heartbeat(node="d00-n02", at=clock.t, gpus=sick),
        ]
    )
    assert out["d09-n99"] is None and inv.unknown_heartbeats == 1
    assert out["d00-n01"] is not None and out["d00-n01"].state == "up"
    assert out["d00-n02"] is not None and out["d00-n02"].gpu_health == {"1": "degraded"}
    assert await h.redis.zscore(h.names.heartbeats_key, "d09-n99") is None  # no liveness for strangers
    assert await inv.store.r.get(h.names.node_key("d00-n00")) == raw_n00  # no beat: its record untouched
    recs = {r.name: r for r in await inv.store.nodes()}
    assert {n: r.state for n, r in recs.items()} == {"d00-n00": "down", "d00-n01": "up", "d00-n02": "up"}
    assert recs["d00-n01"].last_heartbeat == clock.t

    # a beat that changes nothing moves only the liveness zset; readers still see the new time
    raw_n01 = await inv.store.r.get(h.names.node_key("d00-n01"))
    clock.t += 1
    await inv.heartbeats([Heartbeat(node="d00-n01", at=clock.t)])
    assert await inv.store.r.get(h.names.node_key("d00-n01")) == raw_n01
    assert (await inv.store.get_node("d00-n01")).last_heartbeat == clock.t  # type: ignore[union-attr]
    assert [c.node for c in await inv.check_once(clock.t + limit - 0.1)] == ["d00-n02"]

    # the periodic re-registration of an unchanged node is liveness only, too
    clock.t += 0.1
    await inv.register(register_msg("d00-n01"))
    assert await inv.store.r.get(h.names.node_key("d00-n01")) == raw_n01
    assert await h.redis.zscore(h.names.heartbeats_key, "d00-n01") == clock.t

    # and so is a batch of them, while a registration in the same batch that changes something is written
    clock.t += 0.1
    gen = await inv.store.topology_generation()
    changed = AgentRegister(node="d00-n00", cluster_uuid="d00", clique_id=0, gpus=sick)  # was down, one GPU sick
    await inv.registrations([register_msg("d00-n01"), changed])
    assert await inv.store.r.get(h.names.node_key("d00-n01")) == raw_n01
    assert await h.redis.zscore(h.names.heartbeats_key, "d00-n01") == clock.t
    n00 = await inv.store.get_node("d00-n00")
    assert n00 is not None and n00.state == "up" and n00.gpu_health == {"1": "degraded"}
    assert await inv.store.topology_generation() > gen


async def test_gpu_health_from_heartbeats(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)
    generation = await inv.store.topology_generation()
    gpus = [GpuReport(index=0), GpuReport(index=1, health="degraded"), GpuReport(index=3, health="down")]
    await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t, gpus=gpus))
    rec = await wait_record(inv, "d00-n00", lambda r: bool(r.gpu_health))
    assert rec.gpu_health == {"1": "degraded", "3": "down"}
    assert await inv.store.topology_generation() > generation
    events = await wait_node_event(h, "d00-n00", "up", count=2)
    assert events[-1].reason == "GPU health 1=degraded, 3=down"
    _, health = topology_from_records(await inv.store.nodes())
    assert health.gpus == {("d00-n00", 1): GpuState.DEGRADED, ("d00-n00", 3): GpuState.DOWN}


async def test_drain_and_undrain_by_request_reply(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)

    assert await admin(h, "d00-n00", "drain", "bad fan") == AdminReply(ok=True, state="draining")
    rec = await inv.store.get_node("d00-n00")
    assert rec is not None and (rec.state, rec.drained, rec.reason) == ("draining", True, "bad fan")
    assert await node_state(h, "d00-n00") == "draining"
    event = (await wait_node_event(h, "d00-n00", "draining"))[-1]
    assert event.reason == "drain: bad fan"
    assert await admin(h, "d00-n00", "drain", "bad fan") == AdminReply(ok=True, state="draining")  # idempotent

    # the drain survives the node going down and coming back
    await inv.check_once(clock.t + 100)
    assert await node_state(h, "d00-n00") == "down"
    clock.t += 100
    await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t))
    await wait_record(inv, "d00-n00", lambda r: r.state == "draining")
    _, health = topology_from_records(await inv.store.nodes())
    assert health.nodes == {"d00-n00": NodeState.DRAINING}

    assert await admin(h, "d00-n00", "undrain") == AdminReply(ok=True, state="up")
    assert await node_state(h, "d00-n00") == "up"
    rec = await inv.store.get_node("d00-n00")
    assert rec is not None and (rec.drained, rec.reason) == (False, "")
    states = [e.state for e in await wait_node_event(h, "d00-n00", "up", count=2)]
    assert states == ["up", "draining", "down", "draining", "up"]


async def test_admin_on_an_unknown_node_is_an_error(harness: Harness) -> None:
    h = harness
    await h.inventory(FakeClock())
    assert await admin(h, "nope", "drain") == AdminReply(ok=False, error="unknown node nope")
    assert await h.redis.exists(h.names.node_key("nope")) == 0


async def test_malformed_reports_are_dead_lettered_and_service_goes_on(harness: Harness) -> None:
    h = harness
    inv = await h.inventory(FakeClock())
    bad: list[tuple[str, bytes]] = [
        (h.names.agent_register, b"\x93not a register"),
        (h.names.agent_heartbeat, msgspec.msgpack.encode({"type": "agent.heartbeat", "node": "x"})),  # no `at`
        (h.names.agent_register, encode(register_msg(node="bad.name"))),  # decodes, but can't be a node
        (h.names.node_admin, b"{}"),
    ]
    for subject, msg in bad:
        await send(h, subject, msg)

    async def all_dead() -> bool:
        return inv.bus.dead_letters == len(bad)

    await wait_until(all_dead, "four dead letters")
    letters = await wait_for_messages(
        h, h.names.dead_letter("inventory"), DEAD_LETTERS, lambda m: len(m) == len(bad), "dead letters in the DLQ"
    )
    # one subscription per subject: their order across subjects is not fixed
    assert sorted((d.service, d.subject) for d in letters) == sorted(("inventory", s) for s, _ in bad)
    errors = {(d.subject, d.data): d.error for d in letters}
    assert "missing required field `at`" in errors[bad[1]]
    assert errors[bad[2]].startswith("node: 'bad.name'")
    assert set(errors) == set(bad)  # the original bytes ride along

    # still serving
    rec = await registered(h, inv, "d00-n09")
    assert rec.state == "up"
    assert await inv.store.get_node("bad.name") is None


async def test_a_fleets_batch_of_reports_counts_as_each_and_a_bad_one_is_dead_lettered_alone(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    regs = [register_msg("d01-n00"), register_msg("bad.name"), register_msg("d01-n01")]
    batch = AgentReports(reports=[*regs, Heartbeat(node="d01-n00", at=clock.t)])
    await send(h, h.names.agent_heartbeat, batch)
    for node in ("d01-n00", "d01-n01"):
        assert (await wait_record(inv, node)).state == "up"
    (letter,) = await wait_for_messages(
        h, h.names.dead_letter("inventory"), DEAD_LETTERS, lambda m: len(m) == 1, "the bad report's dead letter"
    )
    assert letter.error.startswith("reports[1]: node: 'bad.name'")
    assert letter.data == encode(register_msg("bad.name"))  # the one report, not the whole batch
    assert await inv.store.get_node("bad.name") is None


async def test_heartbeat_from_an_unregistered_node_waits_for_its_registration(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n03", at=clock.t))

    async def counted() -> bool:
        return inv.unknown_heartbeats == 1

    await wait_until(counted, "the unknown heartbeat")
    assert await inv.store.get_node("d00-n03") is None
    assert await registered(h, inv, "d00-n03")


async def test_restarted_inventory_gives_nodes_a_full_period(harness: Harness) -> None:
    h, clock = harness, FakeClock()
    first = await h.inventory(clock)
    await registered(h, first)
    await first.stop(grace_s=5.0)
    clock.t += 3600  # inventory was away for an hour
    second = await h.inventory(clock)
    limit = h.settings.missed_heartbeats * h.settings.heartbeat_s
    assert await second.check_once(clock.t + limit - 0.05) == []
    assert [c.node for c in await second.check_once(clock.t + limit + 1)] == ["d00-n00"]


async def test_redis_outage_drops_reports_with_a_warning_and_admin_says_so(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h, clock = harness, FakeClock()
    inv = await h.inventory(clock)
    await registered(h, inv)
    store = inv.deps.store
    inv.deps.store = Store.from_url("redis://127.0.0.1:1/0", h.names)  # nothing listens there
    try:
        await send(h, h.names.agent_heartbeat, Heartbeat(node="d00-n00", at=clock.t))
        reply = await admin(h, "d00-n00", "drain")
        assert not reply.ok and reply.error.startswith("inventory can't reach its store")

        async def warned() -> bool:
            return any("dropped, Redis unavailable" in r.getMessage() for r in caplog.records)

        await wait_until(warned, "the dropped-report warning")
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
    finally:
        await inv.deps.store.close()
        inv.deps.store = store
    assert await admin(h, "d00-n00", "drain") == AdminReply(ok=True, state="draining")  # serving again
