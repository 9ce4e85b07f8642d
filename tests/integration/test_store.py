"""The commit and release scripts against a real Redis/Valkey."""

from __future__ import annotations

import pytest

from shared.names import Names
from shared.schemas import AllocationRecord, NodeGpus, NodeRecord
from shared.store import Store

pytestmark = pytest.mark.asyncio


async def _store(redis_url: str, namespace: str) -> Store:
    store = Store.from_url(redis_url, Names(prefix=namespace))
    await store.put_node(NodeRecord(name="d00-n00", domain="d00"))
    return store


def _rec(job: str, attempt: int, gpus: list[int]) -> AllocationRecord:
    return AllocationRecord(job_id=job, attempt=attempt, nodes=[NodeGpus("d00-n00", gpus)], committed_at=0.0)


async def test_a_released_attempt_never_commits_again(redis_url: str, namespace: str) -> None:
    store = await _store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("j", 1, [0, 1]))).ok
        assert (await store.commit(_rec("j", 1, [0, 1]))).duplicate  # a redelivered order is a no-op
        assert await store.release("j")
        assert not await store.release("j")  # idempotent
        late = await store.commit(_rec("j", 1, [2, 3]))  # the same order redelivered after the job ended
        assert not late.ok and late.reason.startswith("stale"), late
        assert await store.gpu_owners("d00-n00") == {}
        assert (await store.commit(_rec("j", 2, [2, 3]))).ok  # a requeued job's next attempt still can
        assert await store.gpu_owners("d00-n00") == {2: "j", 3: "j"}
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_commit_refuses_taken_gpus_and_unusable_nodes(redis_url: str, namespace: str) -> None:
    store = await _store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("a", 1, [0]))).ok
        clash = await store.commit(_rec("b", 1, [0, 1]))
        assert not clash.ok and clash.reason.startswith("gpu_taken"), clash
        assert await store.gpu_owners("d00-n00") == {0: "a"}  # nothing of b's was written
        await store.put_node(NodeRecord(name="d00-n00", domain="d00", state="draining"))
        drained = await store.commit(_rec("c", 1, [3]))
        assert not drained.ok and drained.reason.startswith("node_unavailable"), drained
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_a_leader_lease_has_one_holder_and_passes_on_when_it_lapses(redis_url: str, namespace: str) -> None:
    store = await _store(redis_url, namespace)
    key = store.names.queue_leader_key
    try:
        assert await store.hold_lease(key, "a", 5.0)
        assert not await store.hold_lease(key, "b", 5.0)  # a holds it
        await store.r.pexpire(key, 100_000)
        assert await store.hold_lease(key, "a", 5.0)  # renewed by its holder, to the lease's length
        assert 0 < await store.r.pttl(key) <= 5_000
        await store.r.delete(key)  # a's lease lapsed
        assert await store.hold_lease(key, "b", 5.0)
        assert not await store.hold_lease(key, "a", 5.0)
        assert await store.r.get(key) == b"b"
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()
