"""Smoke tests of the server features Rackscale relies on, against real NATS JetStream and Redis/Valkey.

They run against the session servers (embedded, or RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL); the crash
and startup tests start their own embedded servers, so they run in both setups.
"""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import nats
import pytest
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from shared.embedded import EmbeddedNats, EmbeddedValkey, ServerStartError
from shared.redis_client import redis_client as make_redis_client
from tests.integration.conftest import delete_nats_namespace
from tests.servers import ValkeyCluster, wait_for

pytestmark = pytest.mark.asyncio


async def _file_stream(nc: NatsClient, namespace: str) -> str:
    name = f"{namespace}_JOBS"
    await nc.jsm().add_stream(StreamConfig(name=name, subjects=[f"{namespace}.jobs.>"], storage=StorageType.FILE))
    return name


# -- NATS JetStream -----------------------------------------------------------------------------------


async def test_file_stream_is_created(nats_client: NatsClient, namespace: str) -> None:
    name = await _file_stream(nats_client, namespace)
    info = await nats_client.jsm().stream_info(name)
    assert info.config.storage == StorageType.FILE
    assert info.config.subjects == [f"{namespace}.jobs.>"]


async def test_publish_with_same_msg_id_is_stored_once(nats_client: NatsClient, namespace: str) -> None:
    name = await _file_stream(nats_client, namespace)
    js = nats_client.jetstream()
    headers = {"Nats-Msg-Id": "job-1.submitted"}
    first = await js.publish(f"{namespace}.jobs.submitted", b"job-1", headers=headers)
    second = await js.publish(f"{namespace}.jobs.submitted", b"job-1", headers=headers)
    other = await js.publish(f"{namespace}.jobs.submitted", b"job-2", headers={"Nats-Msg-Id": "job-2.submitted"})
    assert not first.duplicate
    assert second.duplicate and second.seq == first.seq
    assert other.seq == first.seq + 1
    assert (await nats_client.jsm().stream_info(name)).state.messages == 2


async def test_durable_pull_consumer_fetches_and_acks(nats_client: NatsClient, namespace: str) -> None:
    name = await _file_stream(nats_client, namespace)
    js = nats_client.jetstream()
    for i in range(3):
        await js.publish(f"{namespace}.jobs.submitted", f"job-{i}".encode())
    sub = await js.pull_subscribe(f"{namespace}.jobs.>", durable="placement", stream=name)
    msgs = await sub.fetch(3, timeout=5)
    assert [m.data for m in msgs] == [b"job-0", b"job-1", b"job-2"]
    for m in msgs:
        await m.ack_sync()  # waits for the server's confirmation, so the consumer state below is settled
    info = await nats_client.jsm().consumer_info(name, "placement")
    assert (info.num_pending, info.num_ack_pending) == (0, 0)
    await sub.unsubscribe()

    # The durable outlives its subscription: rebinding resumes after the acked messages.
    await js.publish(f"{namespace}.jobs.submitted", b"job-3")
    again = await js.pull_subscribe(f"{namespace}.jobs.>", durable="placement", stream=name)
    assert [m.data for m in await again.fetch(1, timeout=5)] == [b"job-3"]


async def test_unacked_message_is_redelivered_after_ack_wait(nats_client: NatsClient, namespace: str) -> None:
    name = await _file_stream(nats_client, namespace)
    js = nats_client.jetstream()
    await js.publish(f"{namespace}.jobs.submitted", b"job-1")
    config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=0.5)
    sub = await js.pull_subscribe(f"{namespace}.jobs.>", durable="flaky", stream=name, config=config)
    (first,) = await sub.fetch(1, timeout=5)
    assert first.metadata.num_delivered == 1  # not acked: the worker "crashed"
    (second,) = await sub.fetch(1, timeout=5)  # waits past ack_wait for the redelivery
    assert second.data == b"job-1"
    assert second.metadata.num_delivered == 2
    assert second.metadata.sequence.stream == first.metadata.sequence.stream
    await second.ack_sync()


# -- Redis / Valkey --------------------------------------------------------------------------------------


async def test_set_and_get(redis_client: aioredis.Redis, namespace: str) -> None:
    assert await redis_client.set(f"{namespace}:hello", "world")
    assert await redis_client.get(f"{namespace}:hello") == "world"
    assert await redis_client.get(f"{namespace}:missing") is None


# Claim every node for a job only if every node is still free; all or nothing, atomically (the commit
# check placement relies on). KEYS: the node keys; ARGV[1]: the job id. Returns the number of nodes taken,
# or -i for the first (1-based) node that was already taken.
_CLAIM_NODES = """
for i, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if owner and owner ~= ARGV[1] then return -i end
end
for _, key in ipairs(KEYS) do redis.call('SET', key, ARGV[1]) end
return #KEYS
"""


