"""The router: one HTTP front door over several scheduling cells, each a whole Rackscale with its own gateway.

It holds no NATS or Redis connection: everything it answers comes from the cells' gateways, asked over HTTP with
the caller's own Authorization (the cells check tokens).

- `POST /v1/jobs` goes to the tenant's home cell, else to the cell with the most free GPUs that takes the job's
  shape (services/router/routing.py); the gateway there mints an id that names its cell (`c1-<32 hex>`; the
  default cell's ids are plain hex, shared.names.job_cell).
- `/v1/jobs/{id}` (GET, DELETE) and its logs (also followed) go to the cell the id names.
- `GET /v1/jobs` and `/v1/migrations` ask every cell and merge the pages; `/v1/events` merges every cell's stream.
  `?cell=` keeps any of them to one cell.
- `/v1/cluster`, `/v1/cluster/summary`, `/metrics` and the node admin POSTs go to `?cell=` (default: the first
  cell; the node POSTs need it when there are several, node names repeat across cells); `GET /v1/cells` is one
  summary row per cell.
- An unreachable cell is a 503 naming it for a request that must go there; a list or a merged stream goes on
  without it and names it in `X-Rackscale-Cells-Missing`; no cell answering at all is a 503.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec
from aiohttp import web

from services.router import openapi
from services.router.routing import (
    BadCell,
    Cells,
    UnknownJob,
    cell_of_job,
    job_order,
    largest,
    merge_page,
    migration_order,
    named_cell,
    refusal,
    submit_order,
)
from services.router.upstream import (
    CELL_HEADER,
    MISSING_HEADER,
    Answer,
    CellUnavailable,
    Upstream,
    passed_back,
    passed_on,
)
from shared import sse
from shared.api import (
    DEFAULT_PAGE,
    IDEMPOTENCY_KEY,
    MAX_PAGE,
    CellList,
    CellStatus,
    CellSummary,
    ErrorBody,
    RouterHealth,
    UsageView,
)
from shared.jobfile import (
    SCRIPT_TYPES,
    YAML_TYPES,
    JobFileError,
    load_script_text,
    load_yaml_text,
    parse_script,
    parse_yaml,
)
from shared.names import idempotent_job_id
from shared.runtime import setup_logging
from shared.schemas import JOB_BODY_JSON, JobBody
from shared.settings import Settings, SettingsError
from shared.tenants import TenantsError, load_home_cells
from shared.usage_report import CSV_TYPE, merge_usage, usage_csv, wants_csv

log = logging.getLogger("rackscale.router")

MAX_BODY = 1 << 20  # as the gateways'
SUMMARY_MAX_AGE_S = 1.0  # a submission is placed by the cells' summaries up to this old
HEALTH_S = 2.0  # a cell whose /healthz takes longer doesn't answer
KEEPALIVE_S = 15.0
RETRY_AFTER_S = 1
SSE_HEADERS = {"Content-Type": sse.MEDIA_TYPE, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_QUEUE = 1024  # frames buffered for a merged stream's client
DASHBOARD = ("/", "/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css")  # static: from any cell
STREAMED = (sse.MEDIA_TYPE, "text/plain")  # answers piped through as they come (events, logs), not read whole

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_json = msgspec.json.Encoder()
_ERROR = msgspec.json.Decoder(ErrorBody)
_SUMMARY = msgspec.json.Decoder(CellSummary)


class NoCell(Exception):
    """No cell answered: the message names each and why."""

    def __init__(self, why: Mapping[str, str]) -> None:
        listed = "; ".join(f"{cell}: {reason}" for cell, reason in why.items()) or "none configured"
        super().__init__(f"no cell answered ({listed})")


def json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_json.encode(obj), status=status, content_type="application/json", headers=headers)


def error_response(
    status: int, error: str, field: str | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    return json_response(ErrorBody(error=error, field=field), status, headers)


def answered(a: Answer) -> web.Response:
    """A cell's answer, as it gave it (its cell named in CELL_HEADER)."""
    return web.Response(status=a.status, body=a.body, headers=a.headers)


def error_of(a: Answer) -> ErrorBody:
    try:
        return _ERROR.decode(a.body)
    except msgspec.DecodeError:
        return ErrorBody(error=f"answered {a.status}")


# a script that names no --account is its caller's token's tenant, which the router can't see: no home cell is known
UNNAMED_TENANT = "rackscale-router-unnamed"


