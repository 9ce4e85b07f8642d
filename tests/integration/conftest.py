"""Real NATS (JetStream) and Redis for integration tests.

With RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL set, tests use those servers (compose, CI services, a dev
machine); otherwise one embedded nats-server and one valkey-server are started for the whole session. Tests
that also run on a Redis Cluster ask for `redis_cluster_url`: three embedded Valkey primaries.
A shared server may hold other data, so every test works under its own `namespace` prefix: stream names,
subjects and Redis keys start with it, and the client fixtures delete what is under it at teardown.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import nats
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient

from shared.embedded import EmbeddedNats, EmbeddedValkey
from shared.names import Names
from shared.redis_client import redis_client as make_redis_client
from shared.runtime import Deps
from shared.schemas import NodeRecord
from shared.settings import Settings
from shared.store import Store, ViewMark
from tests.servers import ValkeyCluster

_JS_API = "$JS.API"


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """URL of a JetStream-enabled NATS server: RACKSCALE_NATS_URL, else an embedded one for the session."""
    configured = Settings.from_env().nats_url
    if configured:
        yield configured
        return
    with EmbeddedNats() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis-protocol server: RACKSCALE_REDIS_URL, else an embedded Valkey for the session."""
    configured = Settings.from_env().redis_url
    if configured:
        yield configured
        return
    with EmbeddedValkey() as server:
        yield server.url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """URL (`redis+cluster://`) of a Valkey Cluster of three primaries on loopback, started for the session when a
    test first asks for it (whatever RACKSCALE_REDIS_URL names: the cluster runs are in addition to it)."""
    with ValkeyCluster() as cluster:
        yield cluster.url


@pytest.fixture
def namespace() -> str:
    """Unique per test, e.g. `t1a2b3c4d`: valid in stream names, subjects and keys (no dots or wildcards)."""
    return f"t{uuid.uuid4().hex[:8]}"


@pytest_asyncio.fixture
async def redis_client(redis_url: str, namespace: str) -> AsyncIterator[aioredis.Redis]:
    """redis.asyncio client (str responses); keys starting with `namespace` are deleted at teardown."""
    client = make_redis_client(redis_url, decode_responses=True)  # RACKSCALE_REDIS_URL may name a Sentinel set
    try:
        yield client
    finally:
        await client.aclose()
        await delete_redis_namespace(redis_url, namespace)


@pytest_asyncio.fixture
async def nats_client(nats_url: str, namespace: str) -> AsyncIterator[NatsClient]:
    """nats-py connection; streams named `namespace…` (and KV/object buckets of that name) go at teardown."""
    nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=2)
    try:
        yield nc
    finally:
        await nc.close()
        await delete_nats_namespace(nats_url, namespace)


@contextlib.asynccontextmanager
async def namespace_deps(
    settings: Settings, nats_url: str, redis_url: str, clock: Callable[[], float] = time.time
) -> AsyncIterator[Deps]:
    """A queue's dependencies under `settings.prefix`; its Redis keys and its streams go after (a shared NATS keeps
    every stream it is given: a LOGS stream reserves its `max_bytes` of the server's JetStream storage, and the
    reservations of a run's leftovers exhausted it)."""
    names = Names(prefix=settings.prefix)
    deps = await Deps.connect(settings, "queue", nats_url, redis_url, names, clock=clock)
    try:
        yield deps
    finally:
        await deps.close()
        await delete_redis_namespace(redis_url, settings.prefix)
        await delete_nats_namespace(nats_url, settings.prefix)


@contextlib.asynccontextmanager
async def service_deps(
    nats_url: str, redis_url: str, namespace: str, nodes: Mapping[str, str], clock: Callable[[], float]
) -> AsyncIterator[Deps]:
    """A service's dependencies under `namespace` (`namespace_deps`), with `nodes` (name -> domain) registered."""
    async with namespace_deps(Settings(prefix=namespace), nats_url, redis_url, clock) as deps:
        await deps.store.open_view(ViewMark(), time.time())  # a fresh view of an empty log (the queue opens it)
        for node, domain in nodes.items():
            await deps.store.put_node(NodeRecord(name=node, domain=domain))
        yield deps


async def open_store(redis_url: str, namespace: str) -> Store:
    """A store under `namespace` with its view open and one node, d00-n00 (the caller closes it)."""
    store = Store.from_url(redis_url, Names(prefix=namespace))
    await store.open_view(ViewMark(), time.time())
    await store.put_node(NodeRecord(name="d00-n00", domain="d00"))
    return store


async def delete_redis_namespace(url: str, namespace: str) -> int:
    """Delete every key starting with `namespace`; returns how many. Own connection: the test may have closed its."""
    client = make_redis_client(url)
    try:
        deleted = 0
        # SCAN, not KEYS: a shared server may be large and KEYS blocks it.
        async for key in client.scan_iter(match=f"{namespace}*", count=500):
            deleted += await client.unlink(key)
        return deleted
    finally:
        await client.aclose()


async def delete_nats_namespace(url: str, namespace: str) -> list[str]:
    """Delete streams whose name starts with `namespace` (or KV_/OBJ_ + it), in any case; returns their names."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    try:
        # Case-blind: shared.names upper-cases the prefix in stream names (`T1A2B3C4D_JOBS`).
        ns = namespace.upper()
        prefixes = (ns, f"KV_{ns}", f"OBJ_{ns}")
        doomed = [name for name in await _stream_names(nc) if name.upper().startswith(prefixes)]
        jsm = nc.jsm()
        for name in doomed:
            await jsm.delete_stream(name)
        return doomed
    finally:
        await nc.close()


async def _stream_names(nc: NatsClient) -> list[str]:
    # The names API pages its answer; walk every page.
    names: list[str] = []
    while True:
        msg = await nc.request(f"{_JS_API}.STREAM.NAMES", json.dumps({"offset": len(names)}).encode(), timeout=5)
        reply = json.loads(msg.data)
        if "error" in reply:
            raise RuntimeError(f"listing streams failed: {reply['error']}")
        page = reply.get("streams") or []
        names += page
        if not page or len(names) >= reply.get("total", 0):
            return names
