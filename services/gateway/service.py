"""The HTTP gateway: the only HTTP surface. Validates, publishes intents on the bus, reads views from Redis.

It writes nothing to Redis: job records are the queue's, nodes inventory's, allocations placement's.
A submit is a JobSubmitted on JetStream (msg id = job id, so a retried publish is stored once); a
cancel a JobCancel; a drain a NodeAdmin request to inventory. `build_app(deps)` gives the aiohttp
application alone, for aiohttp's test client; `GatewayService` serves it on settings.gateway_host/port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from services.gateway import arrays, auth, dashboard, dry_run, jobfiles, openapi, summary, usage, views
from services.gateway.auth import Principal, Tokens
from services.gateway.metrics import cluster_metrics
from services.gateway.validation import MAX_SEQ, ApiError, check_idempotency_key, check_job, decode_json
from shared import api, sse
from shared.api import DEFAULT_PAGE, MAX_PAGE
from shared.core import JobSpec, Topology
from shared.held_view import HeldView
from shared.jobfile import schema
from shared.joblog import read_log
from shared.metrics import metrics_response
from shared.names import cell_job_id, idempotent_job_id
from shared.rank_log import LogReader, as_text
from shared.redis_client import UNAVAILABLE
from shared.runtime import Deps, Service
from shared.schemas import (
    ADMIN_REPLY,
    EVENTS,
    LOG_CHUNK,
    TERMINAL,
    AllocationRecord,
    Committed,
    JobBody,
    JobCancel,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    LogChunk,
    NodeAdmin,
    NodeChanged,
    NodeRecord,
    Released,
)
from shared.store import ViewNotReady
from shared.topology_view import TopologyView
from shared.usage_report import CSV_TYPE, usage_csv
from shared.usage_store import READY, UsageStore

log = logging.getLogger("rackscale.gateway")


class NotRecordedYet(Exception):
    """A job without a record while submits wait for the queue: it may be one of them (503, not 404)."""


MAX_BODY = 1 << 20
# A submission is checked against a registered topology up to this old (no round trip for it). Nodes are
# only added (a down node keeps its record), so a stale topology can only refuse too much: a job it refuses
# is checked again against the current one. Without any node registered the current one is always read.
SUBMIT_TOPOLOGY_MAX_AGE_S = 1.0
VIEW_RETRY_AFTER_S = 1  # what a 503 during a rebuild of the view asks a client to wait
ALLOCATIONS_READ_S = 5.0  # /v1/cluster reads every allocation at most this often; placement's events in between
FOLLOW_POLL_S = 1.0  # a log follower with nothing new looks at the job's state this often (lines are pushed)
FOLLOW_END_S = 2.0  # ... and stops this long after the job ended with nothing more shipped
LAST_EVENT_ID = "Last-Event-ID"  # the header a reconnecting SSE client sends: the last id it heard
SSE_HEADERS = {"Content-Type": sse.MEDIA_TYPE, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_QUEUE = 1024  # frames buffered per SSE client; a client further behind is disconnected (it reconnects)

DRAIN_BODY = msgspec.json.Decoder(api.DrainBody)
_json = msgspec.json.Encoder()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_json.encode(obj), status=status, content_type="application/json", headers=headers)


def error_response(status: int, error: str, field: str | None = None) -> web.Response:
    return json_response(api.ErrorBody(error=error, field=field), status)


def api_error(e: ApiError) -> web.Response:
    return error_response(e.status, e.error, e.field)


def _location(job_id: str, body: JobBody) -> str:
    """Where an accepted submit is read: the job, or an array's tasks."""
    return f"/v1/jobs?array={job_id}" if body.array is not None else f"/v1/jobs/{job_id}"


def _trace_parent(request: web.Request) -> dict[str, str] | None:
    tp = request.headers.get("traceparent")
    return {"traceparent": tp} if tp else None


# What a user hears instead of another tenant's JobEvent: only that /v1/cluster changed (its GPUs show there as
# busy and unnamed anyway), so a dashboard redraws; one at most waits in a client's queue.
CLUSTER_CHANGED = sse.frame("cluster", b"{}")


