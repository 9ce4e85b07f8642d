"""GPU health from telemetry against real NATS and Redis: agents with fault plans → inventory's health rules →
node records (what the scheduler reads) and NodeChanged events.

Where hysteresis timing matters the agent is driven by hand on an injected clock shared with inventory
(`FakeClock`, 5 s per sample like the default RACKSCALE_TELEMETRY_S); elsewhere agents run their own loops
with short periods and the tests wait for what must follow. No assertion depends on elapsed time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient

from services.agent.backends import SimBackend
from services.agent.faults import parse_plan
from services.agent.fleet import AgentFleet, sim_fleet
from services.agent.service import AgentService
from services.inventory.service import InventoryService
from shared.core.topology import GpuState
from shared.schemas import ADMIN_REPLY, Fault, GpuSample, NodeAdmin, NodeChanged, Telemetry, TelemetryBatch, encode
from shared.settings import Settings
from shared.topology_view import topology_from_records
from tests.integration.test_inventory import (
    DEAD_LETTERS,
    FakeClock,
    Harness,
    node_events,
    open_harness,
    send,
    stream_messages,
    wait_node_event,
    wait_record,
    wait_until,
)

pytestmark = pytest.mark.asyncio

FAST = Settings(heartbeat_s=0.1, missed_heartbeats=3, telemetry_s=0.05)
PERIOD = 5.0


@pytest_asyncio.fixture
async def harness(
    nats_url: str, redis_url: str, namespace: str, nats_client: NatsClient, redis_client: aioredis.Redis
) -> AsyncIterator[Harness]:
    async with open_harness(nats_url, redis_url, namespace, nats_client, redis_client) as h:
        yield h


async def evaluated(inv: InventoryService, more_than: int) -> None:
    async def probe() -> bool:
        return inv.health.samples > more_than

    await wait_until(probe, f"inventory evaluated more than {more_than} samples")


async def health_events(h: Harness, node: str) -> list[NodeChanged]:
    return [e for e in await node_events(h, node) if e.node == node and e.changed_gpus]


async def wait_health_event(h: Harness, node: str, gpu: str, health: str) -> NodeChanged:
    async def probe() -> NodeChanged | None:
        hits = [e for e in await health_events(h, node) if e.changed_gpus.get(gpu) == health]
        return hits[-1] if hits else None

    return await wait_until(probe, f"NodeChanged({node}: GPU {gpu} {health})")


class HandDriven:
    """An agent not started: the test sends its registration and samples, advancing the shared clock."""

    def __init__(self, h: Harness, inv: InventoryService, agent: AgentService, clock: FakeClock) -> None:
        self.h, self.inv, self.agent, self.clock = h, inv, agent, clock

    @classmethod
    async def open(cls, h: Harness, node: str = "d00-n00") -> HandDriven:
        clock = FakeClock()
        inv = await h.inventory(clock)
        agent = AgentService(await h.connect("agent", clock), SimBackend(node, "d00", seed=1), consume=False)
        agent.started_at = clock.t
        await agent.report()  # registers
        await wait_record(inv, node)
        return cls(h, inv, agent, clock)

    @property
    def backend(self) -> SimBackend:
        assert isinstance(self.agent.backend, SimBackend)
        return self.agent.backend

    async def samples(self, n: int) -> None:
        """n samples PERIOD s apart; returns once inventory has evaluated each."""
        for _ in range(n):
            self.clock.t += PERIOD
            await self.agent.report()  # a heartbeat too, so inventory's timer never finds the node silent
            before = self.inv.health.samples
            assert await self.agent.send_telemetry() is not None
            await evaluated(self.inv, before)

    async def record(self) -> Any:
        return await self.inv.store.get_node(self.agent.node)


async def test_fatal_xid_from_a_fault_plan_marks_the_gpu_down_and_says_why(harness: Harness) -> None:
    h = harness
    h.settings = FAST
    inv = await h.inventory(time.time)  # type: ignore[arg-type]
    backend = SimBackend("d02-n07", "d02", seed=7)
    backend.schedule(parse_plan([{"at": 0.3, "node": "d02-n07", "gpu": 3, "xid": 79}]))
    await h.agent(backend)
    await wait_record(inv, "d02-n07")
    generation = await inv.store.topology_generation()

    event = await wait_health_event(h, "d02-n07", "3", "down")
    assert (event.state, event.cause, event.gpu_health, event.changed_gpus) == (
        "up",
        "xid_fatal",
        {"3": "down"},
        {"3": "down"},
    )
    assert "XID 79" in event.reason
    rec = await inv.store.get_node("d02-n07")
    assert rec is not None
    assert (rec.gpu_health, rec.rule_health, rec.agent_health) == ({"3": "down"}, {"3": "down"}, {})
    assert await inv.store.topology_generation() > generation  # the queue's topology cache is invalidated
    _, health = topology_from_records(await inv.store.nodes())
    assert health.gpus == {("d02-n07", 3): GpuState.DOWN}
    # the GPU stays off the bus: later samples change nothing, and heartbeats don't undo the rules' verdict
    await evaluated(inv, inv.health.samples + 5)
    assert [e.changed_gpus for e in await health_events(h, "d02-n07")] == [{"3": "down"}]
    assert (await inv.store.get_node("d02-n07")).gpu_health == {"3": "down"}  # type: ignore[union-attr]
    text = (await inv.metrics_text()).decode()
    assert 'rackscale_gpu_health_changes_total{cause="xid_fatal",health="down"} 1.0' in text
    assert 'rackscale_telemetry_samples_total{node_known="yes"}' in text


async def test_fault_injected_into_a_running_fleet(harness: Harness) -> None:
    h = harness
    h.settings = FAST
    inv = await h.inventory(time.time)  # type: ignore[arg-type]
    fleet = AgentFleet(await h.connect("agent"), sim_fleet(1, nodes_per_domain=3), plan=[])
    await h.start(fleet)
    for node in ("d00-n00", "d00-n01", "d00-n02"):
        await wait_record(inv, node)
    assert fleet.inject(Fault(node="d00-n01", gpu=2, xid=48)) == ["d00-n01"]
    event = await wait_health_event(h, "d00-n01", "2", "down")
    assert (event.cause, event.gpu_health) == ("xid_fatal", {"2": "down"})
    assert [(await inv.store.get_node(n)).gpu_health for n in ("d00-n00", "d00-n02")] == [{}, {}]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="d07"):
        fleet.inject(Fault(domain="d07", hot_c=10))


async def test_flapping_temperature_inside_the_window_changes_nothing(harness: Harness) -> None:
    d = await HandDriven.open(harness)
    # GPU 1 flaps above and below 90 C sample by sample; GPU 2 stays hot: the control that the rule can fire
    d.backend.inject(Fault(node=d.agent.node, gpu=1, temp_c=95.0, flap=1))
    d.backend.inject(Fault(node=d.agent.node, gpu=2, temp_c=95.0))
    await d.samples(2)
    assert (await d.record()).gpu_health == {}  # 2 hot samples: below the 3-sample hold
    await d.samples(1)
    event = await wait_health_event(harness, d.agent.node, "2", "degraded")
    assert (event.cause, event.gpu_health) == ("temperature", {"2": "degraded"})
    await d.samples(30)
    assert (await d.record()).gpu_health == {"2": "degraded"}
    assert [e.changed_gpus for e in await health_events(harness, d.agent.node)] == [{"2": "degraded"}]


async def test_degraded_gpu_recovers_after_the_clear_window(harness: Harness) -> None:
    d = await HandDriven.open(harness)
    # three links down for the samples at t=5, 10, 15 s: degraded (3 samples spanning 10 s)
    d.backend.inject(Fault(node=d.agent.node, gpu=0, nvlink_down=3, for_s=17.5))
    await d.samples(3)
    assert (await d.record()).gpu_health == {"0": "degraded"}
    await d.samples(12)  # links back from t=20 s: 12 clear samples span 55 s, inside the 60 s clear window
    assert (await d.record()).gpu_health == {"0": "degraded"}
    await d.samples(1)
    event = await wait_health_event(harness, d.agent.node, "0", "ok")
    assert (event.cause, event.gpu_health) == ("nvlink_down", {})


async def test_latched_fault_cleared_by_an_operator_or_a_new_boot(harness: Harness) -> None:
    h = harness
    d = await HandDriven.open(h)
    d.backend.inject(Fault(node=d.agent.node, gpu=1, xid=48))
    await d.samples(20)
    assert (await d.record()).gpu_health == {"1": "down"}  # latched: 100 s of clean samples change nothing

    raw = await h.bus.request(h.names.node_admin, NodeAdmin(node=d.agent.node, action="clear_health"), timeout=10)
    assert ADMIN_REPLY.decode(raw).ok
    event = await wait_health_event(h, d.agent.node, "1", "ok")
    assert (event.cause, event.gpu_health) == ("cleared", {})
    await d.samples(3)
    assert (await d.record()).gpu_health == {}

    # down again, then the agent restarts (a new boot id in its registration): cleared again
    d.backend.inject(Fault(node=d.agent.node, gpu=1, xid=48))
    await d.samples(1)
    assert (await d.record()).rule_health == {"1": "down"}
    restarted = AgentService(d.agent.deps, d.backend, consume=False)
    await restarted.report()
    rec = await wait_record(d.inv, d.agent.node, lambda r: r.boot_id == restarted.boot_id)
    assert (rec.gpu_health, rec.rule_health) == ({}, {})
    assert len([e for e in await health_events(h, d.agent.node) if e.cause == "cleared"]) == 2


async def test_silent_node_from_a_fault_plan_goes_down(harness: Harness) -> None:
    h = harness
    h.settings = FAST
    await h.inventory(time.time)  # type: ignore[arg-type]  # its own timer checks heartbeats
    backend = SimBackend("d05-n11", "d05")
    backend.schedule(parse_plan([{"at": 0.5, "node": "d05-n11", "silent": True}]))
    await h.agent(backend)
    (event,) = [e for e in await wait_node_event(h, "d05-n11", "down") if e.state == "down"]
    assert "no heartbeat" in event.reason


async def test_malformed_telemetry_is_dead_lettered_and_the_consumer_goes_on(harness: Harness) -> None:
    h = harness
    d = await HandDriven.open(h)
    bad_gpu = Telemetry(node=d.agent.node, at=0.0, gpus=[GpuSample(index=7)])
    await send(h, h.names.telemetry(d.agent.node), bad_gpu)
    await send(h, h.names.telemetry(d.agent.node), b"\x93not msgpack")
    await send(h, h.names.telemetry("bad"), encode(Telemetry(node="bad name!", at=0.0)))
    # a fleet's batch: the bad sample alone is dead-lettered, the good one is evaluated
    good = d.agent.next_sample()
    assert good is not None
    before = d.inv.health.samples
    unnamed = Telemetry(node="bad name 2", at=0.0)
    await send(h, h.names.telemetry_batch("fleet"), TelemetryBatch(samples=[unnamed, good]))

    async def letters() -> list[Any] | None:
        got = await stream_messages(h, h.names.dead_letter("inventory"), DEAD_LETTERS)
        return got if len(got) >= 4 else None

    dead = await wait_until(letters, "4 dead letters")
    errors = sorted(dl.error for dl in dead)
    assert any("gpus[].index" in e and "0..3" in e for e in errors)
    assert sum(e.startswith("node:") for e in errors) == 2
    assert encode(unnamed) in [dl.data for dl in dead]  # the one sample, not the batch

    async def evaluated_good() -> bool:
        return d.inv.health.samples > before

    await wait_until(evaluated_good, "the batch's good sample evaluated")
    await d.samples(1)  # still evaluating
