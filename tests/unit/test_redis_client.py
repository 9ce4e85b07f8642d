"""The Redis URL forms (`shared.redis_client.parse_redis_url`) and the clients built from them, without a server:
the clients connect lazily, so building one touches no network."""

from __future__ import annotations

import dataclasses

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.crc import key_slot

from shared.names import Names
from shared.redis_client import (
    CLUSTER_PORT,
    CONNECT_TIMEOUT_S,
    MAX_CONNECTIONS,
    RETRIES,
    SENTINEL_PORT,
    SOCKET_TIMEOUT_S,
    RedisTarget,
    SentinelRedis,
    parse_redis_url,
    redis_client,
)
from shared.store import Store


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:6379/0", "rediss://u:p@cache:6380/1", "unix:///run/redis.sock?db=2", "redis://h"]
)
def test_one_server_urls_are_left_to_redis_py(url: str) -> None:
    assert parse_redis_url(url) == RedisTarget(url=url)


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_db() -> None:
    t = parse_redis_url("redis+sentinel://:s3cret@s1:26380,s2,[::1]:26381/mymaster/3?socket_timeout=1.5")
    assert t.sentinel
    assert t.sentinels == (("s1", 26380), ("s2", SENTINEL_PORT), ("::1", 26381))
    assert (t.service, t.db, t.username, t.password) == ("mymaster", 3, None, "s3cret")
    assert dict(t.options) == {"socket_timeout": "1.5"}
    t = parse_redis_url("redis+sentinel://app:pw%40x@s1/cache?sentinel_password=sp")
    assert (t.service, t.db, t.username, t.password, t.options["sentinel_password"]) == (
        "cache",
        0,
        "app",
        "pw@x",
        "sp",
    )


