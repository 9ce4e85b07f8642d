"""The store's Redis client survives broken connections, server restarts and Sentinel failovers.

- `CLIENT KILL` of the store's pooled connections: the next calls succeed, no error surfaces.
- Hundreds of commands in flight at once on one client: each gets a connection (no "too many connections").
- A reply lost after the server ran the command (the connection broke on the way back): the retry runs the
  command again, and every store operation still ends as if the reply had come (shared/store.py, "Retry safety").
- valkey-server SIGKILLed and restarted on its port: the same store works right after, with no new Store.
- A primary + replica + 3 Sentinels on loopback, the primary SIGKILLed: the store follows the failover.

Tests that kill a server start their own, whatever RACKSCALE_REDIS_URL says; the others use the suite's server.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import redis.exceptions
from redis.asyncio.connection import Connection

from shared.embedded import EmbeddedValkey
from shared.names import Names
from shared.redis_client import redis_client
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, NodeGpus, NodeRecord
from shared.store import Store, ViewMark
from tests.servers import SentinelSet, wait_for

pytestmark = pytest.mark.asyncio

NODE = "d00-n00"


def _store(url: str, names: Names, client_name: str = "") -> Store:
    extra = {"client_name": client_name} if client_name else {}
    return Store(redis_client(url, decode_responses=False, **extra), names)


def _job(job_id: str, t: float = 1.0) -> JobRecord:
    return JobRecord(id=job_id, spec=JobBody(name="j", tenant="a", gpus=4), submitted_at=t, updated_at=t)


def _alloc(job_id: str, attempt: int, gpus: list[int]) -> AllocationRecord:
    return AllocationRecord(job_id=job_id, attempt=attempt, nodes=[NodeGpus(NODE, gpus)], committed_at=0.0)


def _running(rec: JobRecord) -> JobRecord | None:
    if rec.state is not JobState.PENDING:
        return None  # a transition applied twice changes nothing the second time
    return JobRecord(**{**{f: getattr(rec, f) for f in rec.__struct_fields__}, "state": JobState.RUNNING})


async def _every_kind_of_call(store: Store, tag: str) -> None:
    """One of each command family the services send, checked: reads, writes, pipelines, each script."""
    await store.open_view(ViewMark(), time.time())
    await store.record_view(ViewMark(1, 1))
    await store.put_node(NodeRecord(name=NODE, domain="d00"))
    assert (node := await store.get_node(NODE)) is not None and node.state == "up"
    await store.touch_nodes({NODE: 5.0})
    assert await store.silent_nodes(10.0) == [NODE]
    rec, created = await store.create_job(_job(f"{tag}-job"))
    assert created and rec.state is JobState.PENDING
    rec2, changed = await store.update_job(f"{tag}-job", _running)
    assert changed and rec2 is not None and rec2.state is JobState.RUNNING
    assert (got := await store.get_job(f"{tag}-job")) is not None and got.state is JobState.RUNNING
    assert (await store.commit(_alloc(f"{tag}-job", 1, [0, 1]))).ok
    assert [a.job_id for a in await store.allocations()] == [f"{tag}-job"]
    await store.release(f"{tag}-job")
    assert await store.gpu_owners(NODE) == {} and await store.allocation(f"{tag}-job") is None
    assert await store.hold_lease(store.names.queue_leader_key, "me", 5.0)  # taken, then renewed


async def _wipe(store: Store) -> None:
    keys = [k async for k in store.r.scan_iter(store.names.key_pattern)]
    if keys:
        await store.r.delete(*keys)


# -- CLIENT KILL ---------------------------------------------------------------------------------------------


async def _kill_clients(admin: aioredis.Redis, name: str) -> int:
    """CLIENT KILL every connection named `name` (the store's alone, also on a shared server); how many."""
    killed = 0
    for line in str(await admin.execute_command("CLIENT", "LIST", "TYPE", "normal")).splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("name") == name:
            killed += int(await admin.execute_command("CLIENT", "KILL", "ID", fields["id"]))
    return killed


async def test_a_burst_of_commands_in_flight_each_finds_a_connection(redis_url: str, namespace: str) -> None:
    # A full redis-py pool fails the next command instead of waiting (redis-py 8.2's default pool holds 100): a
    # service's burst (a cycle's writes beside an array's records beside the handlers) must never meet that.
    store = _store(redis_url, Names(prefix=namespace))
    try:
        keys = [f"{namespace}:empty:{i}" for i in range(300)]
        # each BLPOP holds its connection until its timeout: all 300 are in flight at once
        assert await asyncio.gather(*(store.r.blpop([k], timeout=0.2) for k in keys)) == [None] * 300
    finally:
        await store.close()


async def test_killed_connections_are_replaced_without_an_error(
    redis_url: str, namespace: str, redis_client: aioredis.Redis
) -> None:
    name = f"{namespace}-store"
    store = _store(redis_url, Names(prefix=namespace), client_name=name)
    try:
        await asyncio.gather(*(store.get_node(NODE) for _ in range(16)))  # a pool of several connections
        for i in range(6):
            assert await _kill_clients(redis_client, name) >= 1
            await _every_kind_of_call(store, f"seq{i}")  # raises on any error
        await asyncio.gather(*(store.get_node(NODE) for _ in range(16)))  # the pool's connections all open
        assert await _kill_clients(redis_client, name) >= 2
        # every pooled connection is broken: concurrent calls each meet one, none fails
        nodes = await asyncio.gather(*(store.get_node(NODE) for _ in range(32)))
        assert all(n is not None for n in nodes)
    finally:
        await _wipe(store)
        await store.close()


# -- a reply lost after the command ran -----------------------------------------------------------------------


@contextlib.contextmanager
def losing_replies(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """`lose(skip)`: the reply read after `skip` more replies is read from the server and then lost, as if the
    connection broke on its way back: the command ran, the client sees a ConnectionError (and retries)."""
    state = {"armed": False, "skip": 0, "lost": 0}
    original = Connection.read_response

    async def read_response(self: Connection, *args: Any, **kwargs: Any) -> Any:
        response = await original(self, *args, **kwargs)
        if state["armed"]:
            if state["skip"] > 0:
                state["skip"] -= 1
            else:
                state["armed"], state["lost"] = False, state["lost"] + 1
                await self.disconnect()
                raise redis.exceptions.ConnectionError("reply lost on the way back (test)")
        return response

    def lose(skip: int = 0) -> None:
        state.update(armed=True, skip=skip)

    monkeypatch.setattr(Connection, "read_response", read_response)
    yield lose
    assert not state["armed"], "a planted loss never happened"


async def test_a_reply_lost_after_the_write_ran_is_retried_to_the_same_outcome(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(redis_url, Names(prefix=namespace))
    await store.open_view(ViewMark(), time.time())
    try:
        with losing_replies(monkeypatch) as lose:
            await store.put_node(NodeRecord(name=NODE, domain="d00"))
            gen = await store.topology_generation()
            lose(6)  # MULTI, 5 × QUEUED, then the EXEC's reply is lost: the transaction ran and runs again
            await store.put_node(NodeRecord(name=NODE, domain="d00", state="draining"))
            assert await store.node_states([NODE]) == ["draining"]
            assert await store.topology_generation() in (gen + 1, gen + 2)  # an extra bump only re-reads caches
            await store.put_node(NodeRecord(name=NODE, domain="d00"))  # up again, for the commits below

            lose()  # JOB_CAS_LUA creating the job: the retry finds its own record and still says "created"
            rec, created = await store.create_job(_job("j"))
            assert created and rec.state is JobState.PENDING

            lose()  # JOB_CAS_LUA updating it: "changed", so the caller's side effects aren't skipped
            rec2, changed = await store.update_job("j", _running)
            assert changed and rec2 is not None and rec2.state is JobState.RUNNING
            assert (stored := await store.get_job("j")) is not None and stored.state is JobState.RUNNING

            lose()  # COMMIT_LUA: the retry finds this attempt held: a duplicate, which placement handles as ok
            result = await store.commit(_alloc("j", 1, [0, 1]))
            assert result.ok
            assert await store.gpu_owners(NODE) == {0: "j", 1: "j"}

            lose()  # RELEASE_LUA: the retry finds nothing held ("released already"); the GPUs are free
            await store.release("j")
            assert await store.gpu_owners(NODE) == {} and await store.allocation("j") is None
            late = await store.commit(_alloc("j", 1, [0, 1]))
            assert not late.ok and late.reason.startswith("stale")  # the floor was kept

            lose()  # LEASE_LUA: the retry finds the lease its own and renews it
            assert await store.hold_lease(store.names.queue_leader_key, "me", 5.0)
            assert not await store.hold_lease(store.names.queue_leader_key, "other", 5.0)
    finally:
        await _wipe(store)
        await store.close()


# -- a restart on the same port --------------------------------------------------------------------------------


async def test_a_valkey_restart_on_the_same_port_needs_no_new_store(namespace: str) -> None:
    with EmbeddedValkey() as server:
        store = _store(server.url, Names(prefix=namespace))
        try:
            await _every_kind_of_call(store, "before")
            await asyncio.gather(*(store.get_node(NODE) for _ in range(16)))  # a pool of broken connections-to-be
            server.kill()
            await asyncio.to_thread(server.restart)  # empty: no persistence
            # right after: every pooled connection is broken, and no call fails for it
            assert await asyncio.gather(*(store.get_node(NODE) for _ in range(32))) == [None] * 32
            for i in range(20):
                await _every_kind_of_call(store, f"after{i}")
        finally:
            await store.close()


# -- Sentinel failover ------------------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def sentinel_set() -> AsyncIterator[SentinelSet]:
    servers = SentinelSet()
    try:
        await asyncio.to_thread(servers.start)
        yield servers
    finally:
        await asyncio.to_thread(servers.stop)


async def test_the_store_follows_a_sentinel_failover(sentinel_set: SentinelSet, namespace: str) -> None:
    s = sentinel_set
    assert s.replica is not None
    replica_port = s.replica.port
    await s.wait_ready()
    store = _store(s.url, Names(prefix=namespace))
    try:
        await _every_kind_of_call(store, "before")
        assert int(await store.r.execute_command("WAIT", 1, 5000)) == 1  # the replica has every write

        await asyncio.to_thread(s.primary_server.kill)

        async def served() -> bool:
            return await store.get_job("before-job") is not None

        await wait_for(served, "the store served by the promoted replica")
        assert await store.r.connection_pool.get_master_address() == (s.replica.host, replica_port)
        assert (kept := await store.get_job("before-job")) is not None and kept.state is JobState.RUNNING
        for i in range(10):  # and it stays served: writes, scripts, reads
            await _every_kind_of_call(store, f"after{i}")
    finally:
        with contextlib.suppress(Exception):
            await _wipe(store)
        await store.close()
