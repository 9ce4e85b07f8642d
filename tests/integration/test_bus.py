"""`shared.bus` against a real NATS server: keyed lanes of a consumer and ordered batches of publishes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from nats.aio.client import Client as NatsClient

from shared.bus import Bus, Outgoing
from shared.names import Names
from shared.schemas import EVENTS, Released
from tests.streams import wait_until

pytestmark = pytest.mark.asyncio


def _released(job: str, n: int) -> Released:
    return Released(job_id=job, reason=f"{job}{n}", at=float(n))


async def test_keyed_lanes_run_jobs_concurrently_and_each_job_in_order(nats_client: NatsClient, namespace: str) -> None:
    names = Names(prefix=namespace)
    bus = Bus(nats_client, names, "test")
    await bus.ensure_streams()
    subject = names.placement_events
    # a1 a2 b1 b2: published together, so one fetch holds them all
    await bus.publish_all([Outgoing(subject, _released(j, n)) for j, n in (("a", 1), ("a", 2), ("b", 1), ("b", 2))])
    handled: list[str] = []
    b_done = asyncio.Event()
    stop = asyncio.Event()

    async def handler(ev: Released, _headers: Mapping[str, str]) -> None:
        if ev.reason == "a1":
            # job a waits for job b: only possible when b's lane runs concurrently
            await asyncio.wait_for(b_done.wait(), 5)
        handled.append(ev.reason)
        if ev.reason == "b2":
            b_done.set()
        if len(handled) == 4:
            stop.set()

    await asyncio.wait_for(
        bus.consume(subject, names.consumer("test", "lanes"), EVENTS, handler, stop, key=lambda e: e.job_id), 10
    )
    assert handled == ["b1", "b2", "a1", "a2"]  # b overtook a; within each job, stream order


async def test_publish_all_keeps_the_order_in_the_stream(nats_client: NatsClient, namespace: str) -> None:
    names = Names(prefix=namespace)
    bus = Bus(nats_client, names, "test")
    await bus.ensure_streams()
    subject = names.placement_events
    await bus.publish_all([Outgoing(subject, _released("j", n), msg_id=f"j:{n}") for n in range(20)])
    await bus.publish_all([Outgoing(subject, _released("j", 3), msg_id="j:3")])  # a repeat: deduplicated
    sub = await bus.js.pull_subscribe(subject, durable="order", stream=names.stream_for(subject))
    msgs = await sub.fetch(30, timeout=2)
    assert [EVENTS.decode(m.data).reason for m in msgs] == [f"j{n}" for n in range(20)]


async def test_merged_neighbours_in_a_lane_are_handled_once_and_acked_together(
    nats_client: NatsClient, namespace: str
) -> None:
    names = Names(prefix=namespace)
    bus = Bus(nats_client, names, "test")
    await bus.ensure_streams()
    subject = names.placement_events
    # a1 a2 a3 b1 a4: b is in a lane of its own, so a1-a4 are neighbours in a's lane and merge; b has no merge
    order = (("a", 1), ("a", 2), ("a", 3), ("b", 1), ("a", 4))
    await bus.publish_all([Outgoing(subject, _released(j, n)) for j, n in order])
    handled: list[str] = []
    stop = asyncio.Event()

    def merge(a: Released, b: Released) -> Released | None:
        return Released(job_id=a.job_id, reason=f"{a.reason}+{b.reason}", at=b.at) if a.job_id == "a" else None

    async def handler(ev: Released, _headers: Mapping[str, str]) -> None:
        handled.append(ev.reason)
        if sum(r.count("+") + 1 for r in handled) == len(order):
            stop.set()

    durable = names.consumer("test", "merge")
    await asyncio.wait_for(
        bus.consume(subject, durable, EVENTS, handler, stop, key=lambda e: e.job_id, merge=merge), 10
    )
    assert sorted(handled) == ["a1+a2+a3+a4", "b1"]

    async def acked() -> bool:  # the server applies acks apart from the API's answers: asked until it has
        info = await bus.js.consumer_info(names.stream_for(subject), durable)
        return (info.num_ack_pending, info.num_pending) == (0, 0)

    assert await wait_until(acked, "every merged message acked", 10.0)
