"""The commit and release scripts against a real Redis/Valkey."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import pytest

from shared.names import Names
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, NodeGpus, NodeRecord
from shared.store import Store, ViewMark

pytestmark = pytest.mark.asyncio


async def _store(redis_url: str, namespace: str) -> Store:
    store = Store.from_url(redis_url, Names(prefix=namespace))
    await store.open_view(ViewMark(), time.time())
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


async def test_a_release_of_an_allocation_read_before_a_newer_commit_frees_nothing(
    redis_url: str, namespace: str
) -> None:
    # placement reads the allocation, then releases it: if the job's attempt 1 was released and attempt 2
    # committed in between, the release of what it read must leave attempt 2's GPUs and record alone
    store = await _store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("j", 1, [0, 1]))).ok
        read = await store.allocation("j")
        assert read is not None and await store.release("j")
        assert (await store.commit(_rec("j", 2, [2, 3]))).ok
        assert not await store.release("j", read)
        assert await store.gpu_owners("d00-n00") == {2: "j", 3: "j"}
        assert (held := await store.allocation("j")) is not None and held.attempt == 2
        assert await store.release("j", held)
        assert await store.gpu_owners("d00-n00") == {} and await store.allocation("j") is None
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


async def test_the_undecided_set_follows_each_job_write(redis_url: str, namespace: str) -> None:
    store = await _store(redis_url, namespace)
    n = store.names

    async def undecided() -> set[str]:
        return {m.decode() for m in await store.r.smembers(n.undecided_jobs_key)}

    try:
        assert not await store.undecided_job_ids()
        await store.put_job(JobRecord(id="a", spec=JobBody(name="a", tenant="t", gpus=4)), new=True)
        await store.put_job(JobRecord(id="b", spec=JobBody(name="b", tenant="t", gpus=4)), new=True)
        assert await store.undecided_job_ids() == await undecided() == {"a", "b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, inflight_since=1.0))  # ordered
        assert await undecided() == {"b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, inflight_since=None))  # rejected: back
        assert await undecided() == {"a", "b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        await store.update_job("b", lambda r: msgspec.structs.replace(r, state=JobState.CANCELLED))
        assert not await store.undecided_job_ids()
        assert {m.decode() for m in await store.r.smembers(n.active_jobs_key)} == {"a"}
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_job_writes_from_two_stores_never_lose_each_other(redis_url: str, namespace: str) -> None:
    """Each store decides on the record it saw last; the CAS catches the other's write in between."""
    a = await _store(redis_url, namespace)
    b = Store.from_url(redis_url, a.names)
    job = JobRecord(id="j", spec=JobBody(name="j", tenant="t", gpus=4), reason="r0")
    try:
        stored, created = await a.create_job(job)
        assert created and stored == job
        again, created = await b.create_job(msgspec.structs.replace(job, reason="redelivered"))
        assert not created and again.reason == "r0"  # the first submission wins; the stored one comes back
        seen: list[str] = []

        def append(tag: str) -> Callable[[JobRecord], JobRecord]:
            def change(r: JobRecord) -> JobRecord:
                seen.append(r.reason)
                return msgspec.structs.replace(r, reason=r.reason + tag)

            return change

        await a.update_job("j", append("+a"))  # a remembers "r0+a"
        await b.update_job("j", append("+b"))  # b decides on "r0" (its create saw it), the CAS sends it to "r0+a"
        rec, changed = await a.update_job("j", append("+a2"))  # a's memory is stale: decided again on the store
        assert changed and rec is not None and rec.reason == "r0+a+b+a2"
        assert seen == ["r0", "r0", "r0+a", "r0+a", "r0+a+b"]
        await b.update_job("j", append("+b2"))
        # "no change" decided on a stale memory is checked against the store
        rec, changed = await a.update_job("j", lambda r: None if r.reason.endswith("+b2") else r)
        assert not changed and rec is not None and rec.reason.endswith("+b2")
        assert (await a.get_job("j")) == rec
        await b.r.delete(b.names.job_key("j"))  # gone under a's memory
        assert await a.update_job("j", append("+x")) == (None, False)
        assert await a.get_job("j") is None
    finally:
        await a.r.delete(*[k async for k in a.r.scan_iter(a.names.key_pattern)])
        await a.close()
        await b.close()


