"""Faults of the servers under the mixed burst (issue 21), on servers of each test's own: it kills them,
whatever RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL say. The history checker judges each run; the faults not
survived yet wait in pending_faults.py."""

from __future__ import annotations

import asyncio

import pytest

from shared.schemas import NodeChanged
from tests.e2e.conftest import E2E, StackFactory
from tests.faults.conftest import Servers, own_nats_url, own_redis_url
from tests.faults.harness import finish, under_burst

pytestmark = pytest.mark.asyncio

nats_url = own_nats_url
redis_url = own_redis_url

DOMAINS, NODES = 2, 18
FAULT_AFTER = 30  # jobs accepted before the fault


async def test_nats_server_sigkilled_and_restarted_on_its_store(open_stack: StackFactory, own_servers: Servers) -> None:
    """nats-server SIGKILLed for longer than the node-down limit, then restarted on its store (JetStream synced on
    every write): nothing accepted is lost, every job succeeds, and no node is marked down for the outage."""
    e2e: E2E = await open_stack(domains=DOMAINS, nodes_per_domain=NODES)
    limit = e2e.stack.settings.missed_heartbeats * e2e.stack.settings.heartbeat_s
    rec, burst = await under_burst(e2e, seed=12)
    async with burst:
        await burst.wait_accepted(FAULT_AFTER)
        async with rec.fault("sigkill nats-server", recovery_s=10):
            await asyncio.to_thread(own_servers.nats.kill)
            await asyncio.sleep(limit + 1)
            await asyncio.to_thread(own_servers.nats.restart)
    jobs = await finish(e2e, rec, burst)
    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    assert len(jobs) == len(burst.accepted) and not bad, f"{len(bad)} jobs did not succeed: {list(bad.items())[:10]}"
    events = await e2e.decoded(e2e.names.node_events)
    downs = [(e.node, e.reason) for e in events if isinstance(e, NodeChanged) and e.state == "down"]
    assert not downs, f"{len(downs)} nodes marked down for the outage, e.g. {downs[:5]}"
