"""The queue's and migration's job record cache (`shared.job_cache.JobCache`) over a real Redis/Valkey."""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import pytest

from shared.job_cache import JobCache
from shared.schemas import JobBody, JobRecord, JobState
from shared.store import Store
from tests.integration.conftest import open_store

pytestmark = pytest.mark.asyncio


async def test_job_writes_from_two_stores_never_lose_each_other(redis_url: str, namespace: str) -> None:
    """Each store decides on the record it saw last; the CAS catches the other's write in between."""
    a = await open_store(redis_url, namespace)
    b = Store.from_url(redis_url, a.names)
    ca, cb = JobCache(a), JobCache(b)
    job = JobRecord(id="j", spec=JobBody(name="j", tenant="t", gpus=4), reason="r0")
    try:
        stored, created = await ca.create(job)
        assert created and stored == job
        again, created = await cb.create(msgspec.structs.replace(job, reason="redelivered"))
        assert not created and again.reason == "r0"  # the first submission wins; the stored one comes back
        seen: list[str] = []

        def append(tag: str) -> Callable[[JobRecord], JobRecord]:
            def change(r: JobRecord) -> JobRecord:
                seen.append(r.reason)
                return msgspec.structs.replace(r, reason=r.reason + tag)

            return change

        await ca.update("j", append("+a"))  # a keeps "r0+a"
        await cb.update("j", append("+b"))  # b decides on "r0" (its create saw it), the CAS sends it to "r0+a"
        rec, changed = await ca.update("j", append("+a2"))  # a's record is stale: decided again on the store
        assert changed and rec is not None and rec.reason == "r0+a+b+a2"
        assert seen == ["r0", "r0", "r0+a", "r0+a", "r0+a+b"]
        await cb.update("j", append("+b2"))
        # "no change" decided on a stale record is checked against the store
        rec, changed = await ca.update("j", lambda r: None if r.reason.endswith("+b2") else r)
        assert not changed and rec is not None and rec.reason.endswith("+b2")
        assert (await a.get_job("j")) == rec
        await b.r.delete(b.names.job_key("j"))  # gone under a's record
        assert await ca.update("j", append("+x")) == (None, False)
        assert ca.ids() == set()
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
    a = await open_store(redis_url, namespace)
    cache = JobCache(a)
    spec = JobBody(name="j", tenant="t", gpus=4)
    real_mget = a.r.mget
    writes: list[str] = []

    async def mget_then_write(*args: object, **kw: object) -> object:
        raws = await real_mget(*args, **kw)
        if not writes:
            writes.append("late")
            await cache.update("mine", lambda r: msgspec.structs.replace(r, reason="written meanwhile"))
        return raws

    try:
        await cache.create(JobRecord(id="mine", spec=spec, reason="first"))
        await cache.create(JobRecord(id="gone", spec=spec))
        a.r.mget = mget_then_write  # type: ignore[method-assign]
        await cache.read_active()
        assert writes == ["late"]
        assert cache.records()["mine"].reason == "written meanwhile"  # the read's older bytes were dropped
        assert set(cache.records()) == {"mine", "gone"}
        # the same for a read of named records
        writes.clear()
        await cache.read(["mine"])
        assert writes == ["late"] and cache.records()["mine"].reason == "written meanwhile"
        # and a read that no write of its own store overtook takes its answer in
        b = Store.from_url(redis_url, a.names)
        try:
            await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="written elsewhere"))
        finally:
            await b.close()
        await cache.read_active()
        assert writes == ["late"] and cache.records()["mine"].reason == "written elsewhere"
    finally:
        a.r.mget = real_mget  # type: ignore[method-assign]
        await a.r.delete(*[k async for k in a.r.scan_iter(a.names.key_pattern)])
        await a.close()


async def test_a_full_read_makes_the_cache_exactly_the_active_jobs(redis_url: str, namespace: str) -> None:
    a = await open_store(redis_url, namespace)
    cache = JobCache(a)

    async def full_read() -> None:
        await cache.read_active()
        assert {r.id for r in await a.active_jobs()} == set(cache.records())

    b = Store.from_url(redis_url, a.names)  # another writer: a learns of its jobs only by reading
    spec = JobBody(name="j", tenant="t", gpus=4)
    try:
        await cache.create(JobRecord(id="mine", spec=spec))
        await cache.create(JobRecord(id="done", spec=spec))
        await b.create_job(JobRecord(id="theirs", spec=spec))
        await cache.update("done", lambda r: msgspec.structs.replace(r, state=JobState.SUCCEEDED))
        assert set(cache.records()) == {"mine"}  # terminal jobs leave; b's job is unknown yet
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b wrote"))
        assert cache.records()["mine"].reason == ""  # stale until read
        await full_read()
        assert set(cache.records()) == {"mine", "theirs"}
        assert cache.records()["mine"].reason == "b wrote"
        await b.update_job("theirs", lambda r: msgspec.structs.replace(r, state=JobState.CANCELLED))
        await full_read()
        assert set(cache.records()) == {"mine"}  # ended elsewhere: forgotten by the next full read
        # a read that finds a record unchanged keeps its object (the queue's HeldState compares by identity)
        mine = cache.records()["mine"]
        await full_read()
        assert cache.records()["mine"] is mine
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b again"))
        await full_read()
        assert cache.records()["mine"] is not mine and cache.records()["mine"].reason == "b again"
        # every change of a kept record is noted for the queue's HeldState, once
        cache.take_changed()
        await b.update_job("mine", lambda r: msgspec.structs.replace(r, reason="b thrice"))
        await full_read()
        await full_read()  # nothing new
        assert cache.take_changed() == {"mine"} and cache.take_changed() == set()
        # whether anything kept is pending, without decoding a record (a kicked cycle's first question)
        assert cache.has_pending() and cache.ids() == {"mine"}
        await cache.update("mine", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        assert not cache.has_pending()
        await b.create_job(JobRecord(id="late", spec=spec))
        await cache.read(["late"])
        assert cache.has_pending() and set(cache.records()) == {"mine", "late"}
        # what a kicked cycle reads: the pending records only, and a live read-only view of every record
        view = cache.view()
        assert set(cache.pending()) == {"late"} and dict(view) == cache.records()
        assert view["late"] is cache.pending()["late"] is cache.records()["late"]
        await cache.update("late", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        await cache.update("mine", lambda r: msgspec.structs.replace(r, state=JobState.SUCCEEDED))
        assert cache.pending() == {}
        view = cache.view()
        assert set(view) == {"late"} and view["late"].state is JobState.RUNNING
        with pytest.raises(TypeError):
            view["x"] = view["late"]  # type: ignore[index]
    finally:
        await a.r.delete(*[k async for k in a.r.scan_iter(a.names.key_pattern)])
        await a.close()
        await b.close()