def test_a_cluster_url_names_the_nodes_to_start_from() -> None:
    t = parse_redis_url("redis+cluster://:s3cret@n1:7000,n2,[::1]:7002?socket_timeout=1.5")
    assert t.cluster and not t.sentinel
    assert t.nodes == (("n1", 7000), ("n2", CLUSTER_PORT), ("::1", 7002))
    assert (t.username, t.password, dict(t.options)) == (None, "s3cret", {"socket_timeout": "1.5"})
    t = parse_redis_url("redis+cluster://app:pw%40x@n1/0")  # db 0 may be named: a cluster has no other
    assert (t.nodes, t.username, t.password) == ((("n1", CLUSTER_PORT),), "app", "pw@x")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+cluster://", "names no cluster node"),
        ("redis+cluster:///0", "names no cluster node"),
        ("redis+cluster://n1/1", "a cluster has db 0 only"),
        ("redis+cluster://n1/mymaster/0", "a cluster has db 0 only"),
        ("redis+cluster://n1:70000", "cluster node 'n1:70000' has no valid port"),
        ("redis+cluster://:7000", "cluster node ':7000' has no host"),
        ("redis+cluster://n1?sentinel_password=x", "unknown option 'sentinel_password'"),
        ("redis+cluster://n1?socket_timeout=-1", "option socket_timeout must be > 0"),
    ],
)
def test_bad_cluster_urls_say_what_is_wrong(url: str, reason: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_redis_url(url)
    assert reason in str(err.value)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("nats://127.0.0.1:4222", "is not a redis|rediss|unix|redis+sentinel|redis+cluster URL"),
        ("redis:", "is not a redis|rediss|unix|redis+sentinel|redis+cluster URL"),
        ("redis+sentinel:///mymaster", "names no Sentinel"),
        ("redis+sentinel://s1:26379", "must name the service"),
        ("redis+sentinel://s1:26379/m/0/x", "must name the service"),
        ("redis+sentinel://s1:26379/m/zero", "db 'zero' is not an integer >= 0"),
        ("redis+sentinel://s1:port/m", "has no valid port"),
        ("redis+sentinel://s1:0/m", "has no valid port"),
        ("redis+sentinel://:26379/m", "has no host"),
        ("redis+sentinel://s1/m?ssl=true", "unknown option 'ssl'"),
        ("redis+sentinel://s1/m?socket_timeout=soon", "option socket_timeout is not a number of seconds"),
        ("redis+sentinel://s1/m?socket_connect_timeout=0", "option socket_connect_timeout must be > 0"),
        ("redis+sentinel://s1/m?max_connections=0", "option max_connections must be a whole number >= 1"),
        ("redis+cluster://n1?max_connections=many", "option max_connections must be a whole number >= 1"),
        ("redis://127.0.0.1:6379/0?max_connections=0", "option max_connections must be a whole number >= 1"),
        ("unix:///tmp/r.sock?db=1&socket_timeout=-1", "option socket_timeout must be > 0"),
    ],
)
def test_bad_urls_say_what_is_wrong_without_repeating_the_url(url: str, reason: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_redis_url(url)
    assert reason in str(err.value)


def _connection_kwargs(client: object) -> dict[str, object]:
    return client.connection_pool.connection_kwargs  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_a_one_server_client_retries_and_times_out() -> None:
    client = redis_client("redis://127.0.0.1:1/0")
    try:
        kw = _connection_kwargs(client)
        assert kw["retry"].get_retries() == RETRIES
        assert (kw["socket_timeout"], kw["socket_connect_timeout"]) == (SOCKET_TIMEOUT_S, CONNECT_TIMEOUT_S)
        assert client.connection_pool.max_connections == MAX_CONNECTIONS  # not the library's default
    finally:
        await client.aclose()
    client = redis_client("redis://127.0.0.1:1/0?socket_timeout=0.5&max_connections=7")  # the URL's options win
    try:
        assert _connection_kwargs(client)["socket_timeout"] == 0.5
        assert client.connection_pool.max_connections == 7
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_a_sentinel_client_asks_the_sentinels_for_the_primary() -> None:
    client = redis_client("redis+sentinel://:pw@s1:26380,s2/cache/2?socket_timeout=1&sentinel_password=sp")
    try:
        assert isinstance(client, SentinelRedis) and client.sentinel is not None
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "cache" and pool.is_master
        kw = _connection_kwargs(client)
        assert (kw["db"], kw["password"], kw["socket_timeout"]) == (2, "pw", 1.0)
        assert pool.max_connections == MAX_CONNECTIONS
        assert kw["retry"].get_retries() == RETRIES
        hosts = [_connection_kwargs(s) for s in client.sentinel.sentinels]
        assert [(h["host"], h["port"]) for h in hosts] == [("s1", 26380), ("s2", SENTINEL_PORT)]
        assert all(h["password"] == "sp" and h["retry"].get_retries() == 0 for h in hosts)  # next Sentinel at once
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_the_store_is_built_on_such_a_client() -> None:
    store = Store.from_url("redis+sentinel://s1/cache", Names(prefix="t"))
    try:
        assert isinstance(store.r, SentinelRedis)
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_cluster_client_starts_from_the_nodes_and_retries_at_its_own_level() -> None:
    client = redis_client("redis+cluster://:pw@n1:7000,n2?socket_connect_timeout=0.5&max_connections=300")
    try:
        assert isinstance(client, RedisCluster)
        assert client.retry.get_retries() == RETRIES  # redis-py gives the nodes' connections none of their own
        nodes = client.nodes_manager.startup_nodes.values()
        assert sorted((n.host, n.port) for n in nodes) == [("n1", 7000), ("n2", CLUSTER_PORT)]
        kw = [n.connection_kwargs for n in nodes]
        assert all(k["password"] == "pw" for k in kw)
        assert all((k["socket_timeout"], k["socket_connect_timeout"]) == (SOCKET_TIMEOUT_S, 0.5) for k in kw)
        assert [n.max_connections for n in nodes] == [300, 300]  # each node's pool
    finally:
        await client.aclose()
    store = Store.from_url("redis+cluster://n1", Names(prefix="t"))
    try:
        assert isinstance(store.r, RedisCluster)
    finally:
        await store.close()


def _redis_keys(names: Names) -> dict[str, str]:
    """Every Redis key `Names` makes: its `*_key` properties, its `*_key(...)` methods (with an awkward argument)
    and the cell's pattern."""
    keys: dict[str, str] = {}
    for attr in dir(Names):
        if (attr.endswith("_key") and not attr.startswith("_")) or attr == "key_pattern":
            value = getattr(names, attr)
            keys[attr] = value if isinstance(value, str) else value("n{1}:x")
    return keys


@pytest.mark.parametrize("cell", ["c0", "C", "rack-07_b", "x" * 64])
def test_every_key_of_a_cell_hashes_to_one_cluster_slot(cell: str) -> None:
    # one slot: the commit and job scripts, and the MULTI/EXEC pipelines, may touch any of a cell's keys together
    names = Names(prefix="rackscale", cell=cell)
    keys = _redis_keys(names)
    assert len(keys) >= 20 and {"job_key", "alloc_key", "gpus_key", "view_key", "key_pattern"} <= set(keys)
    slots = {name: key_slot(key.encode()) for name, key in keys.items()}
    assert set(slots.values()) == {key_slot(cell.encode())}, slots
    # the prefix doesn't move a cell: two deployments' same cell land on one slot, so one script reaches either
    other = dataclasses.replace(names, prefix="t1a2b3c4d")
    assert {key_slot(k.encode()) for k in _redis_keys(other).values()} == {key_slot(cell.encode())}