def _job(body: bytes, content_type: str) -> JobBody | None:
    """The job body, read as a gateway reads it — JSON, YAML or an sbatch script (shared/jobfile) — for what routing
    needs (its tenant and size); None when it isn't one (a cell then says what is wrong with it)."""
    try:
        if content_type in YAML_TYPES:
            return msgspec.convert(parse_yaml(load_yaml_text(body)).body, JobBody)
        if content_type in SCRIPT_TYPES:
            script = parse_script(load_script_text(body), defaults={"tenant": UNNAMED_TENANT})
            return msgspec.convert(script.body, JobBody)
        return JOB_BODY_JSON.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, JobFileError):
        return None


def _gathered(names: Sequence[str], results: Sequence[Any]) -> tuple[list[Any], dict[str, str], Answer | None]:
    """One fan-out's results, cell by cell: the values of the cells that answered, the cells that couldn't (why: an
    outage, or their 503), and the first other refusal (a 401, a bad parameter's 422), which goes back as it is."""
    values: list[Any] = []
    missing: dict[str, str] = {}
    for cell, r in zip(names, results, strict=True):
        if isinstance(r, CellUnavailable):
            missing[cell] = r.reason
        elif isinstance(r, BaseException):
            raise r
        elif isinstance(r, Answer) and r.status == 503:
            missing[cell] = error_of(r).error
        elif isinstance(r, Answer) and r.status != 200:
            return values, missing, r
        else:
            values.append(r)
    return values, missing, None


def _page(q: Mapping[str, str]) -> tuple[int, int] | None:
    """(offset, limit) of a list request; None when either is no whole number in bounds (a cell says why)."""
    try:
        offset, limit = int(q.get("offset", 0)), int(q.get("limit", DEFAULT_PAGE))
    except ValueError:
        return None
    return (offset, limit) if offset >= 0 and 1 <= limit <= MAX_PAGE else None


def _without(query: Iterable[tuple[str, str]], *names: str) -> list[tuple[str, str]]:
    return [(k, v) for k, v in query if k not in names]


def _streams(request: web.Request) -> bool:
    """Whether the answer is a stream with no end in sight (events, a followed log): no time limit on it."""
    return request.path == "/v1/events" or request.query.get("follow", "").lower() in ("true", "1", "yes")