class _Stream:
    """One SSE client: frames from the NATS callback, a None sentinel ends it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(SSE_QUEUE)
        self.cluster_queued = False

    def cluster_changed(self) -> None:
        if not self.cluster_queued:
            self.cluster_queued = True
            self.push(CLUSTER_CHANGED)

    def push(self, frame: bytes) -> None:
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            log.warning("an SSE client fell %d events behind; disconnecting it", SSE_QUEUE)
            self.close()

    def close(self) -> None:
        while True:  # make room for the sentinel: whatever is queued is dropped anyway
            try:
                self.queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self.queue.get_nowait()


class Gateway:
    """Request handlers over explicit dependencies."""

    def __init__(
        self,
        deps: Deps,
        *,
        keepalive_s: float = 15.0,
        admin_timeout_s: float = 2.0,
        follow_poll_s: float = FOLLOW_POLL_S,
        follow_end_s: float = FOLLOW_END_S,
    ) -> None:
        self.deps = deps
        self.keepalive_s = keepalive_s
        self.follow_poll_s, self.follow_end_s = follow_poll_s, follow_end_s
        self.admin_timeout_s = admin_timeout_s
        self.cluster_views = views.ClusterViews()  # kept between requests: unchanged nodes are not built again
        self._cluster_records: tuple[int, list[NodeRecord]] | None = None  # (topo:gen, the records at it)
        # allocations as placement's events tell them, read whole every ALLOCATIONS_READ_S (and after a break)
        self.held = HeldView()
        self._held_read_at: float | None = None
        self._held_sub: Any = None
        self.topology = TopologyView(deps.store)
        # the largest fleet seen registered: node records are only added (a down node keeps its own), so a
        # smaller one is a fleet relearning its nodes after Redis lost them, and a job it refuses may still fit
        self._widest: Topology | None = None
        self._streams: set[_Stream] = set()

    # -- helpers ---------------------------------------------------------------------------------------
    async def domain_of(self) -> Mapping[str, str]:
        """Node name → NVLink domain of the registered nodes (what a job's allocation is shown with)."""
        await self.topology.get()
        return self.topology.domain_of

    async def submit_topology(self, max_age_s: float = 0.0) -> Topology | None:
        """The topology a submission is checked against: the queue's (None while no node is registered)."""
        known = await self.topology.get(max_age_s)
        if known is None:
            return None
        topo = known[0]
        if self._widest is None or len(topo.node_names) >= len(self._widest.node_names):
            self._widest = topo
        return topo

    def now(self) -> float:
        return self.deps.clock()

    # -- jobs ------------------------------------------------------------------------------------------
    async def submit(self, request: web.Request) -> web.Response:
        dry = dry_run.asked(request.query)
        if isinstance(dry, ApiError):
            return api_error(dry)
        who = auth.principal(request)
        submission = jobfiles.decode_submission(await request.read(), request.content_type, who.tenant)
        if isinstance(submission, ApiError):
            return api_error(submission)
        body = submission.body
        if not who.may_see(body.tenant):
            return error_response(403, f"this token submits as tenant {who.tenant}, not {body.tenant}", "tenant")
        if dry:  # checked as a submit is, then answered by the queue leader: nothing is stored or published
            answer = await dry_run.answer(self, request, body)
            return api_error(submission.located(answer)) if isinstance(answer, ApiError) else json_response(answer)
        key = request.headers.get("Idempotency-Key")
        if key is not None:
            bad = check_idempotency_key(key)
            if bad is not None:
                return api_error(bad)
            job_id = idempotent_job_id(body.tenant, key, self.deps.names.cell)
            existing = await self.deps.store.get_job(job_id)
            if existing is not None:
                return await self._resubmitted(existing, body)
            if (again := await self._array_resubmitted(job_id, body)) is not None:
                return again
        else:
            job_id = cell_job_id(self.deps.names.cell, uuid.uuid4().hex)  # the id says its cell (a router reads it)
        checked = await self.checked_job(body, job_id)
        if isinstance(checked, ApiError):
            return api_error(submission.located(checked))
        unknown = await arrays.unknown_dependency(body, lambda dep: self._exists(dep, who))
        if unknown is not None:
            return api_error(submission.located(unknown))
        msg = JobSubmitted(job_id=job_id, spec=body, submitted_at=self.now())
        attrs = {"rackscale.job_id": job_id, "rackscale.tenant": body.tenant, "rackscale.gpus": body.gpus}
        # The job's trace starts here (or continues the client's traceparent); the queue keeps it in JobRecord.
        with self.deps.tracer.span("gateway.submit", _trace_parent(request), attrs):
            hdrs = self.deps.tracer.headers()
            await self.deps.bus.publish(self.deps.names.job_submit, msg, msg_id=job_id, headers=hdrs)
        accepted = api.Accepted(id=job_id, state=JobState.PENDING.value)
        return json_response(accepted, 202, headers={"Location": _location(job_id, body)})

    async def _array_resubmitted(self, array_id: str, body: JobBody) -> web.Response | None:
        """A retried array submit (its Idempotency-Key's id names an array): answered as the first was, once its
        tasks are written; None when it names none yet (the submit goes out again: msg-id dedup, and the queue
        writes only what it lacks)."""
        _, recs = await arrays.tasks(self.deps.store, array_id)
        if not recs:
            return None
        if recs[0].spec != body:
            return error_response(422, "Idempotency-Key was already used for a different job", "Idempotency-Key")
        accepted = api.Accepted(id=array_id, state=JobState.PENDING.value)
        return json_response(accepted, 202, headers={"Location": _location(array_id, body)})

    async def _exists(self, job_id: str, who: Principal) -> bool:
        """Whether a job (or an array) of this id exists and `who` may see it."""
        rec = await self._job(job_id)
        if rec is None:
            _, recs = await arrays.tasks(self.deps.store, job_id)
            rec = recs[0] if recs else None
        return rec is not None and who.may_see(rec.spec.tenant)

    async def _visible_tasks(self, request: web.Request, array_id: str) -> tuple[list[str], list[JobRecord]]:
        """The task ids and records of the array named in the path; none when no array has the id or it is
        another tenant's. NotRecordedYet while none of its tasks is written yet."""
        ids, recs = await arrays.tasks(self.deps.store, array_id)
        if ids and not recs:
            raise NotRecordedYet(f"array {array_id} is not recorded yet (the queue is writing its tasks); try again")
        if not recs or not auth.principal(request).may_see(recs[0].spec.tenant):
            return [], []
        return ids, recs

    async def checked_job(self, body: JobBody, job_id: str) -> JobSpec | ApiError:
        """The body's JobSpec checked against the registered topology, or the 422 naming what is wrong."""
        checked = check_job(body, job_id, await self.submit_topology(SUBMIT_TOPOLOGY_MAX_AGE_S))
        if isinstance(checked, ApiError):
            checked = check_job(body, job_id, await self.submit_topology())
        if isinstance(checked, ApiError) and self._widest is not None:
            # nodes Redis lost register again one by one: a fleet that was bigger still takes the job (and
            # what it can't take is said of it)
            checked = check_job(body, job_id, self._widest)
        return checked

    async def _resubmitted(self, rec: JobRecord, body: JobBody) -> web.Response:
        if rec.spec != body:
            # IETF draft-ietf-httpapi-idempotency-key-header: a reused key with another payload is a 422
            return error_response(422, "Idempotency-Key was already used for a different job", "Idempotency-Key")
        view = views.job_view(rec, await self.domain_of())
        return json_response(view, 200, headers={"Location": f"/v1/jobs/{rec.id}"})

    async def _visible_job(self, request: web.Request) -> tuple[str, JobRecord | None]:
        """The job named in the path, or None when it doesn't exist or belongs to a tenant the caller can't see.
        NotRecordedYet when it has no record while the queue has submits still to handle (it may be one)."""
        job_id = request.match_info["id"]
        rec = await self._job(job_id)
        if rec is not None and not auth.principal(request).may_see(rec.spec.tenant):
            rec = None  # 404, not 403: another tenant's ids don't leak
        return job_id, rec

    async def _job(self, job_id: str) -> JobRecord | None:
        """The job's record. A 202 comes before the queue writes it (tens of milliseconds; longer while the
        queue is down), so a miss is only "no such job" once the queue has handled every submit stored: the
        record is read again after asking (a handler writes before it acks, so one acked by then is there)."""
        store = self.deps.store
        rec = await store.get_job(job_id)
        if rec is not None:
            return rec
        if await store.array_task_ids(job_id):
            return None  # an array's id: its tasks are the jobs
        n = self.deps.names
        try:
            info = await self.deps.bus.js.consumer_info(n.stream_for(n.job_submit), n.consumer("queue", "submit"))
            handled = info.num_pending == 0 and info.num_ack_pending == 0
        except nats.js.errors.NotFoundError:
            handled = True  # no queue ever ran: nothing is recorded until one does, and nothing can be told
        rec = await store.get_job(job_id)
        if rec is None and not handled:
            raise NotRecordedYet(f"job {job_id} is not recorded yet (the queue has submits to handle); try again")
        return rec

    async def get_job(self, request: web.Request) -> web.Response:
        job_id, rec = await self._visible_job(request)
        if rec is None:
            ids, _ = await self._visible_tasks(request, job_id)
            return error_response(404, arrays.not_a_job(job_id, ids) if ids else f"unknown job {job_id}")
        return json_response(views.job_view(rec, await self.domain_of()))

    async def logs(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/jobs/{id}/logs: what the job's processes wrote (an attempt's; default the latest), as text.
        `rank` one process's alone (else each line starts with "<rank>: "), `tail` the last N lines, `since` lines
        shipped from that Unix time on. `follow` answers server-sent events instead (`line`s as they ship, then
        `end` once the job has ended), ids the log's positions: a reconnect with `Last-Event-ID` goes on after
        it. Another tenant's job answers 404."""
        job_id, rec = await self._visible_job(request)
        if rec is None:
            return error_response(404, f"unknown job {job_id}")
        parsed = _log_query(request.query, request.headers, rec.attempt)
        if isinstance(parsed, web.Response):
            return parsed
        names = self.deps.names
        subject = names.job_logs(job_id, parsed.attempt, "*" if parsed.rank is None else parsed.rank)
        stream = names.stream_for(names.logs_all)
        reader = LogReader(resumed=parsed.after is not None)
        chunks: list[tuple[int, list[api.LogLine]]] = []  # (stream position, its lines)
        last_seq = parsed.after or 0
        if parsed.after is None:  # a resumed follower has read what came before
            async for entry in read_log(self.deps.bus.js, stream, subject):
                last_seq = entry.seq
                chunk = _chunk(entry.data)
                if chunk is not None and chunk.at >= parsed.since:
                    chunks.append((entry.seq, reader.add(chunk)))
        if parsed.tail is not None:
            chunks = _tail(chunks, parsed.tail)
        if not parsed.follow:
            prefix = parsed.rank is None
            text = "".join(as_text(line, prefix=prefix) for _, lines in chunks for line in lines)
            return web.Response(text=text, content_type="text/plain", charset="utf-8")
        backlog = b"".join(_line_frames(seq, lines) for seq, lines in chunks)
        return await self._follow_logs(request, backlog, job_id, stream, subject, last_seq, reader)

    async def _follow_logs(
        self,
        request: web.Request,
        backlog: bytes,
        job_id: str,
        stream: str,
        subject: str,
        after: int,
        reader: LogReader,
    ) -> web.StreamResponse:
        """`backlog`, then lines as they ship (pushed: no poll between a line shipping and its event), until the job
        has ended and follow_end_s passed without a line (its last lines ship before its end is told), or the
        gateway stops. Subscribed before the answer starts: a bus that refuses still gets a 503."""
        out = _Stream()

        async def on_msg(m: Msg) -> None:
            chunk = _chunk(m.data)
            lines = reader.add(chunk) if chunk is not None else []
            if lines:
                out.push(_line_frames(m.metadata.sequence.stream, lines))

        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
        sub = await self.deps.bus.js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True, config=config)
        self._streams.add(out)
        clock = self.deps.clock
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            await resp.write(sse.CONNECTED + backlog)
            quiet_since: float | None = None
            idle = 0.0
            while True:
                try:
                    frame = await asyncio.wait_for(out.queue.get(), self.follow_poll_s)
                except TimeoutError:
                    frame = b""
                if frame is None:
                    return resp  # the gateway is stopping, or the client fell too far behind (it reconnects)
                if frame:
                    await resp.write(frame)
                    quiet_since, idle = None, 0.0
                    continue
                idle += self.follow_poll_s
                if idle >= self.keepalive_s:
                    await resp.write(sse.KEEP_ALIVE)
                    idle = 0.0
                rec = await self.deps.store.get_job(job_id)
                if rec is None or rec.state in TERMINAL:
                    quiet_since = quiet_since if quiet_since is not None else clock()
                    if clock() - quiet_since >= self.follow_end_s:
                        end = api.LogEnd(state=rec.state if rec else JobState.FAILED, end=rec.end if rec else "")
                        await resp.write(sse.frame("end", _json.encode(end)))
                        return resp
        except ConnectionResetError:
            return resp  # the client went away
        finally:
            self._streams.discard(out)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def list_jobs(self, request: web.Request) -> web.Response:
        q = request.query
        state: JobState | None = None
        if "state" in q:
            try:
                state = JobState(q["state"])
            except ValueError:
                allowed = ", ".join(s.value for s in JobState)
                return error_response(422, f"state: must be one of {allowed}", "state")
        scope = _listing(request, lambda page: api.JobList(jobs=[], total=0, **page))
        if isinstance(scope, web.Response):
            return scope
        page, tenant = scope
        await self.deps.store.require_view()  # a partial list would hide jobs that exist
        array = q.get("array") or None  # an array's tasks, in index order
        recs, total = await self.deps.store.list_jobs(tenant=tenant, state=state, array=array, **page)
        domain_of = await self.domain_of()
        jobs = [views.job_view(r, domain_of) for r in recs]
        return json_response(api.JobList(jobs=jobs, total=total, **page))

    async def list_migrations(self, request: web.Request) -> web.Response:
        """GET /v1/migrations: moves, newest first; users see only their tenant's."""
        scope = _listing(request, lambda page: api.MigrationList(migrations=[], total=0, **page))
        if isinstance(scope, web.Response):
            return scope
        page, tenant = scope
        job = request.query.get("job") or None
        recs, total = await self.deps.store.list_migrations(tenant=tenant, job_id=job, **page)
        domain_of = await self.domain_of()
        moves = [views.migration_view(r, domain_of) for r in recs]
        return json_response(api.MigrationList(migrations=moves, total=total, **page))

    async def cancel(self, request: web.Request) -> web.Response:
        # A job the queue hasn't recorded yet answers 503 (NotRecordedYet): its cancel comes once it is.
        job_id, rec = await self._visible_job(request)
        if rec is None:
            # an array's id: every task of it not ended (the queue cancels each; a task not yet written, once it is)
            ids, recs = await self._visible_tasks(request, job_id)
            if not ids:
                return error_response(404, f"unknown job {job_id}")
            if len(recs) == len(ids) and all(r.state in TERMINAL for r in recs):
                return error_response(409, f"every task of array {job_id} has ended", "state")
            rec = recs[0]
        elif rec.state in TERMINAL:
            return error_response(409, f"job {job_id} already {rec.state.value}", "state")
        msg = JobCancel(job_id=job_id, at=self.now())
        parent = {"traceparent": rec.trace} if rec.trace else _trace_parent(request)
        with self.deps.tracer.span("gateway.cancel", parent, {"rackscale.job_id": job_id}):
            hdrs = self.deps.tracer.headers()
            await self.deps.bus.publish(self.deps.names.job_cancel, msg, msg_id=f"{job_id}:cancel", headers=hdrs)
        return json_response(api.Accepted(id=job_id, state="cancelling"), 202)

    async def usage(self, request: web.Request) -> web.Response:
        """GET /v1/usage: GPU-hours per tenant and period (services/gateway/usage.py). A user's answer is of its own
        tenant; asking for another's gives no rows (an empty listing, not a 403 that would confirm it exists)."""
        now = self.now()
        query = usage.usage_query(request.query, request.headers.get("Accept", ""), now)
        if isinstance(query, ApiError):
            return api_error(query)
        who = auth.principal(request)
        if not who.admin and query.tenant is None:
            query = dataclasses.replace(query, tenant=who.tenant)
        if who.may_see(query.tenant or ""):
            snap = await UsageStore(self.deps.store.r, self.deps.names).snapshot(query.start, query.end)
            if snap.status is None or snap.status.state != READY:
                resp = error_response(503, "the usage view is being built from the job log; try again shortly")
                resp.headers["Retry-After"] = str(VIEW_RETRY_AFTER_S)
                return resp
            view = usage.usage_view(query, snap, now)
        else:
            view = usage.usage_view(query, usage.NOTHING, now)
        if query.csv:
            return web.Response(text=usage_csv(view), content_type=CSV_TYPE)
        return json_response(view)

    # -- cluster and nodes -----------------------------------------------------------------------------
    async def cluster(self, request: web.Request) -> web.Response:
        store = self.deps.store
        await store.require_view()  # who holds which GPU is unknown until it is rebuilt
        gen = await store.topology_generation()
        (nodes, heard), allocs = await asyncio.gather(self._cluster_nodes(gen), self._cluster_allocations())
        view = self.cluster_views.build(nodes, allocs, gen, heard)
        who = auth.principal(request)
        if not who.admin:
            recs = await store.get_jobs([a.job_id for a in allocs])
            view = views.redact_cluster(view, {r.id for r in recs if r.spec.tenant == who.tenant})
        return json_response(view)

    async def cluster_summary(self, request: web.Request) -> web.Response:
        """GET /v1/cluster/summary: the cell's capacity in figures (services/gateway/summary.py), what a router over
        several cells places jobs by. Counts only, nothing named: any token reads it."""
        store = self.deps.store
        await store.require_view()
        gen = await store.topology_generation()
        kept = self._cluster_records
        nodes = kept[1] if kept is not None and kept[0] == gen else (await self._cluster_nodes(gen))[0]
        allocs, active = await asyncio.gather(self._cluster_allocations(), store.active_job_count())
        return json_response(summary.cell_summary(self.deps.names.cell, nodes, allocs, gen, active))

    async def follow_allocations(self, _app: web.Application | None = None) -> None:
        """Hear placement's commits and releases (core NATS), so `/v1/cluster` needs no read of every allocation;
        a break in the link may have lost some: the next request reads them all."""

        async def on_msg(m: Msg) -> None:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                ev = EVENTS.decode(m.data)
                if isinstance(ev, Committed):
                    self.held.committed(ev)
                elif isinstance(ev, Released):
                    self.held.released(ev)

        self.deps.bus.on_link(lambda _up: setattr(self.held, "complete", False))
        self._held_sub = await self.deps.bus.nc.subscribe(self.deps.names.placement_events, cb=on_msg)

    async def unfollow_allocations(self, _app: web.Application | None = None) -> None:
        if self._held_sub is not None:
            with contextlib.suppress(Exception):
                await self._held_sub.unsubscribe()

    async def _cluster_allocations(self) -> list[AllocationRecord]:
        """Every allocation: from placement's events, read whole when the view is older than ALLOCATIONS_READ_S
        (an event lost to a slow subscriber shows until then) or incomplete."""
        now = time.monotonic()
        stale = self._held_read_at is None or now - self._held_read_at > ALLOCATIONS_READ_S
        if self._held_sub is None or not self.held.complete or stale:
            since = self.held.mark()
            self.held.replace(await self.deps.store.allocations(), since)
            self._held_read_at = now
        return list(self.held.by_job().values())

    async def _cluster_nodes(self, gen: int) -> tuple[list[NodeRecord], Mapping[str, float] | None]:
        """The node records, read again only when `topo:gen` moved (every write that changes what a record shows
        moves it; heartbeats don't), and then the liveness zset alone for the heartbeats (None: the records
        were just read, their liveness with them). 5,004 records were a third of the request at 278 domains."""
        kept = self._cluster_records
        if kept is not None and kept[0] == gen:
            return kept[1], await self.deps.store.last_heard()
        records = await self.deps.store.nodes()  # read after the generation: at worst read again next time
        self._cluster_records = (gen, records)
        return records, None

    async def drain(self, request: web.Request) -> web.Response:
        return await self._admin(request, "drain")

    async def undrain(self, request: web.Request) -> web.Response:
        return await self._admin(request, "undrain")

    async def clear_health(self, request: web.Request) -> web.Response:
        """Lift the health rules' verdicts on the node's GPUs, latched fatal XIDs too (shared/health.py)."""
        return await self._admin(request, "clear_health")

    async def _admin(self, request: web.Request, action: Literal["drain", "undrain", "clear_health"]) -> web.Response:
        node = request.match_info["id"]
        if not auth.principal(request).admin:
            return error_response(403, f"only an admin token may {action} nodes")
        data = await request.read()
        body: api.DrainBody | ApiError = api.DrainBody()
        if data.strip():
            body = decode_json(data, DRAIN_BODY)
        if isinstance(body, ApiError):
            return api_error(body)
        ask = NodeAdmin(node=node, action=action, reason=body.reason)
        try:
            raw = await self.deps.bus.request(self.deps.names.node_admin, ask, timeout=self.admin_timeout_s)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return error_response(503, "inventory did not answer; try again")
        try:
            reply = ADMIN_REPLY.decode(raw)
        except msgspec.DecodeError:
            log.error("unreadable AdminReply for %s %s: %r", action, node, raw[:200])
            return error_response(503, "inventory sent an unreadable reply")
        if reply.ok:
            return json_response(api.NodeAdminResult(node=node, state=reply.state))
        # Contract with inventory (issue #3): an unknown node is reported as "unknown node X".
        if reply.error.startswith("unknown node"):
            return error_response(404, reply.error)
        return error_response(409, reply.error or f"inventory refused to {action} {node}")

    # -- events ----------------------------------------------------------------------------------------
    async def events(self, request: web.Request) -> web.StreamResponse:
        """SSE of JobEvent and NodeChanged, from plain core subscriptions (nothing durable per client)."""
        stream = _Stream()
        who: Principal = auth.principal(request)

        async def on_msg(m: Msg) -> None:
            try:
                ev = EVENTS.decode(m.data)
            except msgspec.DecodeError:
                return  # not ours to dead-letter: the durable consumers of these subjects do that
            if isinstance(ev, JobEvent) and not who.may_see(ev.tenant):
                stream.cluster_changed()
                return
            kind = "job" if isinstance(ev, JobEvent) else "node" if isinstance(ev, NodeChanged) else None
            if kind is not None:
                stream.push(sse.frame(kind, _json.encode(ev)))

        nc = self.deps.bus.nc
        names = self.deps.names
        subs = [await nc.subscribe(s, cb=on_msg) for s in (names.job_events_all, names.node_events)]
        self._streams.add(stream)
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await nc.flush()  # the server knows the subscriptions before the client hears "connected"
            await resp.prepare(request)
            await resp.write(sse.CONNECTED)
            while True:
                try:
                    frame = await asyncio.wait_for(stream.queue.get(), self.keepalive_s)
                except TimeoutError:
                    frame = sse.KEEP_ALIVE
                if frame is None:
                    break
                if frame is CLUSTER_CHANGED:
                    stream.cluster_queued = False
                await resp.write(frame)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            self._streams.discard(stream)
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        return resp

    async def close_streams(self, _app: web.Application | None = None) -> None:
        for stream in list(self._streams):
            stream.close()

    # -- meta ------------------------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return json_response(api.Health(status="ok"))

    async def readyz(self, request: web.Request) -> web.Response:
        nats_ok = self.deps.bus.nc.is_connected
        try:
            redis_ok = bool(await asyncio.wait_for(self.deps.store.r.ping(), 1.0))
        except Exception:
            redis_ok = False
        view_ok = False
        if redis_ok:
            with contextlib.suppress(Exception):
                view_ok = await self.deps.store.view_ready()
        ok = nats_ok and redis_ok and view_ok
        return json_response(
            api.Health(status="ok" if ok else "unavailable", nats=nats_ok, redis=redis_ok, view=view_ok),
            200 if ok else 503,
        )

    async def metrics(self, request: web.Request) -> web.Response:
        """The shell's metrics of this process and the cluster's figures from Redis (Prometheus text)."""
        if not auth.principal(request).admin:
            return error_response(403, "metrics span every tenant: an admin token reads them")
        assert self.deps.metrics is not None
        return metrics_response(self.deps.metrics.render() + await cluster_metrics(self.deps))


