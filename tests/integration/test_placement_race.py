"""Two placement replicas on one orders stream can never hand out a GPU twice (issue #3, acceptance 8).

Each replica has its own Deps (NATS connection, Redis client) and they share the durable consumer, so they
split the orders between them and commit concurrently. Every round publishes pairs of conflicting
PlaceOrders (two jobs, same node and GPUs: all of one pair's first halves, then all of the second halves,
so the two halves of a pair tend to land on different replicas) plus orders that conflict with nothing.
Afterwards exactly one order of each pair is committed, every non-conflicting one is, and each GPU in
Redis is owned by at most one job: the one whose allocation names it. Then everything is released and the
next round reuses the same GPUs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from services.placement.service import PlacementService
from shared.bus import Bus
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import (
    EVENTS,
    Committed,
    NodeGpus,
    NodeRecord,
    PlaceOrder,
    Rejected,
    Released,
    ReleaseOrder,
)
from shared.settings import Settings
from shared.store import Store, ViewMark
from shared.tracing import noop_tracer
from tests import streams

pytestmark = pytest.mark.asyncio

WAIT_S = 30.0  # bound on waiting for the answers; never an assertion
NODES = [f"d00-n{i:02d}" for i in range(16)]
FREE_NODE = "d01-n00"  # orders here conflict with nothing
ROUNDS = 3


class Replicas:
    def __init__(self, nats_url: str, redis_url: str, names: Names, nc: NatsClient) -> None:
        self.nats_url, self.redis_url, self.names, self.nc = nats_url, redis_url, names, nc
        self.services: list[PlacementService] = []
        self.store = Store.from_url(redis_url, names)

    async def start(self, count: int) -> None:
        await self.store.open_view(ViewMark(), time.time())
        for i in range(count):
            bus = await Bus.connect(self.nats_url, self.names, "placement")
            await bus.ensure_streams()
            store = Store.from_url(self.redis_url, self.names)
            deps = Deps(Settings(prefix=self.names.prefix), self.names, bus, store, noop_tracer(f"placement-{i}"))
            svc = PlacementService(deps)
            await svc.start()
            self.services.append(svc)

    async def close(self) -> None:
        for svc in self.services:
            with contextlib.suppress(Exception):
                await svc.stop(grace_s=5.0)
            with contextlib.suppress(Exception):
                await svc.deps.close()
        await self.store.close()
        jsm = self.nc.jsm()
        for spec in self.names.streams:
            with contextlib.suppress(NotFoundError):
                await jsm.delete_stream(spec.name)

    async def publish(self, order: PlaceOrder | ReleaseOrder, msg_id: str) -> None:
        await Bus(self.nc, self.names, "test").publish(self.names.orders, order, msg_id=msg_id)

    async def answers(self) -> list[Any]:
        """Every placement event so far, in stream order."""
        msgs = await streams.read_stream(self.nc, self.names, self.names.placement_events)
        return [EVENTS.decode(m.data) for m in msgs]

    async def wait_answers(self, jobs: set[str], kinds: tuple[type, ...], what: str) -> list[Any]:
        """Until every job in `jobs` has an event of one of `kinds`; all events, in stream order."""
        deadline = time.monotonic() + WAIT_S
        while True:
            evs = await self.answers()
            if jobs <= {e.job_id for e in evs if isinstance(e, kinds)}:
                return evs
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)


@pytest_asyncio.fixture
async def replicas(
    nats_url: str, redis_url: str, namespace: str, nats_client: NatsClient, redis_client: aioredis.Redis
) -> AsyncIterator[Replicas]:
    names = Names(prefix=namespace)
    r = Replicas(nats_url, redis_url, names, nats_client)
    await Bus(nats_client, names, "test").ensure_streams()
    # the nodes are up, as inventory would have written them
    for node in [*NODES, FREE_NODE]:
        await r.store.put_node(NodeRecord(name=node, domain=node[:3], gpus=4, state="up"))
    try:
        await r.start(2)
        yield r
    finally:
        await r.close()


def order(job: str, node: str, gpus: list[int]) -> PlaceOrder:
    return PlaceOrder(
        job_id=job,
        attempt=1,
        nodes=[NodeGpus(node, gpus)],
        master_addr=node,
        command=[],
        duration_s=1.0,
        decided_at=time.time(),
    )


# per round, two disjoint GPU sets per node, each wanted by two jobs
GPU_SETS = (([0, 1], [2, 3]), ([0], [1, 2, 3]), ([0, 1, 2], [3]))


async def test_two_replicas_never_hand_out_a_gpu_twice(replicas: Replicas) -> None:
    handled = [0, 0]
    for rnd in range(ROUNDS):
        tag = uuid.uuid4().hex[:6]
        pairs: list[tuple[PlaceOrder, PlaceOrder]] = []
        for node in NODES:
            for k, gpus in enumerate(GPU_SETS[rnd % len(GPU_SETS)]):
                a, b = (order(f"r{rnd}-{tag}-{node}-{k}-{x}", node, gpus) for x in "ab")
                pairs.append((a, b))
        free = [order(f"r{rnd}-{tag}-free{i}", FREE_NODE, [i]) for i in range(4)]
        jobs = [o.job_id for p in pairs for o in p] + [o.job_id for o in free]

        for a, _ in pairs:
            await replicas.publish(a, f"{a.job_id}:1:place")
        for i, (_, b) in enumerate(pairs):
            await replicas.publish(b, f"{b.job_id}:1:place")
            if i < len(free):
                await replicas.publish(free[i], f"{free[i].job_id}:1:place")

        what = f"round {rnd}: an answer to each of {len(jobs)} orders"
        evs = await replicas.wait_answers(set(jobs), (Committed, Rejected), what)
        committed = {e.job_id for e in evs if isinstance(e, Committed)}
        rejected = {e.job_id for e in evs if isinstance(e, Rejected)}
        for a, b in pairs:
            won = {a.job_id, b.job_id} & committed
            assert len(won) == 1, f"round {rnd}: pair {a.job_id}/{b.job_id} committed {won or 'neither'}"
            lost = ({a.job_id, b.job_id} - won).pop()
            assert lost in rejected, f"round {rnd}: the losing order {lost} got no Rejected"
        assert {o.job_id for o in free} <= committed, f"round {rnd}: an order without a conflict was rejected"

        # Redis agrees: each GPU owned by exactly the job whose allocation names it
        allocs = {a.job_id: a for a in await replicas.store.allocations()}
        assert set(allocs) == committed & set(jobs), (sorted(allocs), sorted(committed & set(jobs)))
        claimed: dict[tuple[str, int], str] = {}
        for a in allocs.values():
            for ng in a.nodes:
                for g in ng.gpus:
                    assert (ng.node, g) not in claimed, f"{ng.node} GPU {g}: {claimed[(ng.node, g)]} and {a.job_id}"
                    claimed[(ng.node, g)] = a.job_id
        for node in [*NODES, FREE_NODE]:
            owners = await replicas.store.gpu_owners(node)
            assert owners == {g: j for (n, g), j in claimed.items() if n == node}, (node, owners)

        for i, svc in enumerate(replicas.services):
            handled[i] = svc.commits + svc.rejections

        # release everything: the next round hands out the same GPUs again
        for job in sorted(committed & set(jobs)):
            await replicas.publish(ReleaseOrder(job_id=job, reason="round over"), f"{job}:release")

        await replicas.wait_answers(committed & set(jobs), (Released,), f"round {rnd}: every release answered")
        assert await replicas.store.allocations() == []
        for node in [*NODES, FREE_NODE]:
            assert await replicas.store.gpu_owners(node) == {}, node

    # both replicas took part (they share the durable consumer)
    assert all(handled), f"orders handled per replica: {handled}"
