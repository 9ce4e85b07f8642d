"""The synchronous client, over `http.client` (a connection per request: nothing is shared between threads)."""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections.abc import Generator, Iterator, Mapping
from datetime import date
from types import TracebackType
from typing import Any, Generic, TypeVar

from rackscale import _protocol as p
from rackscale import _sse
from rackscale.types import Accepted, ClusterView, DryRunView, JobBody, JobEvent, JobList, JobView, LogLine, UsageView

T = TypeVar("T")
_OPENED: Any = object()  # what a stream's generator yields once its answer is open (nothing for the caller)


class Client:
    """The Rackscale API. `url`: the gateway (else $RACKSCALE_URL, else http://127.0.0.1:8080); `token`: a bearer
    token (else $RACKSCALE_TOKEN; none for an open gateway). `timeout`: seconds for an answer (streams wait for as
    long as they last). `retries`: how often a read or cancel answered 503 with Retry-After is asked again.

    Errors: `rackscale.ApiError` for an answer 4xx/5xx (status, message, field); the standard library's OSErrors
    when the gateway can't be reached."""

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
        return f"Client({self.url!r})"

    # -- jobs ----------------------------------------------------------------------------------------------------
    def submit(self, body: JobBody | Mapping[str, Any], *, idempotency_key: str | None = None) -> Accepted:
        """Submit a job (a JobBody or its JSON as a dict). With `idempotency_key`, a retry names the same job."""
        return self._call(self._api.submit(body, idempotency_key))

    def submit_file(self, path: str | os.PathLike[str], *, idempotency_key: str | None = None) -> Accepted:
        """Submit a job file as it is: YAML (.yaml/.yml), JSON (.json), else a batch script with #SBATCH lines."""
        return self._call(self._api.submit_file(path, idempotency_key))

    def dry_run(self, body: JobBody | Mapping[str, Any]) -> DryRunView:
        """Where and when the job would start, without submitting it (a DryRunView)."""
        return self._call(self._api.dry_run(body))

    def get(self, job_id: str) -> JobView:
        """The job, also after it ended; `.state` says where it is."""
        return self._call(self._api.get(job_id))

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        array: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> JobList:
        """One page of jobs in submit order (`.jobs`, `.total` matching)."""
        return self._call(self._api.list(tenant=tenant, state=state, array=array, limit=limit, offset=offset))

    def list_all(
        self, *, tenant: str | None = None, state: str | None = None, array: str | None = None, page: int = p.PAGE_MAX
    ) -> Iterator[JobView]:
        """Every job matching, page after page."""
        offset = 0
        while True:
            got = self.list(tenant=tenant, state=state, array=array, limit=page, offset=offset)
            yield from got.jobs
            offset += len(got.jobs)
            if not got.jobs or offset >= got.total:
                return

    def cancel(self, job_id: str) -> Accepted:
        """Cancel a job (its GPUs free at once); ApiError 409 when it already ended."""
        return self._call(self._api.cancel(job_id))

    def wait(self, job_id: str, timeout: float | None = None, *, poll_s: float | None = None) -> JobView:
        """The job once it has ended (succeeded, failed or cancelled); TimeoutError after `timeout` seconds.
        Woken by the job's events from /v1/events; with `poll_s`, reads the job that often instead."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if poll_s is not None:
            return self._poll(job_id, deadline, poll_s, timeout)
        heard_end = False
        while not heard_end:
            items = self._events(deadline)
            try:
                next(items)  # the answer started: the gateway hears the job's events for us from here on
                job = self.get(job_id)
                if job.state in p.TERMINAL:
                    return job
                heard_end = any(isinstance(e, JobEvent) and e.job_id == job_id and e.state in p.TERMINAL for e in items)
            finally:
                items.close()
            if not heard_end:  # the stream dropped or went silent (or the deadline passed): connect again
                time.sleep(_until(deadline, p.WAIT_RECHECK_S, job_id, timeout))
        return self._poll(job_id, deadline, p.WAIT_RECHECK_S, timeout)  # its view may trail the event a moment

    def _poll(self, job_id: str, deadline: float | None, every_s: float, timeout: float | None) -> JobView:
        while (job := self.get(job_id)).state not in p.TERMINAL:
            time.sleep(_until(deadline, every_s, job_id, timeout))
        return job

    # -- streams -------------------------------------------------------------------------------------------------
    def events(self) -> Stream[p.Event]:
        """Job and node events as they happen: JobEvent, NodeChanged, ClusterChanged. Connected when this returns
        (nothing after it is missed); it ends when the gateway closes the stream or it goes silent. Close it
        (`with client.events() as events:`) when done."""
        return Stream(self._events(None))

    def logs(
        self,
        job_id: str,
        *,
        follow: bool = False,
        rank: int | None = None,
        tail: int | None = None,
        since: float | None = None,
        attempt: int | None = None,
    ) -> Stream[LogLine]:
        """What the job's processes wrote, a LogLine each (`rank`, `text`): one rank's, the last `tail`, those shipped
        since a Unix time, an attempt's (default the latest). `follow`: goes on as they write until the job has
        ended (a dropped stream is picked up where it left off)."""
        query = {"rank": rank, "tail": tail, "since": since, "attempt": attempt}
        if follow:
            return Stream(self._follow(job_id, query))
        return Stream(self._text_lines(job_id, query, rank))

    # -- the rest of the API -------------------------------------------------------------------------------------
    def usage(
        self,
        *,
        tenant: str | None = None,
        from_: str | date | float | None = None,
        to: str | date | float | None = None,
        by: str | None = None,
        csv: bool = False,
    ) -> UsageView | str:
        """GPU-hours and jobs per tenant and period (a UsageView); `csv`: the same as CSV text."""
        return self._call(self._api.usage(tenant=tenant, from_=from_, to=to, by=by, csv=csv))

    def cluster(self) -> ClusterView:
        """Domains → nodes → GPUs, with health, owners and utilisation."""
        return self._call(self._api.cluster())

    # -- I/O -----------------------------------------------------------------------------------------------------
    def _call(self, call: p.Call[T]) -> T:
        answer = self._open(call.request, self.timeout)
        with answer:
            data = answer.read()
        return call.read(answer.status, data)

    def _open(self, request: p.Request, timeout: float | None) -> _Answer:
        """The open answer of a 2xx (after waiting out a 503 with Retry-After, `retries` times); else ApiError."""
        for attempt in range(self.retries + 1):
            answer = _Answer.open(self._api.endpoint, request, timeout)
            if answer.status < 400:
                return answer
            with answer:
                data = answer.read()
            wait = p.retry_wait(request, answer.status, answer.headers) if attempt < self.retries else None
            if wait is None:
                raise p.error_of(answer.status, answer.headers, data, answer.reason)
            time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _events(self, deadline: float | None) -> Generator[p.Event, None, None]:
        """Yields _OPENED once connected, then the events, until the stream ends, drops, goes silent or `deadline`."""
        answer = self._open(self._api.events(), self.timeout)
        reader = _sse.Reader()
        with answer:
            yield _OPENED
            for raw in answer.stream_lines(deadline):
                ev = reader.feed(raw.decode("utf-8", "replace"))
                item = p.event_of(ev) if ev is not None else None
                if item is not None:
                    yield item

    def _follow(self, job_id: str, query: dict[str, Any]) -> Generator[LogLine, None, None]:
        follower = p.LogFollower()
        answer: _Answer | None = self._open(self._api.logs(job_id, follow=True, **query), self.timeout)
        try:
            yield _OPENED
            for _ in range(p.FOLLOW_RECONNECTS + 1):
                if answer is None:
                    time.sleep(p.FOLLOW_RECONNECT_S)
                    request = self._api.logs(job_id, follow=True, last_id=follower.last_id, **query)
                    answer = self._open(request, self.timeout)
                with answer:
                    for raw in answer.stream_lines(None):
                        yield from follower.feed(raw)
                        if follower.ended:
                            return
                answer = None
                follower.dropped()
        finally:
            if answer is not None:
                answer.close()
        raise ConnectionError(f"the log stream of job {job_id} kept dropping")

    def _text_lines(self, job_id: str, query: dict[str, Any], rank: int | None) -> Generator[LogLine, None, None]:
        answer = self._open(self._api.logs(job_id, follow=False, **query), self.timeout)
        with answer:
            yield _OPENED
            while raw := answer.readline(self.timeout):
                yield p.text_line(raw.decode("utf-8", "replace"), rank)


class Stream(Generic[T]):
    """An open answer's items, as they come. Iterate it; close it (or use it in a `with`) to hang up early."""

    def __init__(self, items: Generator[T, None, None]) -> None:
        self._items = items
        first = next(items)  # open it now: a failure raises here, and nothing sent after this is missed
        assert first is _OPENED

    def __iter__(self) -> Stream[T]:
        return self

    def __next__(self) -> T:
        return next(self._items)

    def close(self) -> None:
        self._items.close()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()