def routes(gw: Gateway, spec: bytes) -> list[tuple[str, str, Handler]]:
    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=spec, content_type="application/json")

    job_schema = msgspec.json.encode(schema.job_schema())

    async def job_schema_json(request: web.Request) -> web.Response:
        return web.Response(body=job_schema, content_type="application/schema+json")

    return [
        *dashboard.routes(gw.deps.settings.jaeger_ui_url),
        ("POST", "/v1/jobs", gw.submit),
        ("GET", "/v1/jobs", gw.list_jobs),
        ("GET", "/v1/jobs/{id}", gw.get_job),
        ("DELETE", "/v1/jobs/{id}", gw.cancel),
        ("GET", "/v1/cluster", gw.cluster),
        ("GET", "/v1/cluster/summary", gw.cluster_summary),
        ("GET", "/v1/migrations", gw.list_migrations),
        ("GET", "/v1/usage", gw.usage),
        ("POST", "/v1/nodes/{id}/drain", gw.drain),
        ("POST", "/v1/nodes/{id}/undrain", gw.undrain),
        ("POST", "/v1/nodes/{id}/clear-health", gw.clear_health),
        ("GET", "/v1/events", gw.events),
        ("GET", "/v1/jobs/{id}/logs", gw.logs),
        ("GET", "/openapi.json", openapi_json),
        ("GET", jobfiles.SCHEMA_PATH, job_schema_json),
        ("GET", "/healthz", gw.healthz),
        ("GET", "/readyz", gw.readyz),
        ("GET", "/metrics", gw.metrics),
    ]


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error answer is an ErrorBody; a lost backend is a 503, never a stack trace."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        resp = error_response(e.status, e.reason)
        if "Allow" in e.headers:
            resp.headers["Allow"] = e.headers["Allow"]
        return resp
    except NotRecordedYet as e:
        resp = error_response(503, str(e))
        resp.headers["Retry-After"] = str(VIEW_RETRY_AFTER_S)
        return resp
    except ViewNotReady:
        # Redis came back empty or behind and the view is rebuilt from the log: a job it lacks may exist
        resp = error_response(503, "the scheduler's view is being rebuilt from its log; try again shortly")
        resp.headers["Retry-After"] = str(VIEW_RETRY_AFTER_S)
        return resp
    except (*UNAVAILABLE, nats.errors.Error, TimeoutError) as e:
        log.warning("%s %s: backend unavailable: %r", request.method, request.path, e)
        return error_response(503, "a backend (NATS or Redis) is unavailable; try again")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal error")