async def test_a_full_read_never_undoes_a_write_that_landed_while_its_reply_was_on_its_way(
    redis_url: str, namespace: str
) -> None:
    # The write is made to land between the server answering the full read's MGET and the store taking the
    # answer in: the answer holds the record as it was, and must not replace the newer one.
    a = await _store(redis_url, namespace)
    spec = JobBody(name="j", tenant="t", gpus=4)
    real_mget = a.r.mget
    writes: list[str] = []

    async def mget_then_write(*args: object, **kw: object) -> object:
        raws = await real_mget(*args, **kw)
        if not writes:
            writes.append("late")
            await a.update_job("mine", lambda r: msgspec.structs.replace(r, reason="written meanwhile"))
        return raws

    try:
        await a.create_job(JobRecord(id="mine", spec=spec, reason="first"))
        await a.create_job(JobRecord(id="gone", spec=spec))
        a.r.mget = mget_then_write  # type: ignore[method-assign]
        await a.remember_active_jobs()
        assert writes == ["late"]
        assert a.remembered_jobs()["mine"].reason == "written meanwhile"  # the read's older bytes were dropped
        assert set(a.remembered_jobs()) == {"mine", "gone"}
        # the same for a read of named records
        writes.clear()
        await a.get_jobs(["mine"], remember=True)
        assert writes == ["late"] and a.remembered_jobs()["mine"].reason == "written meanwhile"
        # and a read that no write of its own store overtook takes its answer in
        b = Store.from_url(redis_url, a.names)
        try:
            await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="written elsewhere"))
        finally:
            await b.close()
        await a.remember_active_jobs()
        assert writes == ["late"] and a.remembered_jobs()["mine"].reason == "written elsewhere"
    finally:
        a.r.mget = real_mget  # type: ignore[method-assign]
        await a.r.delete(*[k async for k in a.r.scan_iter(a.names.key_pattern)])
        await a.close()


async def test_a_full_read_makes_the_remembered_jobs_exactly_the_active_ones(redis_url: str, namespace: str) -> None:
    a = await _store(redis_url, namespace)

    async def full_read() -> None:
        await a.remember_active_jobs()
        assert {r.id for r in await a.active_jobs()} == set(a.remembered_jobs())

    b = Store.from_url(redis_url, a.names)  # another writer: a learns of its jobs only by reading
    spec = JobBody(name="j", tenant="t", gpus=4)
    try:
        await a.create_job(JobRecord(id="mine", spec=spec))
        await a.create_job(JobRecord(id="done", spec=spec))
        await b.create_job(JobRecord(id="theirs", spec=spec))
        await a.update_job("done", lambda r: msgspec.structs.replace(r, state=JobState.SUCCEEDED))
        assert set(a.remembered_jobs()) == {"mine"}  # terminal jobs leave; b's job is unknown yet
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b wrote"))
        assert a.remembered_jobs()["mine"].reason == ""  # stale until read
        await full_read()
        assert set(a.remembered_jobs()) == {"mine", "theirs"}
        assert a.remembered_jobs()["mine"].reason == "b wrote"
        await b.update_job("theirs", lambda r: msgspec.structs.replace(r, state=JobState.CANCELLED))
        await full_read()
        assert set(a.remembered_jobs()) == {"mine"}  # ended elsewhere: forgotten by the next full read
        # a read that finds a record unchanged keeps its object (the queue's HeldState compares by identity)
        mine = a.remembered_jobs()["mine"]
        await full_read()
        assert a.remembered_jobs()["mine"] is mine
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b again"))
        await full_read()
        assert a.remembered_jobs()["mine"] is not mine and a.remembered_jobs()["mine"].reason == "b again"
        # every change of a remembered record is noted for the queue's HeldState, once
        a.take_changed_jobs()
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b thrice"))
        await full_read()
        await full_read()  # nothing new
        assert a.take_changed_jobs() == {"mine"} and a.take_changed_jobs() == set()
        # whether anything remembered is pending, without decoding a record (a kicked cycle's first question)
        assert a.remembers_pending() and a.remembered_ids() == {"mine"}
        await a.update_job("mine", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        assert not a.remembers_pending()
        await b.create_job(JobRecord(id="late", spec=spec))
        await a.get_jobs(["late"], remember=True)
        assert a.remembers_pending() and set(a.remembered_jobs()) == {"mine", "late"}
        # what a kicked cycle reads: the pending records only, and a live read-only view of every record
        view = a.remembered_view()
        assert set(a.remembered_pending()) == {"late"} and dict(view) == a.remembered_jobs()
        assert view["late"] is a.remembered_pending()["late"] is a.remembered_jobs()["late"]
        await a.update_job("late", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        await a.update_job("mine", lambda r: msgspec.structs.replace(r, state=JobState.SUCCEEDED))
        assert a.remembered_pending() == {}
        view = a.remembered_view()
        assert set(view) == {"late"} and view["late"].state is JobState.RUNNING
        with pytest.raises(TypeError):
            view["x"] = view["late"]  # type: ignore[index]
    finally:
        await a.r.delete(*[k async for k in a.r.scan_iter(a.names.key_pattern)])
        await a.close()
        await b.close()
