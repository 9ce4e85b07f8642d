"""Redis clients for the services: the one URL form of `RACKSCALE_REDIS_URL`, reconnection and retry.

The URL is one of

- `redis://[[user]:password@]host[:port][/db][?option=value&...]`, `rediss://...` (TLS) or
  `unix:///path/to/socket?db=N`: one server, read by redis-py (`redis.asyncio.from_url`);
- `redis+sentinel://[[user]:password@]host[:port],host[:port],.../service[/db][?option=value&...]`: a Sentinel
  set (port 26379 unless given) watching the primary named `service`. Each new connection asks the Sentinels
  where the primary is, so the client follows a failover; a primary demoted to a replica (READONLY) counts
  as a broken connection. The user and password are the data nodes' (primary and replicas); the options
  `sentinel_username` / `sentinel_password` give the Sentinels' own where they require auth;
- `redis+cluster://[[user]:password@]host[:port],host[:port],...[/0][?option=value&...]`: a Redis Cluster (port
  6379 unless given), read by redis-py's `RedisCluster`. The nodes listed are where the client starts: it asks
  them for the slot map and then talks to every primary itself, following MOVED/ASK redirects and a failover
  (CLUSTERDOWN is retried too). A cluster has db 0 only. Every key of a cell shares the hash tag `{cell}`
  (`shared.names`), so the cell lives in one slot: its scripts, MULTI/EXEC pipelines and multi-key commands
  stay on one node, as on one server.

Options for every form: `socket_timeout` (s, default `SOCKET_TIMEOUT_S`: a read that hangs on a dead host
ends), `socket_connect_timeout` (s, default `CONNECT_TIMEOUT_S`) and `max_connections` (a client's pool, per
server; default `MAX_CONNECTIONS`). `parse_redis_url` is the one parser (`shared.settings` validates with it);
`redis_client` builds the client.

A service sends many commands at once (a cycle's writes, an array's records, handlers side by side, each burst
bounded by its own group size). A full redis-py pool doesn't wait for a connection: the next command raises
`MaxConnectionsError`. redis-py 8.2 pools default to 100 connections (earlier releases to 2**31), and a burst on
the running system went past 100 and failed handlers and cycles. The pool is set here, well above any process's
commands in flight, so the bound is ours whichever release is installed.

Every client retries a command that failed on a broken connection or a timeout (a pooled connection the server
closed: a restart, `CLIENT KILL`, a failover, a server still loading its data) on a fresh connection: up to
`RETRIES` times with jittered exponential backoff from `BACKOFF_BASE_S` (at most `BACKOFF_CAP_S` between
tries), well under 1.5 s in all before the error surfaces. Without it, redis-py's `from_url` clients don't retry
at all, and every connection in a pool broken by a restart fails one command in its turn: a gateway with a
large idle pool answered 503 for 20+ s after Redis was back. No `health_check_interval`: the retry covers a
connection that broke while idle without a PING before every command. A cluster client retries at its own
level instead (redis-py gives its connections no retry of their own): the same errors plus CLUSTERDOWN, with
the same backoff and count, and a fresh slot map when a node fails.

After such an error the client can't tell whether the command ran, so the retry is only safe for commands
that may run twice: every command `shared.store.Store` sends is (its "Retry safety" note says why, family by
family). Code that sends other commands through these clients must check the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import (
    ClusterDownError,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["RedisClient", "RedisTarget", "parse_redis_url", "redis_client", "retry_policy"]

SCHEMES = ("redis", "rediss", "unix")
SENTINEL_SCHEME = "redis+sentinel"
SENTINEL_PORT = 26379
CLUSTER_SCHEME = "redis+cluster"
CLUSTER_PORT = 6379
RETRIES = 3  # tries after the first; connecting retries on its own too (redis-py), both with this backoff
BACKOFF_BASE_S = 0.02
BACKOFF_CAP_S = 0.25
CONNECT_TIMEOUT_S = 2.0
SOCKET_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024  # per client and server: past any process's commands in flight (see the module's doc)
_TIMEOUTS = ("socket_timeout", "socket_connect_timeout")
_COUNTS = ("max_connections",)
_CLUSTER_OPTIONS = (*_TIMEOUTS, *_COUNTS)
_SENTINEL_OPTIONS = (*_CLUSTER_OPTIONS, "sentinel_username", "sentinel_password")
_FORMS = f"{'|'.join(SCHEMES)}|{SENTINEL_SCHEME}|{CLUSTER_SCHEME}"

# What `redis_client` returns: one server's (or a Sentinel set's primary's) client, or a cluster's. Both take
# the same commands for keys of one slot, which is all `shared.store.Store` sends.
RedisClient = aioredis.Redis | RedisCluster

# Redis is away (a restart, a failover, a cluster without a primary for a slot) rather than wrong: callers wait it out
# (inventory drops periodic reports, the gateway answers 503) instead of treating it as a bug.
UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    RedisClusterUnreachableError,
    SlotNotCoveredError,
)


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where a Redis URL points: one server (`sentinels` and `nodes` empty; redis-py reads `url`), a Sentinel
    set, or a cluster (`nodes`: where the client starts)."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    nodes: tuple[tuple[str, int], ...] = ()

    @property
    def sentinel(self) -> bool:
        return bool(self.sentinels)

    @property
    def cluster(self) -> bool:
        return bool(self.nodes)


def parse_redis_url(url: str) -> RedisTarget:
    """The target of a Redis URL (forms above); ValueError saying what is wrong, without the URL (it may hold a
    password)."""
    parts = urlsplit(url.strip())
    if parts.scheme in SCHEMES:
        if not (parts.netloc or parts.path):
            raise ValueError(f"is not a {_FORMS} URL")
        # redis-py reads the options; ours are checked here as in the other forms (it would take a pool of 0 as 100)
        _numbers(_query(parts.query))
        return RedisTarget(url=url.strip())
    if parts.scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
        raise ValueError(f"is not a {_FORMS} URL")
    sentinel = parts.scheme == SENTINEL_SCHEME
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, password = None, None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) if colon else None
    what, default_port = ("Sentinel", SENTINEL_PORT) if sentinel else ("cluster node", CLUSTER_PORT)
    addresses = tuple(_host_port(h, what, default_port) for h in hosts.split(",") if h.strip())
    path = [p for p in parts.path.split("/") if p]
    if not sentinel:
        if not addresses:
            raise ValueError(f"names no cluster node ({CLUSTER_SCHEME}://host:port,host:port)")
        if path not in ([], ["0"]):
            raise ValueError(f"names a path, but a cluster has db 0 only: {CLUSTER_SCHEME}://hosts[/0]")
        options = _options(parts.query, _CLUSTER_OPTIONS)
        return RedisTarget(url.strip(), username=username, password=password, options=options, nodes=addresses)
    if not addresses:
        raise ValueError(f"names no Sentinel ({SENTINEL_SCHEME}://host:port,host:port/service/db)")
    if not path or len(path) > 2:
        raise ValueError(f"must name the service and optionally the db: {SENTINEL_SCHEME}://hosts/service[/db]")
    service, db = unquote(path[0]), 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"db {path[1]!r} is not an integer >= 0")
        db = int(path[1])
    options = _options(parts.query, _SENTINEL_OPTIONS)
    return RedisTarget(url.strip(), addresses, service, db, username, password, options)


def _query(query: str) -> dict[str, str]:
    """The URL's options, each its last value."""
    return {key: values[-1] for key, values in parse_qs(query, keep_blank_values=True).items()}


