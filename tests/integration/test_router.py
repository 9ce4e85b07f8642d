"""The router against stand-in cell gateways (small aiohttp apps that answer as a gateway does and write down what
they were sent): what a real two-cell system is too slow or too small to show — lists deeper than one cell page,
what headers reach a cell, a burst of submissions within one summary's age, a gateway of the wrong cell behind a
cell's URL, a merged event stream that ends with a cell's. tests/e2e/test_router.py runs the router over real
cells."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web

from services.router.routing import Cells
from services.router.service import Router, RouterServer
from services.router.upstream import MISSING_HEADER
from shared import sse
from shared.api import MAX_PAGE, CellSummary
from shared.names import cell_job_id

pytestmark = pytest.mark.asyncio


@dataclass
class StandIn:
    """A cell's gateway as the router sees it."""

    cell: str
    gpus: int = 72
    free: int = 72
    jobs: list[dict[str, Any]] = field(default_factory=list)
    serves_cell: str = ""  # the cell its summary names (a misconfigured router points at another cell's gateway)
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # method, path, headers
    events: asyncio.Queue[bytes | None] = field(default_factory=asyncio.Queue)
    url: str = ""

    def app(self) -> web.Application:
        async def summary(request: web.Request) -> web.Response:
            self._saw(request)
            s = CellSummary(cell=self.serves_cell or self.cell, generation=1, gpus=self.gpus, healthy=self.gpus,
                            busy=self.gpus - self.free, free=self.free, nodes=self.gpus // 4,
                            nodes_up=self.gpus // 4, jobs_pending=0, jobs_running=0)  # fmt: skip
            return web.json_response(msgspec.to_builtins(s))

        async def submit(request: web.Request) -> web.Response:
            self._saw(request)
            raw = await request.read()
            try:
                body = msgspec.json.decode(raw)
                body["gpus"] + 0
            except (msgspec.DecodeError, TypeError, KeyError):
                return web.json_response({"error": f"not a job: {raw.decode()}"}, status=400)
            if body["gpus"] > self.gpus:
                return web.json_response(
                    {"error": f"gpus: more than the cell's {self.gpus}", "field": "gpus"}, status=422
                )
            job = {"id": cell_job_id(self.cell, uuid.uuid4().hex), "submitted_at": float(len(self.jobs))}
            self.jobs.append(job)
            return web.json_response({"id": job["id"], "state": "pending"}, status=202)

        async def jobs(request: web.Request) -> web.Response:
            self._saw(request)
            offset, limit = int(request.query.get("offset", 0)), int(request.query.get("limit", 50))
            if limit > MAX_PAGE:
                return web.json_response({"error": "limit: too many", "field": "limit"}, status=422)
            page = self.jobs[offset : offset + limit]
            return web.json_response({"jobs": page, "total": len(self.jobs), "offset": offset, "limit": limit})

        async def events(request: web.Request) -> web.StreamResponse:
            self._saw(request)
            resp = web.StreamResponse(headers={"Content-Type": sse.MEDIA_TYPE})
            await resp.prepare(request)
            await resp.write(sse.CONNECTED)
            while (frame := await self.events.get()) is not None:
                await resp.write(frame)
            return resp

        app = web.Application()
        app.router.add_get("/v1/cluster/summary", summary)
        app.router.add_post("/v1/jobs", submit)
        app.router.add_get("/v1/jobs", jobs)
        app.router.add_get("/v1/events", events)
        return app

    def _saw(self, request: web.Request) -> None:
        self.seen.append((request.method, request.path, dict(request.headers)))


Opener = Callable[..., Awaitable[tuple[str, aiohttp.ClientSession]]]


@pytest_asyncio.fixture
async def router_over() -> AsyncIterator[Opener]:
    """`await router_over(*stand_ins, max_age_s=...)` → the router's URL and a session."""
    runners: list[web.AppRunner] = []
    servers: list[RouterServer] = []
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))

    async def open_(
        *cells: StandIn, max_age_s: float = 0.0, extra: tuple[tuple[str, str], ...] = ()
    ) -> tuple[str, aiohttp.ClientSession]:
        for c in cells:
            runner = web.AppRunner(c.app(), shutdown_timeout=1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            runners.append(runner)
            c.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        gateways = tuple((c.cell, c.url) for c in cells) + extra
        server = await RouterServer(Router(Cells(gateways, {}), summary_max_age_s=max_age_s), "127.0.0.1", 0).start()
        servers.append(server)
        return server.url, http

    try:
        yield open_
    finally:
        await http.close()
        for s in servers:
            await s.stop()
        for r in runners:
            await r.cleanup()


async def test_a_list_deeper_than_a_cells_page_is_read_page_by_page_and_merged(router_over: Opener) -> None:
    a = StandIn("c0", jobs=[{"id": f"a{i}", "submitted_at": 2.0 * i} for i in range(700)])
    b = StandIn("c1", jobs=[{"id": f"b{i}", "submitted_at": 2.0 * i + 1} for i in range(300)])
    url, http = await router_over(a, b)
    async with http.get(f"{url}/v1/jobs", params={"offset": 580, "limit": 40}) as r:
        page = await r.json()
        assert r.status == 200 and MISSING_HEADER not in r.headers
    # merged by submit time: a0 b0 a1 b1 ... b299 a300 a301 ...: past 600 only a's remain
    whole = sorted(a.jobs + b.jobs, key=lambda j: j["submitted_at"])
    assert page == {"jobs": whole[580:620], "total": 1000, "offset": 580, "limit": 40}
    asked = [h for m, p, h in a.seen if p == "/v1/jobs"]
    assert len(asked) == 2, "620 jobs of c0 take two pages of at most 500"
    async with http.get(f"{url}/v1/jobs", params={"limit": MAX_PAGE + 1}) as r:
        assert r.status == 422 and (await r.json())["field"] == "limit"  # a cell's words for a bad parameter


async def test_the_callers_credentials_and_trace_reach_the_cell_and_nothing_else_of_its_request(
    router_over: Opener,
) -> None:
    a = StandIn("c0")
    url, http = await router_over(a)
    passed = {"Authorization": "Bearer t-0123456789abcdef", "traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}
    kept = {"Cookie": "session=x", "X-Forwarded-For": "10.0.0.9"}
    async with http.post(f"{url}/v1/jobs", json={"name": "j", "tenant": "t", "gpus": 4}, headers=passed | kept) as r:
        assert r.status == 202 and r.headers["X-Rackscale-Cell"] == "c0"
    assert [(m, p) for m, p, _ in a.seen] == [("GET", "/v1/cluster/summary"), ("POST", "/v1/jobs")]
    for _, _, headers in a.seen:
        assert passed.items() <= headers.items() and not kept.keys() & headers.keys()


async def test_what_is_no_job_goes_to_a_cell_as_it_came_for_the_cell_to_say_why(router_over: Opener) -> None:
    url, http = await router_over(StandIn("c0"))
    for body in (b"{not json", b'{"tenant": 5}', b'{"name": "j", "tenant": "t", "gpus": "4"}'):
        async with http.post(f"{url}/v1/jobs", data=body, headers={"Content-Type": "application/json"}) as r:
            assert (r.status, (await r.json())["error"]) == (400, f"not a job: {body.decode()}")


async def test_a_burst_within_one_summarys_age_spreads_over_the_cells(router_over: Opener) -> None:
    a, b = StandIn("c0", free=40), StandIn("c1", free=32)
    url, http = await router_over(a, b, max_age_s=3600.0)  # one summary for the whole burst
    for _ in range(6):
        async with http.post(f"{url}/v1/jobs", json={"name": "j", "tenant": "t", "gpus": 8}) as r:
            assert r.status == 202
    # each job counts against its cell's free GPUs until the next summary (ties: the configured order):
    # free 40/32 → c0, 32/32 → c0, 24/32 → c1, 24/24 → c0, 16/24 → c1, 16/16 → c0
    assert (len(a.jobs), len(b.jobs)) == (4, 2)
    assert sum(p == "/v1/cluster/summary" for _, p, _ in a.seen) == 1


async def test_a_gateway_of_another_cell_behind_a_cells_url_gets_no_jobs(router_over: Opener) -> None:
    wrong = StandIn("c1", free=72, serves_cell="c0")  # c1's URL leads to c0's gateway: its ids would name c0
    right = StandIn("c0", free=8)
    url, http = await router_over(right, wrong)
    async with http.post(f"{url}/v1/jobs", json={"name": "j", "tenant": "t", "gpus": 4}) as r:
        assert r.status == 202 and r.headers["X-Rackscale-Cell"] == "c0"
    async with http.get(f"{url}/v1/cells") as r:
        rows = {row["cell"]: row for row in (await r.json())["cells"]}
    assert rows["c1"] == {"cell": "c1", "up": False, "summary": None, "error": "its gateway serves cell c0, not c1"}
    assert rows["c0"]["up"] and rows["c0"]["summary"]["free"] == 8


async def test_no_cell_answering_is_a_503_naming_each(router_over: Opener) -> None:
    url, http = await router_over(extra=(("c0", "http://127.0.0.1:9"), ("c1", "http://127.0.0.1:9")))
    async with http.post(f"{url}/v1/jobs", json={"name": "j", "tenant": "t", "gpus": 4}) as r:
        err = await r.json()
        assert (
            r.status == 503 and "no cell answered" in err["error"] and "c0: " in err["error"] and "c1: " in err["error"]
        )
    async with http.get(f"{url}/v1/jobs/c1-{'0' * 32}") as r:
        assert (r.status, r.headers["X-Rackscale-Cell"]) == (503, "c1")
        assert "cell c1 is unavailable" in (await r.json())["error"]
    async with http.get(f"{url}/readyz") as r:
        assert r.status == 503 and await r.json() == {"status": "unavailable", "cells": {"c0": False, "c1": False}}


async def test_merged_events_carry_each_cells_events_and_end_with_a_cells_stream(router_over: Opener) -> None:
    a, b = StandIn("c0"), StandIn("c1")
    url, http = await router_over(a, b)
    async with http.get(f"{url}/v1/events") as r:
        assert r.status == 200 and r.content_type == sse.MEDIA_TYPE
        a.events.put_nowait(sse.frame("job", b'{"job_id":"x"}'))
        b.events.put_nowait(sse.KEEP_ALIVE)  # a cell's comments stay behind
        b.events.put_nowait(sse.frame("node", b'{"node":"n"}'))
        b.events.put_nowait(None)  # c1's stream ends: so does the merged one (the client reconnects)
        reader, heard = sse.Reader(), []
        async for line in r.content:
            ev = reader.feed(line.decode())
            heard += [(ev.event, ev.data)] if ev is not None else []
    assert sorted(heard) == [("job", '{"job_id":"x"}'), ("node", '{"node":"n"}')]
    a.events.put_nowait(None)
