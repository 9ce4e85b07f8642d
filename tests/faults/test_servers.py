"""The server launchers the fault tests kill (tests/servers.py): each starts, works, survives what it is for,
and tears down. They start their own servers whatever RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL say."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis
from nats.js.api import StorageType, StreamConfig
from redis.asyncio.sentinel import Sentinel

from shared.embedded import EmbeddedNats
from tests.servers import NatsCluster, SentinelSet, wait_for

pytestmark = pytest.mark.asyncio


async def test_a_nats_server_sigkilled_comes_back_on_its_port_and_store(tmp_path: Path) -> None:
    server = EmbeddedNats(store_dir=tmp_path / "store")
    await asyncio.to_thread(server.start)
    try:
        nc = await nats.connect(server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="KEPT", subjects=["kept.>"], storage=StorageType.FILE))
        await js.publish("kept.a", b"1", headers={"Nats-Msg-Id": "a"})
        port = server.port
        await asyncio.to_thread(server.kill)
        with pytest.raises(Exception):  # noqa: B017 (nats-py raises timeouts or "no responders" here)
            await js.publish("kept.b", b"2", headers={"Nats-Msg-Id": "b"}, timeout=0.5)
        await asyncio.to_thread(server.restart)
        assert server.port == port and (tmp_path / "store" / "jetstream").is_dir()
        # the same client reconnects by itself (and flushes what it buffered: the publish that timed out may land
        # now, so the retry carries the same msg id); the stream and its dedup window survived
        ack = await wait_for(lambda: js.publish("kept.b", b"2", headers={"Nats-Msg-Id": "b"}), "a publish again")
        assert ack.seq == 2
        assert (await js.publish("kept.a", b"1", headers={"Nats-Msg-Id": "a"})).duplicate
        await nc.close()
    finally:
        await asyncio.to_thread(server.stop)
    assert not server.running


async def test_a_nats_cluster_keeps_an_r3_stream_when_its_leader_is_sigkilled() -> None:
    cluster = NatsCluster(3)
    await asyncio.to_thread(cluster.start)
    nc = None
    try:
        nc = await nats.connect(cluster.url.split(","), reconnect_time_wait=0.2, max_reconnect_attempts=-1)
        await cluster.wait_ready(nc)
        js = nc.jetstream()
        config = StreamConfig(name="R3", subjects=["r3.>"], storage=StorageType.FILE, num_replicas=3)
        await wait_for(lambda: js.add_stream(config), "an R3 stream (every peer current)")

        async def publish(i: int) -> None:
            """Until JetStream took message i (a stream without a leader yet answers nothing: ask again)."""
            send = functools.partial(js.publish, "r3.x", b"x", headers={"Nats-Msg-Id": f"m{i}"}, timeout=1)
            await wait_for(send, f"message {i} stored")

        leader = await cluster.stream_leader(nc, "R3")
        for i in range(10):
            await publish(i)
        leader = await cluster.stream_leader(nc, "R3")
        await asyncio.to_thread(cluster.kill, leader)
        # the two others elect a new leader and keep taking writes (the client may be moved to another server)
        for i in range(10, 20):
            await publish(i)
        assert await cluster.stream_leader(nc, "R3") != leader
        await asyncio.to_thread(cluster.restart, leader)

        async def caught_up() -> bool:
            info = await nc.jsm().stream_info("R3")
            return info.state.messages == 20 and all(r.current for r in info.cluster.replicas or [])

        await wait_for(caught_up, "20 messages with every replica current")
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        await asyncio.to_thread(cluster.stop)
    assert not any(n.running for n in cluster.nodes)


async def test_a_sentinel_set_promotes_the_replica_when_the_primary_is_sigkilled() -> None:
    servers = SentinelSet()
    await asyncio.to_thread(servers.start)
    try:
        await servers.wait_ready()
        assert servers.url.startswith("redis+sentinel://") and servers.url.endswith("/rackscale/0")
        sentinel = Sentinel([(s.host, s.port) for s in servers.sentinels], socket_timeout=1)
        primary = sentinel.master_for("rackscale", decode_responses=True, socket_timeout=1)
        await primary.set("k", "v")
        assert int(await primary.execute_command("WAIT", 1, 5000)) == 1  # the replica has it
        old = await servers.primary()
        assert old[1] == servers.primary_server.port
        await asyncio.to_thread(servers.primary_server.kill)
        assert servers.replica is not None
        assert await servers.wait_failover(old) == (servers.replica.host, servers.replica.port)
        # a client that asks the Sentinels again reaches the promoted replica, with the write and writable
        await wait_for(lambda: primary.set("k2", "v2"), "a write on the new primary")
        assert await primary.get("k") == "v"
        await primary.aclose()
        direct = aioredis.Redis(host=servers.replica.host, port=servers.replica.port, decode_responses=True)
        assert (await direct.info("replication"))["role"] == "master"
        await direct.aclose()
    finally:
        await asyncio.to_thread(servers.stop)
    assert not any(s.running for s in servers.sentinels)