async def test_lua_check_and_set_is_all_or_nothing(redis_client: aioredis.Redis, namespace: str) -> None:
    # The {c0} hash tag puts all of a cell's keys in one cluster slot, so one script may touch them all.
    nodes = [f"{namespace}:{{c0}}:node:{n}" for n in ("n1", "n2", "n3")]
    assert len({key_slot(k.encode()) for k in nodes}) == 1
    claim = redis_client.register_script(_CLAIM_NODES)

    assert await claim(keys=nodes[:2], args=["job-a"]) == 2
    # job-b wants n2 (taken) and n3 (free): refused, and n3 stays untouched.
    assert await claim(keys=[nodes[2], nodes[1]], args=["job-b"]) == -2
    assert await redis_client.mget(nodes) == ["job-a", "job-a", None]
    # Re-claiming what the job already holds is idempotent (a retried commit).
    assert await claim(keys=nodes, args=["job-a"]) == 3
    assert await redis_client.mget(nodes) == ["job-a"] * 3


# -- embedded servers (own instances, so these run in every setup) -----------------------------------------


async def test_jetstream_message_survives_kill_and_restart(namespace: str) -> None:
    with EmbeddedNats(monitor_port=0) as server:
        # The option name is version-sensitive: prove the server took `sync_interval: always`.
        async with aiohttp.ClientSession() as http, http.get(f"{server.monitor_url}/varz") as resp:
            varz = await resp.json()
        assert varz["jetstream"]["config"]["sync_always"] is True

        nc = await nats.connect(server.url, max_reconnect_attempts=0)
        name = await _file_stream(nc, namespace)
        ack = await nc.jetstream().publish(f"{namespace}.jobs.submitted", b"job-1", headers={"Nats-Msg-Id": "j1"})
        await nc.close()

        port, pid = server.port, server.pid
        server.kill()  # SIGKILL: no shutdown, no final flush
        assert not server.running
        server.restart()
        assert (server.port, server.running) == (port, True) and server.pid != pid

        nc = await nats.connect(server.url, max_reconnect_attempts=0)
        try:
            info = await nc.jsm().stream_info(name)
            assert info.state.messages == 1
            stored = await nc.jsm().get_msg(name, ack.seq)
            assert stored.data == b"job-1"
            # The dedup window survived too: the same id is still recognised after the crash.
            again = await nc.jetstream().publish(f"{namespace}.jobs.submitted", b"job-1", headers={"Nats-Msg-Id": "j1"})
            assert again.duplicate
        finally:
            await nc.close()
            await delete_nats_namespace(server.url, namespace)
    assert not server.running


async def test_embedded_valkey_restarts_on_same_port_empty() -> None:
    with EmbeddedValkey() as server:
        client = aioredis.from_url(server.url, decode_responses=True)
        await client.set("k", "v")
        await client.aclose()
        port = server.port
        server.restart()
        assert server.port == port
        # No persistence by design: a restart starts empty.
        client = aioredis.from_url(server.url, decode_responses=True)
        try:
            assert await client.get("k") is None
        finally:
            await client.aclose()


async def test_a_valkey_cluster_splits_the_slots_among_its_primaries_and_takes_a_restarted_one_back() -> None:
    with ValkeyCluster() as cluster:
        client = make_redis_client(cluster.url, decode_responses=True)
        try:
            await client.set("k:{c0}", "v")  # the client reads the slot map from the nodes the URL lists
            shards = await client.cluster_shards(target_nodes=RedisCluster.RANDOM)
            ranges = sorted(tuple(r) for shard in shards for r in shard["slots"])
            assert ranges == [(0, 5460), (5461, 10921), (10922, 16383)]
            ports = {n["port"] for shard in shards for n in shard["nodes"]}
            assert ports == {n.port for n in cluster.nodes}
            assert all(n["role"] == "master" for shard in shards for n in shard["nodes"])

            owner = client.get_node_from_key("k:{c0}")
            node = next(n for n in cluster.nodes if n.port == owner.port)
            node.kill()
            node.restart()  # its nodes.conf kept: the same node, with its slots, on the same ports (empty)
            assert await wait_for(lambda: client.set("k:{c0}", "again"), "the restarted node back in the cluster")
            assert client.get_node_from_key("k:{c0}").port == node.port
        finally:
            await client.aclose()


@pytest.mark.parametrize("server_cls", [EmbeddedNats, EmbeddedValkey])
async def test_embedded_start_on_taken_port_fails_with_log(server_cls: type[EmbeddedNats | EmbeddedValkey]) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        server = server_cls(port=blocker.getsockname()[1], start_timeout=5)
        try:
            with pytest.raises(ServerStartError, match=r"(?i)address already in use"):
                await asyncio.to_thread(server.start)
        finally:
            server.stop()