GATEWAY = web.AppKey("gateway", Gateway)


def _chunk(data: bytes) -> LogChunk | None:
    try:
        return LOG_CHUNK.decode(data)
    except msgspec.DecodeError:
        return None  # not a chunk: nothing a reader can show


class LogQuery(msgspec.Struct, frozen=True, kw_only=True):
    rank: int | None  # one process's lines, else every process's
    tail: int | None  # the last N lines
    since: float  # lines shipped from this Unix time on
    attempt: int
    follow: bool  # server-sent events, as lines ship
    after: int | None  # a reconnecting follower's Last-Event-ID: go on after this position of the log


_BOOLEAN = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _log_query(q: Any, headers: Mapping[str, str], latest: int) -> LogQuery | web.Response:
    """What a logs request asks for, or the 422 naming the bad parameter."""
    try:
        rank = _query_number(q, "rank", int, None, 0)
        tail = _query_number(q, "tail", int, None, 0)
        since = _query_number(q, "since", float, 0.0, 0.0) or 0.0
        attempt = _query_number(q, "attempt", int, latest, 1) or latest
        after = _query_number(headers, LAST_EVENT_ID, int, None, 0, MAX_SEQ)
    except _BadQuery as e:
        return e.response
    follow = _BOOLEAN.get(q.get("follow", "false").lower())
    if follow is None:
        return error_response(422, f"follow: must be true or false, got {q['follow']!r}", "follow")
    return LogQuery(
        rank=None if rank is None else int(rank),
        tail=None if tail is None else int(tail),
        since=since,
        attempt=int(attempt),
        follow=follow,
        after=None if after is None or not follow else int(after),
    )