class Router:
    """Request handlers over the cells' gateways."""

    def __init__(
        self,
        cells: Cells,
        *,
        clock: Callable[[], float] = time.monotonic,
        summary_max_age_s: float = SUMMARY_MAX_AGE_S,
        keepalive_s: float = KEEPALIVE_S,
        upstream: Upstream | None = None,
    ) -> None:
        self.cells = cells
        self.clock = clock
        self.summary_max_age_s = summary_max_age_s
        self.keepalive_s = keepalive_s
        self.upstream = upstream or Upstream(cells)
        # cell → (when asked, its summary or why there is none): what submissions are placed by
        self._summaries: dict[str, tuple[float, CellSummary | str]] = {}

    async def start(self, _app: web.Application | None = None) -> None:
        await self.upstream.start()

    async def close_streams(self, _app: web.Application | None = None) -> None:
        self.upstream.close_streams()

    async def close(self, _app: web.Application | None = None) -> None:
        await self.upstream.close()

    # -- forwarding ------------------------------------------------------------------------------------
    async def forward(self, request: web.Request, cell: str) -> web.StreamResponse:
        """The request to `cell` as it came (but for `cell=`), and its answer back; events and logs as they come."""
        body = await request.read() if request.body_exists else None  # read once, kept: a retry resends it
        resp = await self.upstream.open(
            cell,
            request.method,
            request.rel_url.raw_path,
            query=_without(request.query.items(), "cell"),
            headers=passed_on(request.headers),
            body=body,
            stream=_streams(request),
        )
        try:
            if resp.content_type in STREAMED:
                return await self._pipe(request, cell, resp)
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise CellUnavailable(cell, str(e) or type(e).__name__, sent=True) from None
        finally:
            self.upstream.done(resp)
        return web.Response(status=resp.status, body=data, headers=passed_back(resp.headers, cell))

    async def _pipe(self, request: web.Request, cell: str, resp: aiohttp.ClientResponse) -> web.StreamResponse:
        out = web.StreamResponse(status=resp.status, headers=passed_back(resp.headers, cell))
        await out.prepare(request)
        try:
            async for chunk in resp.content.iter_any():
                await out.write(chunk)
        except (aiohttp.ClientError, TimeoutError) as e:
            # the cell broke off (or the router stops): so does this answer; a follower reconnects
            log.info("%s %s: cell %s's stream ended: %r", request.method, request.path, cell, e)
        except ConnectionResetError:
            pass  # the client went away
        return out

    async def any_cell(self, request: web.Request) -> web.StreamResponse:
        """What every cell answers alike (the dashboard's files, a bad request's error): the first that answers."""
        why: dict[str, str] = {}
        for cell in self.cells.names:
            try:
                return await self.forward(request, cell)
            except CellUnavailable as e:
                why[cell] = e.reason
        raise NoCell(why)

    async def in_cell(self, request: web.Request) -> web.StreamResponse:
        """`?cell=` (default: the first cell): /v1/cluster, /v1/cluster/summary, /metrics."""
        return await self.forward(request, named_cell(self.cells, request.query.get("cell")))

    async def node_admin(self, request: web.Request) -> web.StreamResponse:
        """Node names repeat across cells: with several, `?cell=` must say which one's node."""
        return await self.forward(request, named_cell(self.cells, request.query.get("cell"), required=True))

    async def by_job(self, request: web.Request) -> web.StreamResponse:
        """A job's read, cancel or logs: to the cell its id names."""
        return await self.forward(request, cell_of_job(self.cells, request.match_info["id"]))

    # -- submissions -----------------------------------------------------------------------------------
    async def submit(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        job = _job(body, request.content_type)
        key = request.headers.get("Idempotency-Key")
        if job is None or (key is not None and not re.match(IDEMPOTENCY_KEY, key)):
            return await self.any_cell(request)  # not a job, or a bad key: a cell says what is wrong with it
        headers = passed_on(request.headers)
        query = list(request.query.items())
        home = self.cells.homes.get(job.tenant)
        if home is not None:
            return answered(await self._submit_to(home, body, headers, query))
        if key is not None:
            earlier = await self._earlier_submit(job.tenant, key, headers)
            if isinstance(earlier, web.Response):
                return earlier
            if earlier is not None:
                return answered(await self._submit_to(earlier, body, headers, query))
        got = await self._routing_summaries(headers)
        if isinstance(got, Answer):
            return answered(got)  # the caller's token is refused: no cell would take the job
        summaries, why = got
        refused: dict[str, Answer] = {}
        for cell in submit_order(self.cells, job.tenant, summaries):
            try:
                answer = await self._submit_to(cell, body, headers, query)
            except CellUnavailable as e:
                if e.sent:
                    raise
                why[cell] = e.reason  # nothing reached it: the next cell may take the job
                self._summaries[cell] = (self.clock(), e.reason)
                continue
            if answer.status == 422:
                refused[cell] = answer  # the job's shape doesn't fit this cell: the next may take it
                continue
            if answer.status == 202:
                self._took(cell, job.gpus)
            return answered(answer)
        if refused:
            cell = largest(refused, summaries)
            err = error_of(refused[cell])
            return error_response(422, refusal(cell, summaries.get(cell), err.error), err.field, {CELL_HEADER: cell})
        raise NoCell(why)

    async def _submit_to(
        self, cell: str, body: bytes, headers: Mapping[str, str], query: Iterable[tuple[str, str]]
    ) -> Answer:
        """`query`: the caller's (`dry_run`: the cell answers where the job would go and takes nothing)."""
        try:
            return await self.upstream.call(cell, "POST", "/v1/jobs", query=query, headers=headers, body=body)
        except CellUnavailable as e:
            if not e.sent:
                raise
            raise CellUnavailable(
                cell,
                f"{e.reason}, while it was taking the job: it may have accepted it (list your jobs before submitting "
                "again, or submit with an Idempotency-Key)",
                sent=True,
            ) from None

    def _took(self, cell: str, gpus: int) -> None:
        """Count a job just sent to `cell` against its free GPUs until its next summary, so a burst within one
        summary's age spreads over the cells instead of all going to the one that was emptiest."""
        hit = self._summaries.get(cell)
        if hit is not None and isinstance(hit[1], CellSummary):
            s = hit[1]
            self._summaries[cell] = (hit[0], msgspec.structs.replace(s, free=max(0, s.free - gpus)))

    async def _earlier_submit(self, tenant: str, key: str, headers: Mapping[str, str]) -> str | web.Response | None:
        """The cell holding an earlier submit with this Idempotency-Key (its id in each cell is known: shared.names
        .idempotent_job_id), None when no cell does; a 503 when a cell can't tell, so a retry is never sent to a
        second cell while the first may hold it."""
        reads = {h: v for h, v in headers.items() if h in ("Authorization", "traceparent", "tracestate")}
        answers = await asyncio.gather(
            *(
                self.upstream.call(c, "GET", f"/v1/jobs/{quote(idempotent_job_id(tenant, key, c))}", headers=reads)
                for c in self.cells.names
            ),
            return_exceptions=True,
        )
        unsure: list[str] = []
        for cell, a in zip(self.cells.names, answers, strict=True):
            if isinstance(a, CellUnavailable):
                unsure.append(f"{cell} ({a.reason})")
            elif isinstance(a, BaseException):
                raise a
            elif a.status == 200:
                return cell
            elif a.status in (401, 403):
                return answered(a)
            elif a.status != 404:
                unsure.append(f"{cell} ({a.status}: {error_of(a).error})")
        if unsure:
            return error_response(
                503,
                "can't tell whether an earlier submit with this Idempotency-Key is in cell "
                f"{', '.join(unsure)}; try again",
                "Idempotency-Key",
                {"Retry-After": str(RETRY_AFTER_S)},
            )
        return None

    # -- summaries -------------------------------------------------------------------------------------
    async def _ask_summaries(
        self, cells: Iterable[str], headers: Mapping[str, str]
    ) -> dict[str, CellSummary | str | Answer]:
        """Each cell's summary; or why there is none; or its refusal of the caller's token (401, 403)."""
        out: dict[str, CellSummary | str | Answer] = {}
        for cell, a in (await self.upstream.call_all(cells, "GET", "/v1/cluster/summary", headers=headers)).items():
            if isinstance(a, CellUnavailable):
                out[cell] = a.reason
            elif a.status in (401, 403):
                out[cell] = a
            elif a.status != 200:
                out[cell] = f"answered {a.status}: {error_of(a).error}"
            else:
                try:
                    s = _SUMMARY.decode(a.body)
                except msgspec.DecodeError as e:
                    out[cell] = f"sent an unreadable summary ({e})"
                    continue
                # a gateway of another cell behind this cell's URL would get jobs whose ids name the wrong cell
                out[cell] = s if s.cell == cell else f"its gateway serves cell {s.cell}, not {cell}"
        return out

    async def _routing_summaries(
        self, headers: Mapping[str, str]
    ) -> tuple[dict[str, CellSummary], dict[str, str]] | Answer:
        """The cells' summaries up to summary_max_age_s old (asked again when older), and why the others have none."""
        now = self.clock()
        stale = [
            c
            for c in self.cells.names
            if (hit := self._summaries.get(c)) is None or now - hit[0] >= self.summary_max_age_s
        ]
        if stale:
            for cell, got in (await self._ask_summaries(stale, headers)).items():
                if isinstance(got, Answer):
                    return got  # not kept: it is this caller's
                self._summaries[cell] = (now, got)
        summaries = {c: s for c, (_, s) in self._summaries.items() if isinstance(s, CellSummary)}
        why = {c: s for c, (_, s) in self._summaries.items() if isinstance(s, str)}
        return summaries, why

    async def list_cells(self, request: web.Request) -> web.Response:
        """GET /v1/cells: each cell's summary, asked now, or why it has none."""
        got = await self._ask_summaries(self.cells.names, passed_on(request.headers))
        rows: list[CellStatus] = []
        now = self.clock()
        for cell in self.cells.names:
            r = got[cell]
            if isinstance(r, Answer):
                return answered(r)
            self._summaries[cell] = (now, r)
            if isinstance(r, CellSummary):
                rows.append(CellStatus(cell=cell, up=True, summary=r))
            else:
                rows.append(CellStatus(cell=cell, up=False, error=r))
        return json_response(CellList(cells=rows))

    # -- lists across cells ------------------------------------------------------------------------------
    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        return await self._merged(request, "jobs", job_order)

    async def list_migrations(self, request: web.Request) -> web.StreamResponse:
        job = request.query.get("job")
        if job and "cell" not in request.query:
            try:
                return await self.forward(request, cell_of_job(self.cells, job))  # a job's moves are in its cell
            except UnknownJob:
                pass  # no cell of this router: every cell says it has no moves of it
        return await self._merged(request, "migrations", migration_order)

    async def _merged(
        self, request: web.Request, key: str, order: Callable[[Mapping[str, Any]], Any]
    ) -> web.StreamResponse:
        """One page of every cell's list (`key`: its items' field), merged in `order`; `total` is the cells' sum.
        A cell that can't answer is left out and named in MISSING_HEADER; an answer other than a page (a 401, a
        bad filter's 422) is the answer."""
        if "cell" in request.query:
            return await self.forward(request, named_cell(self.cells, request.query["cell"]))
        page = _page(request.query)
        if page is None:
            return await self.any_cell(request)  # the cell's 422 names the bad parameter
        offset, limit = page
        filters = _without(request.query.items(), "cell", "offset", "limit")
        headers = passed_on(request.headers)
        heads = (self._head(c, request.path, key, filters, headers, offset + limit) for c in self.cells.names)
        results = await asyncio.gather(*heads, return_exceptions=True)
        pages, missing, refusal = _gathered(self.cells.names, results)
        if refusal is not None:
            return answered(refusal)
        if not pages:
            raise NoCell(missing)
        lists = [items for items, _ in pages]
        total = sum(count for _, count in pages)
        if missing:
            log.warning("%s without cells %s", request.path, missing)
        body = {key: merge_page(lists, order, offset, limit), "total": total, "offset": offset, "limit": limit}
        return json_response(body, headers={MISSING_HEADER: ",".join(missing)} if missing else None)

    async def usage(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/usage: every cell's answer to the query, summed by tenant and period (`?cell=`: one cell's). A
        cell that can't answer is left out and named in MISSING_HEADER; any other answer than a report (a 401, a
        bad parameter's 422) is the answer."""
        if "cell" in request.query:
            return await self.forward(request, named_cell(self.cells, request.query["cell"]))
        formats = request.query.getall("format", [])
        if len(set(formats)) > 1 or not set(formats) <= {"json", "csv"}:
            return await self.any_cell(request)  # the cell's 422 names the bad format
        query = [*_without(request.query.items(), "format"), ("format", "json")]
        headers = passed_on(request.headers)
        asks = (self.upstream.call(c, "GET", "/v1/usage", query=query, headers=headers) for c in self.cells.names)
        results = await asyncio.gather(*asks, return_exceptions=True)
        answers, missing, refusal = _gathered(self.cells.names, results)
        if refusal is not None:
            return answered(refusal)
        if not answers:
            raise NoCell(missing)
        merged = merge_usage([msgspec.json.decode(a.body, type=UsageView) for a in answers])
        extra = {MISSING_HEADER: ",".join(missing)} if missing else None
        if wants_csv(request.query.get("format"), request.headers.get("Accept", "")):
            return web.Response(text=usage_csv(merged), content_type=CSV_TYPE, headers=extra)
        return json_response(merged, headers=extra)

    async def _head(
        self,
        cell: str,
        path: str,
        key: str,
        filters: list[tuple[str, str]],
        headers: Mapping[str, str],
        need: int,
    ) -> tuple[list[Mapping[str, Any]], int] | Answer:
        """The cell's first `need` items (all it has when fewer), page by page, and its total; or its answer when
        it isn't a page."""
        items: list[Mapping[str, Any]] = []
        total = 0
        while len(items) < need:
            limit = min(MAX_PAGE, need - len(items))
            query = [*filters, ("offset", str(len(items))), ("limit", str(limit))]
            a = await self.upstream.call(cell, "GET", path, query=query, headers=headers)
            if a.status != 200:
                return a
            page = msgspec.json.decode(a.body)
            got, total = page[key], int(page["total"])
            items += got
            if len(got) < limit or len(items) >= total:
                break
        return items, total

    # -- events ----------------------------------------------------------------------------------------
    async def events(self, request: web.Request) -> web.StreamResponse:
        """Every cell's server-sent events in one stream (`?cell=`: one cell's), each event as its cell sent it.
        The stream ends when a cell's does (the client reconnects, and hears which cells are missing)."""
        if "cell" in request.query:
            return await self.forward(request, named_cell(self.cells, request.query["cell"]))
        query = list(request.query.items())  # ?token= too: EventSource sends no header
        opened: dict[str, aiohttp.ClientResponse] = {}
        missing: dict[str, str] = {}
        tries = [
            self.upstream.open(c, "GET", "/v1/events", query=query, headers=passed_on(request.headers), stream=True)
            for c in self.cells.names
        ]
        results = await asyncio.gather(*tries, return_exceptions=True)
        refusal_answer: web.Response | None = None
        for cell, r in zip(self.cells.names, results, strict=True):
            if isinstance(r, CellUnavailable):
                missing[cell] = r.reason
            elif isinstance(r, BaseException):
                raise r
            elif r.status != 200:
                if refusal_answer is None and r.status != 503:
                    refusal_answer = web.Response(
                        status=r.status, body=await r.read(), headers=passed_back(r.headers, cell)
                    )
                else:
                    missing[cell] = f"answered {r.status}"
                self.upstream.done(r)
            else:
                opened[cell] = r
        if refusal_answer is not None or not opened:
            for r in opened.values():
                self.upstream.done(r)
            if refusal_answer is not None:
                return refusal_answer
            raise NoCell(missing)
        return await self._merge_streams(request, opened, missing)

    async def _merge_streams(
        self, request: web.Request, opened: dict[str, aiohttp.ClientResponse], missing: Mapping[str, str]
    ) -> web.StreamResponse:
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(SSE_QUEUE)
        pumps = [
            asyncio.create_task(self._pump(cell, r, queue), name=f"router:events:{cell}") for cell, r in opened.items()
        ]
        headers = dict(SSE_HEADERS)
        if missing:
            headers[MISSING_HEADER] = ",".join(missing)
        out = web.StreamResponse(headers=headers)
        try:
            await out.prepare(request)
            await out.write(sse.CONNECTED)  # every cell's stream is live: they answered
            while True:
                try:
                    frame = await asyncio.wait_for(queue.get(), self.keepalive_s)
                except TimeoutError:
                    frame = sse.KEEP_ALIVE
                if frame is None:
                    break
                await out.write(frame)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for r in opened.values():
                self.upstream.done(r)
        return out

    async def _pump(self, cell: str, resp: aiohttp.ClientResponse, queue: asyncio.Queue[bytes | None]) -> None:
        """A cell's events, whole, onto the queue; its comments (connected, keep-alive) stay behind: the router
        writes its own. None once the cell's stream ends."""
        block: list[bytes] = []
        try:
            async for line in resp.content:
                if line.strip(b"\r\n"):
                    block.append(line)
                    continue
                if any(not part.startswith(b":") for part in block):
                    await queue.put(b"".join(block) + b"\n")
                block = []
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:  # ValueError: a line past aiohttp's limit
            log.info("cell %s's event stream ended: %r", cell, e)
        await queue.put(None)  # not when cancelled: the writer is gone then

    async def caller_refused(self, request: web.Request) -> web.Response | None:
        """A cell's 401 when it refuses the caller's credentials: an answer of the router's own (a job id of no
        cell here, an unknown `cell`) goes only to a caller the cells accept, as a cell's own answer would."""
        headers = passed_on(request.headers)
        token = request.query.get("token")
        if "Authorization" not in headers and token and request.path == "/v1/events":
            headers["Authorization"] = f"Bearer {token}"  # as a gateway takes it there (EventSource)
        for cell in self.cells.names:
            try:
                a = await self.upstream.call(cell, "GET", "/v1/cluster/summary", headers=headers)
            except CellUnavailable:
                continue
            return answered(a) if a.status in (401, 403) else None
        return None

    # -- meta --------------------------------------------------------------------------------------------
    async def _health(self, path: str) -> RouterHealth:
        got = await self.upstream.call_all(self.cells.names, "GET", path, within_s=HEALTH_S)
        up = {c: isinstance(a, Answer) and a.status == 200 for c, a in got.items()}
        status = "ok" if all(up.values()) else "degraded" if any(up.values()) else "unavailable"
        return RouterHealth(status=status, cells=up)

    async def healthz(self, request: web.Request) -> web.Response:
        """Live (the router runs), and which cells' gateways answer."""
        return json_response(await self._health("/healthz"))

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready while any cell's gateway is ready."""
        health = await self._health("/readyz")
        return json_response(health, 503 if health.status == "unavailable" else 200)

    async def openapi_json(self, request: web.Request) -> web.StreamResponse:
        """A cell's document, with what the router adds (services/router/openapi.py)."""
        why: dict[str, str] = {}
        for cell in self.cells.names:
            try:
                a = await self.upstream.call(cell, "GET", "/openapi.json")
            except CellUnavailable as e:
                why[cell] = e.reason
                continue
            if a.status == 200:
                return json_response(openapi.for_router(msgspec.json.decode(a.body), self.cells.names))
            why[cell] = f"answered {a.status}"
        raise NoCell(why)


def routes(router: Router) -> list[tuple[str, str, Handler]]:
    return [
        *(("GET", path, router.any_cell) for path in DASHBOARD),
        ("POST", "/v1/jobs", router.submit),
        ("GET", "/v1/jobs", router.list_jobs),
        ("GET", "/v1/jobs/{id}", router.by_job),
        ("DELETE", "/v1/jobs/{id}", router.by_job),
        ("GET", "/v1/jobs/{id}/logs", router.by_job),
        ("GET", "/v1/cluster", router.in_cell),
        ("GET", "/v1/cluster/summary", router.in_cell),
        ("GET", "/v1/cells", router.list_cells),
        ("GET", "/v1/migrations", router.list_migrations),
        ("GET", "/v1/usage", router.usage),
        ("POST", "/v1/nodes/{id}/drain", router.node_admin),
        ("POST", "/v1/nodes/{id}/undrain", router.node_admin),
        ("POST", "/v1/nodes/{id}/clear-health", router.node_admin),
        ("GET", "/v1/events", router.events),
        ("GET", "/openapi.json", router.openapi_json),
        ("GET", "/v1/schemas/job.json", router.any_cell),  # the same in every cell
        ("GET", "/healthz", router.healthz),
        ("GET", "/readyz", router.readyz),
        ("GET", "/metrics", router.in_cell),
    ]


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the router itself gives is an ErrorBody (a cell's own answers pass as they are)."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return error_response(e.status, e.reason, headers=allow)
    except CellUnavailable as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return error_response(503, str(e), headers={CELL_HEADER: e.cell, "Retry-After": str(RETRY_AFTER_S)})
    except NoCell as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return error_response(503, str(e), headers={"Retry-After": str(RETRY_AFTER_S)})
    except (UnknownJob, BadCell) as e:
        refused = await request.app[ROUTER].caller_refused(request)
        if refused is not None:
            return refused
        if isinstance(e, UnknownJob):
            return error_response(404, str(e))
        return error_response(422, str(e), "cell")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal error")


ROUTER = web.AppKey("router", Router)


def build_app(router: Router) -> web.Application:
    app = web.Application(middlewares=[errors_as_json], client_max_size=MAX_BODY)
    app[ROUTER] = router
    for method, path, handler in routes(router):
        app.router.add_route(method, path, handler)
    app.on_startup.append(router.start)
    app.on_shutdown.append(router.close_streams)
    app.on_cleanup.append(router.close)
    return app


def load_cells(settings: Settings) -> Cells:
    """The cells of RACKSCALE_CELL_GATEWAYS and the home cells of RACKSCALE_TENANTS_FILE; ValueError naming what
    is wrong."""
    if not settings.cell_gateways:
        raise ValueError("set RACKSCALE_CELL_GATEWAYS (cell=URL,...): the cells' gateways")
    homes = load_home_cells(settings.tenants_file) if settings.tenants_file else {}
    return Cells(gateways=settings.cell_gateways, homes=homes)


class RouterServer:
    """The router's app on a host and port (0: any free one)."""

    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router, self.host, self.port = router, host, port
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> RouterServer:
        self._runner = web.AppRunner(build_app(self.router), handle_signals=False, access_log=None, shutdown_timeout=5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        log.info("router on %s over cells %s", self.url, ", ".join(self.router.cells.names))
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def main() -> None:
    try:
        settings = Settings.from_env()
        cells = load_cells(settings)
    except (SettingsError, TenantsError, ValueError) as e:
        sys.exit(f"router: {e}")
    setup_logging(settings.log_level)

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = await RouterServer(Router(cells), settings.router_host, settings.router_port).start()
        await stop.wait()
        await server.stop()

    asyncio.run(go())