class _Answer:
    """One request's open answer on its own connection."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, sock: socket.socket) -> None:
        self._conn, self._resp, self._sock = conn, resp, sock
        self.status = resp.status
        self.reason = resp.reason
        self.headers = {k.lower(): v for k, v in resp.getheaders()}

    @classmethod
    def open(cls, endpoint: p.Endpoint, request: p.Request, timeout: float | None) -> _Answer:
        factory = http.client.HTTPSConnection if endpoint.scheme == "https" else http.client.HTTPConnection
        conn = factory(endpoint.host, endpoint.port, timeout=timeout)
        try:
            conn.request(request.method, request.target, body=request.body, headers=request.headers)
            sock = conn.sock  # kept: the answer's reads are timed on it
            assert sock is not None
            return cls(conn, conn.getresponse(), sock)
        except BaseException:
            conn.close()
            raise

    def read(self) -> bytes:
        return self._resp.read()

    def readline(self, timeout: float | None) -> bytes:
        """The body's next line (b"" at its end); a read waits `timeout` seconds at most."""
        self._sock.settimeout(timeout)
        return self._resp.readline()

    def stream_lines(self, deadline: float | None) -> Iterator[bytes]:
        """A stream's lines until it ends, drops, goes silent for STREAM_IDLE_S (keep-alives come more often) or
        `deadline` passes: the caller connects again, or ends."""
        while True:
            wait = p.STREAM_IDLE_S if deadline is None else min(p.STREAM_IDLE_S, deadline - time.monotonic())
            if wait <= 0:
                return
            try:
                raw = self.readline(wait)
            except (OSError, http.client.HTTPException):
                return
            if not raw:
                return
            yield raw

    def close(self) -> None:
        self._resp.close()
        self._conn.close()

    def __enter__(self) -> _Answer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _until(deadline: float | None, step: float, job_id: str, timeout: float | None) -> float:
    """`step`, or what is left before `deadline` if less; TimeoutError once it has passed."""
    if deadline is None:
        return step
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"job {job_id} did not end within {timeout:g} s")
    return min(step, left)
