"""The Redis URL forms (`shared.redis_client.parse_redis_url`) and the clients built from them, without a server:
the clients connect lazily, so building one touches no network."""

from __future__ import annotations

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool

from shared.names import Names
from shared.redis_client import (
    CONNECT_TIMEOUT_S,
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


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("nats://127.0.0.1:4222", "is not a redis|rediss|unix|redis+sentinel URL"),
        ("redis:", "is not a redis|rediss|unix|redis+sentinel URL"),
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
    finally:
        await client.aclose()
    client = redis_client("redis://127.0.0.1:1/0?socket_timeout=0.5")  # the URL's options win
    try:
        assert _connection_kwargs(client)["socket_timeout"] == 0.5
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