def _options(query: str, known: tuple[str, ...]) -> dict[str, str]:
    options = _query(query)
    for key in options:
        if key not in known:
            raise ValueError(f"has an unknown option {key!r} (known: {', '.join(known)})")
    _numbers(options)  # refused here, with the URL
    return options


def _numbers(options: Mapping[str, str]) -> dict[str, float | int]:
    """The options that are numbers, as numbers (a timeout in seconds, a count); ValueError naming a bad one."""
    out: dict[str, float | int] = {key: _seconds(key, options[key]) for key in _TIMEOUTS if key in options}
    out.update({key: _count(key, options[key]) for key in _COUNTS if key in options})
    return out


def _host_port(raw: str, what: str, default_port: int) -> tuple[str, int]:
    raw = raw.strip()
    if raw.startswith("["):  # [IPv6]:port
        host, _, rest = raw[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = raw.partition(":")
    if not host:
        raise ValueError(f"{what} {raw!r} has no host")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} {raw!r} has no valid port")
    return host, int(port)


def _seconds(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"option {key} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"option {key} must be > 0")
    return value


def _count(key: str, raw: str) -> int:
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"option {key} must be a whole number >= 1")
    return int(raw)


def retry_policy() -> Retry:
    """What every client retries: broken connections and timeouts (redis-py's default errors), on a fresh
    connection, `RETRIES` times with jittered exponential backoff."""
    return Retry(ExponentialWithJitterBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), RETRIES)


class SentinelRedis(aioredis.Redis):
    """A client of the primary a Sentinel set names; closing it closes the connections to the Sentinels too."""

    sentinel: Sentinel | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        if self.sentinel is not None:
            for s in self.sentinel.sentinels:
                await s.aclose()


def redis_client(url: str, **kwargs: Any) -> RedisClient:
    """A client for `url` (see the module's doc) with reconnection and retry; `kwargs` go to redis-py (say,
    `decode_responses`). Connects lazily: nothing happens on the network until the first command."""
    target = parse_redis_url(url)
    common: dict[str, Any] = {
        "retry": retry_policy(),
        "socket_connect_timeout": CONNECT_TIMEOUT_S,
        "socket_timeout": SOCKET_TIMEOUT_S,
        "max_connections": MAX_CONNECTIONS,
        **kwargs,
    }
    if not (target.sentinel or target.cluster):
        return aioredis.from_url(target.url, **common)  # options in the URL win over these defaults
    opts = target.options
    common.update(_numbers(opts))
    auth = {k: v for k, v in (("username", target.username), ("password", target.password)) if v is not None}
    if target.cluster:
        # `retry` is the cluster client's own: it retries a command or pipeline whole, after a fresh slot map
        nodes = [ClusterNode(host, port) for host, port in target.nodes]
        return RedisCluster(startup_nodes=nodes, **auth, **common)
    # the Sentinels: one try each (discovery moves on to the next one), same timeouts
    sentinel_kwargs: dict[str, Any] = {key: common[key] for key in _TIMEOUTS}
    sentinel_kwargs["retry"] = Retry(NoBackoff(), 0)
    if "sentinel_username" in opts:
        sentinel_kwargs["username"] = opts["sentinel_username"]
    if "sentinel_password" in opts:
        sentinel_kwargs["password"] = opts["sentinel_password"]
    sentinel = Sentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs, db=target.db, **auth, **common)
    client = sentinel.master_for(target.service, redis_class=SentinelRedis)
    client.sentinel = sentinel
    return client
