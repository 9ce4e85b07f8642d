"""The asyncio client: `Client`'s methods as coroutines, its streams as async iterators, on a small HTTP/1.1
implementation of its own (`_http11`) rather than `Client` in threads: a stream waits in the event loop, not in a
thread, and cancelling it hangs up at once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from datetime import date
from types import TracebackType
from typing import Any, Generic, TypeVar

from rackscale import _protocol as p
from rackscale import _sse
from rackscale._http11 import Answer
from rackscale.types import Accepted, ClusterView, DryRunView, JobBody, JobEvent, JobList, JobView, LogLine, UsageView

T = TypeVar("T")
_OPENED: Any = object()  # what a stream's generator yields once its answer is open (nothing for the caller)


class AsyncClient:
    """The Rackscale API for asyncio code; the same arguments, methods and errors as `rackscale.Client`."""

    def __init__(
        self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0, retries: int = 5
    ) -> None:
        self._api = p.Api.of(url, token)
        self.timeout = timeout
        self.retries = retries

    @property
    def url(self) -> str:
        return str(self._api.endpoint)

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    # -- jobs ----------------------------------------------------------------------------------------------------
    async def submit(self, body: JobBody | Mapping[str, Any], *, idempotency_key: str | None = None) -> Accepted:
        """Submit a job (a JobBody or its JSON as a dict). With `idempotency_key`, a retry names the same job."""
        return await self._call(self._api.submit(body, idempotency_key))

    async def submit_file(self, path: str | os.PathLike[str], *, idempotency_key: str | None = None) -> Accepted:
        """Submit a job file as it is: YAML (.yaml/.yml), JSON (.json), else a batch script with #SBATCH lines."""
        call = await asyncio.to_thread(self._api.submit_file, path, idempotency_key)
        return await self._call(call)

    async def dry_run(self, body: JobBody | Mapping[str, Any]) -> DryRunView:
        """Where and when the job would start, without submitting it (a DryRunView)."""
        return await self._call(self._api.dry_run(body))

    async def get(self, job_id: str) -> JobView:
        """The job, also after it ended; `.state` says where it is."""
        return await self._call(self._api.get(job_id))

    async def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        array: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> JobList:
        """One page of jobs in submit order (`.jobs`, `.total` matching)."""
        return await self._call(self._api.list(tenant=tenant, state=state, array=array, limit=limit, offset=offset))

    async def list_all(
        self, *, tenant: str | None = None, state: str | None = None, array: str | None = None, page: int = p.PAGE_MAX
    ) -> AsyncIterator[JobView]:
        """Every job matching, page after page."""
        offset = 0
        while True:
            got = await self.list(tenant=tenant, state=state, array=array, limit=page, offset=offset)
            for job in got.jobs:
                yield job
            offset += len(got.jobs)
            if not got.jobs or offset >= got.total:
                return

    async def cancel(self, job_id: str) -> Accepted:
        """Cancel a job (its GPUs free at once); ApiError 409 when it already ended."""
        return await self._call(self._api.cancel(job_id))

    async def wait(self, job_id: str, timeout: float | None = None, *, poll_s: float | None = None) -> JobView:
        """The job once it has ended (succeeded, failed or cancelled); TimeoutError after `timeout` seconds.
        Woken by the job's events from /v1/events; with `poll_s`, reads the job that often instead."""
        try:
            async with asyncio.timeout(timeout) as limit:
                if poll_s is not None:
                    return await self._poll(job_id, poll_s)
                return await self._wait(job_id)
        except TimeoutError:
            if limit.expired():
                raise TimeoutError(f"job {job_id} did not end within {timeout:g} s") from None
            raise

    async def _wait(self, job_id: str) -> JobView:
        while True:
            items = self._events()
            heard_end = False
            try:
                await anext(items)  # the answer started: the gateway hears the job's events for us from here on
                job = await self.get(job_id)
                if job.state in p.TERMINAL:
                    return job
                async for e in items:
                    if isinstance(e, JobEvent) and e.job_id == job_id and e.state in p.TERMINAL:
                        heard_end = True
                        break
            finally:
                await items.aclose()
            if heard_end:
                return await self._poll(job_id, p.WAIT_RECHECK_S)  # its view may trail the event a moment
            await asyncio.sleep(p.WAIT_RECHECK_S)  # the stream dropped or went silent: connect again

    async def _poll(self, job_id: str, every_s: float) -> JobView:
        while (job := await self.get(job_id)).state not in p.TERMINAL:
            await asyncio.sleep(every_s)
        return job

    # -- streams -------------------------------------------------------------------------------------------------
    def events(self) -> AsyncStream[p.Event]:
        """Job and node events as they happen: JobEvent, NodeChanged, ClusterChanged. `async with client.events() as
        events:` connects before its body runs (nothing after it is missed); it ends when the gateway closes the
        stream or it goes silent."""
        return AsyncStream(self._events())

    def logs(
        self,
        job_id: str,
        *,
        follow: bool = False,
        rank: int | None = None,
        tail: int | None = None,
        since: float | None = None,
        attempt: int | None = None,
    ) -> AsyncStream[LogLine]:
        """What the job's processes wrote, a LogLine each (as `Client.logs`)."""
        query = {"rank": rank, "tail": tail, "since": since, "attempt": attempt}
        if follow:
            return AsyncStream(self._follow(job_id, query))
        return AsyncStream(self._text_lines(job_id, query, rank))

    # -- the rest of the API -------------------------------------------------------------------------------------
    async def usage(
        self,
        *,
        tenant: str | None = None,
        from_: str | date | float | None = None,
        to: str | date | float | None = None,
        by: str | None = None,
        csv: bool = False,
    ) -> UsageView | str:
        """GPU-hours and jobs per tenant and period (a UsageView); `csv`: the same as CSV text."""
        return await self._call(self._api.usage(tenant=tenant, from_=from_, to=to, by=by, csv=csv))

    async def cluster(self) -> ClusterView:
        """Domains → nodes → GPUs, with health, owners and utilisation."""
        return await self._call(self._api.cluster())

    # -- I/O -----------------------------------------------------------------------------------------------------
    async def _call(self, call: p.Call[T]) -> T:
        answer = await self._open(call.request)
        async with answer, asyncio.timeout(self.timeout):
            data = await answer.read()
        return call.read(answer.status, data)

    async def _open(self, request: p.Request) -> Answer:
        """The open answer of a 2xx (after waiting out a 503 with Retry-After, `retries` times); else ApiError."""
        for attempt in range(self.retries + 1):
            async with asyncio.timeout(self.timeout):
                answer = await Answer.open(self._api.endpoint, request)
                if answer.status < 400:
                    return answer
                async with answer:
                    data = await answer.read()
            wait = p.retry_wait(request, answer.status, answer.headers) if attempt < self.retries else None
            if wait is None:
                raise p.error_of(answer.status, answer.headers, data, answer.reason)
            await asyncio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _events(self) -> AsyncGenerator[p.Event, None]:
        """Yields _OPENED once connected, then the events, until the stream ends, drops or goes silent."""
        answer = await self._open(self._api.events())
        reader = _sse.Reader()
        async with answer:
            yield _OPENED
            async for raw in _stream_lines(answer):
                ev = reader.feed(raw.decode("utf-8", "replace"))
                item = p.event_of(ev) if ev is not None else None
                if item is not None:
                    yield item

    async def _follow(self, job_id: str, query: dict[str, Any]) -> AsyncGenerator[LogLine, None]:
        follower = p.LogFollower()
        answer: Answer | None = await self._open(self._api.logs(job_id, follow=True, **query))
        try:
            yield _OPENED
            for _ in range(p.FOLLOW_RECONNECTS + 1):
                if answer is None:
                    await asyncio.sleep(p.FOLLOW_RECONNECT_S)
                    answer = await self._open(self._api.logs(job_id, follow=True, last_id=follower.last_id, **query))
                async with answer:
                    async for raw in _stream_lines(answer):
                        for line in follower.feed(raw):
                            yield line
                        if follower.ended:
                            return
                answer = None
                follower.dropped()
        finally:
            if answer is not None:
                answer.close()
        raise ConnectionError(f"the log stream of job {job_id} kept dropping")

    async def _text_lines(self, job_id: str, query: dict[str, Any], rank: int | None) -> AsyncGenerator[LogLine, None]:
        answer = await self._open(self._api.logs(job_id, follow=False, **query))
        async with answer:
            yield _OPENED
            while True:
                async with asyncio.timeout(self.timeout):
                    raw = await answer.readline()
                if not raw:
                    return
                yield p.text_line(raw.decode("utf-8", "replace"), rank)


async def _stream_lines(answer: Answer) -> AsyncIterator[bytes]:
    """A stream's lines until it ends, drops or goes silent for STREAM_IDLE_S (keep-alives come more often)."""
    while True:
        try:
            async with asyncio.timeout(p.STREAM_IDLE_S):
                raw = await answer.readline()
        except (OSError, TimeoutError):  # ProtocolError is a ConnectionError
            return
        if not raw:
            return
        yield raw


class AsyncStream(Generic[T]):
    """An open answer's items, as they come: `async for` over it. `async with` connects before its body runs and
    hangs up after it; without it, the first item connects, and `aclose()` hangs up early."""

    def __init__(self, items: AsyncGenerator[T, None]) -> None:
        self._items = items
        self._opened = False

    async def _open(self) -> None:
        if not self._opened:
            first = await anext(self._items)
            assert first is _OPENED
            self._opened = True

    def __aiter__(self) -> AsyncStream[T]:
        return self

    async def __anext__(self) -> T:
        await self._open()
        return await anext(self._items)

    async def aclose(self) -> None:
        await self._items.aclose()

    async def __aenter__(self) -> AsyncStream[T]:
        await self._open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