def _tail(chunks: list[tuple[int, list[api.LogLine]]], n: int) -> list[tuple[int, list[api.LogLine]]]:
    """The last n lines, still grouped by the chunk they came in."""
    kept: list[tuple[int, list[api.LogLine]]] = []
    for seq, lines in reversed(chunks):
        if n <= 0:
            break
        kept.append((seq, lines[-n:]))
        n -= len(lines)
    return kept[::-1]


def _line_frames(seq: int, lines: list[api.LogLine]) -> bytes:
    """A chunk's lines as `line` events; the last carries the chunk's position in the log as its id (a follower
    that reconnects after it has every line of that chunk)."""
    last = len(lines) - 1
    return b"".join(sse.frame("line", _json.encode(line), seq if i == last else None) for i, line in enumerate(lines))


def _page(q: Any) -> tuple[dict[str, int], web.Response | None]:
    """offset and limit of a list request, or the 422 naming the bad one."""
    try:
        offset = _query_number(q, "offset", int, 0, 0) or 0
        limit = _query_number(q, "limit", int, DEFAULT_PAGE, 1, MAX_PAGE) or DEFAULT_PAGE
    except _BadQuery as e:
        return {}, e.response
    return {"offset": int(offset), "limit": int(limit)}, None


class _BadQuery(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


def _query_number(
    q: Any, name: str, parse: type[int] | type[float], default: float | None, low: float, high: float | None = None
) -> float | None:
    """A number parameter of the query (`default` when absent); _BadQuery with the 422 naming it when it isn't
    one of `parse`'s kind or lies outside low..high."""
    if name not in q:
        return default
    try:
        value = parse(q[name])
    except ValueError:
        kind = "a whole number" if parse is int else "a number"
        raise _BadQuery(error_response(422, f"{name}: must be {kind}, got {q[name]!r}", name)) from None
    if not value >= low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _BadQuery(error_response(422, f"{name}: must be {bound}, got {value}", name))
    return value


def _listing(
    request: web.Request, nothing: Callable[[dict[str, int]], msgspec.Struct]
) -> tuple[dict[str, int], str | None] | web.Response:
    """A list request's page and tenant filter, or the answer to give at once: the 422 naming a bad page
    bound, or `nothing(page)` when a user asks for another tenant's (an empty page, not a 403 that would
    confirm the tenant exists). A user's listing is always of its own tenant."""
    page, bad = _page(request.query)
    if bad is not None:
        return bad
    tenant = request.query.get("tenant") or None
    who = auth.principal(request)
    if who.admin:
        return page, tenant
    if tenant is not None and tenant != who.tenant:
        return json_response(nothing(page))
    return page, who.tenant


def load_tokens(deps: Deps) -> Tokens | None:
    """The tokens of RACKSCALE_TOKENS_FILE; None (open mode) when it is unset."""
    path = deps.settings.tokens_file
    if not path:
        log.warning("no RACKSCALE_TOKENS_FILE: the API is open to anyone who can reach it (local use only)")
        return None
    tokens = Tokens.load(path)
    log.info("gateway: %d bearer tokens from %s", len(tokens), path)
    return tokens


_FROM_SETTINGS: Any = object()


def build_app(
    deps: Deps,
    *,
    keepalive_s: float = 15.0,
    admin_timeout_s: float = 2.0,
    tokens: Tokens | None = _FROM_SETTINGS,
    follow_poll_s: float = FOLLOW_POLL_S,
) -> web.Application:
    """The application; `tokens` default: from settings (None: open mode)."""
    gw = Gateway(deps, keepalive_s=keepalive_s, admin_timeout_s=admin_timeout_s, follow_poll_s=follow_poll_s)
    if tokens is _FROM_SETTINGS:
        tokens = load_tokens(deps)
    # errors_as_json outermost: whatever the auth layer or a handler raises still answers an ErrorBody
    app = web.Application(middlewares=[errors_as_json, auth.middleware(tokens)], client_max_size=MAX_BODY)
    app[GATEWAY] = gw
    spec = msgspec.json.encode(openapi.document())
    for method, path, handler in routes(gw, spec):
        app.router.add_route(method, path, handler)
    app.on_startup.append(gw.follow_allocations)
    app.on_shutdown.append(gw.close_streams)
    app.on_shutdown.append(gw.unfollow_allocations)
    return app


class GatewayService(Service):
    name = "gateway"

    def __init__(self, deps: Deps, *, keepalive_s: float = 15.0) -> None:
        super().__init__(deps)
        self.app = build_app(deps, keepalive_s=keepalive_s)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None  # bound port (settings.gateway_port may be 0)

    async def start(self) -> None:
        s = self.deps.settings
        self._runner = web.AppRunner(self.app, handle_signals=False, access_log=log, access_log_class=auth.AccessLog)
        await self._runner.setup()
        site = web.TCPSite(self._runner, s.gateway_host, s.gateway_port)
        await site.start()
        addresses = self._runner.addresses
        self.port = addresses[0][1] if addresses else None
        log.info("gateway listening on %s:%s", s.gateway_host, self.port)

    async def extra_metrics(self) -> bytes:
        return await cluster_metrics(self.deps)

    async def on_stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()  # runs on_shutdown: open SSE streams end
            self._runner = None
