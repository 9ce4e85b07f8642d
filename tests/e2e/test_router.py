"""A router (services/router) in front of two whole cells on one NATS and one Valkey, and a third cell configured
whose gateway is gone. Jobs go to their tenant's home cell, else to the cell with room for them; their ids name
their cell, so reads, cancels and logs (followed too) go there through the router; lists and event streams merge
the cells and name the one missing; each cell's cluster is shown on its own; a job larger than every cell is
refused with the largest cell's size. The cells check the tokens the router passes on."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from services.cli.main import main as cli_main
from services.router.routing import Cells
from services.router.service import Router, RouterServer
from services.router.upstream import CELL_HEADER, MISSING_HEADER
from shared import sse
from shared.names import DEFAULT_CELL, job_cell
from shared.tenants import load_home_cells
from tests.e2e.conftest import StackFactory, wait_until

pytestmark = pytest.mark.asyncio

ADMIN = "router-admin-token-0001"
TOKENS = f"""
tokens:
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
"""
TENANTS = "tenants:\n  homed: {cell: c1}\n  roamer: {quota_gpus: 1000}\n"
HELLO = "import time\nprint('hello from a cell', flush=True)\ntime.sleep(600)"


def _dead_url() -> str:
    """A gateway URL nobody listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@asynccontextmanager
async def routed(cells: Cells) -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    """A router over `cells` that asks for the cells' summaries on every submission (the test decides what the
    cells hold), and an HTTP session with the admin token."""
    server = await RouterServer(Router(cells, summary_max_age_s=0.0), "127.0.0.1", 0).start()
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), headers={"Authorization": f"Bearer {ADMIN}"})
    try:
        yield server.url, http
    finally:
        await http.close()
        await server.stop()


async def _json(r: aiohttp.ClientResponse) -> Any:
    return msgspec.json.decode(await r.read())


async def submit(http: aiohttp.ClientSession, url: str, body: dict[str, Any], **headers: str) -> str:
    async with http.post(f"{url}/v1/jobs", json=body, headers=headers) as r:
        data = await _json(r)
        assert r.status in (200, 202), f"submit {body} → {r.status} {data}"
        assert r.headers[CELL_HEADER] == job_cell(data["id"])
        return str(data["id"])


async def test_a_router_routes_jobs_to_cells_and_shows_them_together(
    open_stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    cell = {"tokens_file": str(tokens)}
    c0 = await open_stack(domains=1, token=ADMIN, settings=cell)  # 18 nodes, 72 GPUs
    c1 = await open_stack(domains=2, token=ADMIN, settings={**cell, "cell": "c1"})  # 36 nodes, 144 GPUs
    gateways = (("c0", c0.url), ("c1", c1.url), ("c2", _dead_url()))
    cells = Cells(gateways=gateways, homes=load_home_cells(tenants))
    async with routed(cells) as (url, http):
        # a tenant with a home cell lands there, whatever the room elsewhere
        homed = await submit(http, url, {"name": "h", "tenant": "homed", "gpus": 4, "duration_s": 600})
        assert homed.startswith("c1-") and (await c1.job(homed))["tenant"] == "homed"
        assert await c0.maybe_job(homed) is None
        # a YAML body (and a script) is routed by its tenant as JSON is
        yaml_body = "name: y\ntenant: homed\ngpus: 4\nduration_s: 0.2\n"
        async with http.post(f"{url}/v1/jobs", data=yaml_body, headers={"Content-Type": "application/yaml"}) as r:
            assert r.status == 202, await r.text()
            from_yaml = (await _json(r))["id"]
        assert job_cell(from_yaml) == "c1"
        await wait_until(lambda: c1.maybe_job(from_yaml), f"{from_yaml} recorded")  # before the count below
        # a dry run goes where the job would, and takes nothing there
        async with http.get(f"{c1.url}/v1/jobs", params={"tenant": "homed"}) as r:
            before = (await _json(r))["total"]
        dry = {"name": "d", "tenant": "homed", "gpus": 4, "duration_s": 600}
        async with http.post(f"{url}/v1/jobs", params={"dry_run": "true"}, json=dry) as r:
            answer = await _json(r)
            assert r.status == 200 and answer["start"] == "now" and r.headers[CELL_HEADER] == "c1", answer
        async with http.get(f"{c1.url}/v1/jobs", params={"tenant": "homed"}) as r:
            assert (await _json(r))["total"] == before
        # without one: the cell with the most free GPUs (c1, 140 free against 72), then, once c1 is full, c0
        first = await submit(http, url, {"name": "a", "tenant": "roamer", "gpus": 8, "duration_s": 600})
        assert job_cell(first) == "c1"
        filler = await c1.submit({"name": "fill", "tenant": "ops", "gpus": 128, "topology": {"nvlink": "none"},
                                  "duration_s": 600})  # fmt: skip
        await c1.wait_state(filler, {"running"})
        body = {"name": "b", "tenant": "roamer", "gpus": 8, "command": [sys.executable, "-c", HELLO]}
        second = await submit(http, url, body)
        assert job_cell(second) == DEFAULT_CELL and "-" not in second  # the default cell's ids stay plain hex
        # a job bigger than c0 (which has the most room now) goes to c1, which takes its shape (it waits there)
        wide = {"name": "w", "tenant": "roamer", "gpus": 100, "topology": {"nvlink": "none"}, "duration_s": 1}
        assert job_cell(await submit(http, url, wide)) == "c1"
        # ... and one bigger than every cell is refused, with the largest cell's size
        async with http.post(f"{url}/v1/jobs", json={**wide, "gpus": 200}) as r:
            err = await _json(r)
            assert (r.status, err["field"], r.headers[CELL_HEADER]) == (422, "gpus", "c1")
            assert "no cell can take this job" in err["error"] and "c1 (144 GPUs)" in err["error"], err

        # reads, logs (followed) and cancels go to the cell the id names
        async with http.get(f"{url}/v1/jobs/{first}") as r:
            assert r.status == 200 and (await _json(r))["id"] == first and r.headers[CELL_HEADER] == "c1"
        await c0.wait_state(second, {"running"})

        async def said_hello() -> str | None:
            async with http.get(f"{url}/v1/jobs/{second}/logs") as r:
                text = await r.text()
                return text if "hello from a cell" in text else None

        await wait_until(said_hello, "the c0 job's line, read through the router")
        events: list[sse.Event] = []
        reader = sse.Reader()
        async with http.get(f"{url}/v1/jobs/{second}/logs", params={"follow": "true"}) as follow:
            assert follow.status == 200 and follow.content_type == sse.MEDIA_TYPE
            async for raw in follow.content:
                ev = reader.feed(raw.decode())
                if ev is None:
                    continue
                events.append(ev)
                if ev.event == "line" and len(events) == 1:  # the backlog came: cancel; the stream ends with the job
                    async with http.delete(f"{url}/v1/jobs/{second}") as r:
                        assert r.status == 202, await r.text()
        assert msgspec.json.decode(events[0].data)["text"] == "hello from a cell"
        assert events[-1].event == "end" and msgspec.json.decode(events[-1].data)["state"] == "cancelled"
        async with http.get(f"{url}/v1/jobs/c9-{'0' * 32}") as r:
            assert r.status == 404 and "c9" in (await _json(r))["error"]
        async with http.get(f"{url}/v1/jobs/c2-{'0' * 32}") as r:
            assert (r.status, r.headers[CELL_HEADER]) == (503, "c2") and "cell c2" in (await _json(r))["error"]

        # the list asks every cell and merges them in submit order; the cell that can't answer is named
        mine = {homed, first, filler, second}
        listed, total = await all_jobs(http, url, page=2)
        assert mine <= set(listed) and len(listed) == total
        assert total == len(await c0.all_jobs()) + len(await c1.all_jobs())
        submitted = [j["submitted_at"] for j in listed.values()]
        assert submitted == sorted(submitted)
        async with http.get(f"{url}/v1/jobs", params={"cell": "c0"}) as r:
            assert {j["id"] for j in (await _json(r))["jobs"]} == set(await c0.all_jobs())

        # each cell's cluster on its own, and one summary row per cell
        for name, nodes in (("c0", 18), ("c1", 36)):
            async with http.get(f"{url}/v1/cluster", params={"cell": name}) as r:
                assert r.headers[CELL_HEADER] == name
                view = await _json(r)
            assert sum(len(d["nodes"]) for d in view["domains"]) == nodes
            held = {a["job_id"] for a in view["allocations"]}
            ours = {homed, first, filler}  # c1's jobs, in c1's view alone
            assert ours <= held if name == "c1" else not ours & held
        async with http.get(f"{url}/v1/cluster", params={"cell": "c9"}) as r:
            assert r.status == 422 and (await _json(r))["field"] == "cell"
        async with http.get(f"{url}/v1/cells") as r:
            rows = {row["cell"]: row for row in (await _json(r))["cells"]}
        assert (rows["c0"]["summary"]["gpus"], rows["c1"]["summary"]["gpus"]) == (72, 144)
        assert rows["c1"]["summary"]["busy"] >= 128 and not rows["c2"]["up"] and rows["c2"]["error"]
        async with http.get(f"{url}/healthz") as r:
            assert await _json(r) == {"status": "degraded", "cells": {"c0": True, "c1": True, "c2": False}}

        # every cell's events in one stream
        async with http.get(f"{url}/v1/events") as stream:
            assert stream.status == 200 and stream.headers[MISSING_HEADER] == "c2"
            assert await stream.content.readline() == b": connected\n"  # every cell's stream is live
            later = [
                await submit(http, url, {"name": "e1", "tenant": "homed", "gpus": 4, "duration_s": 0.2}),
                await c0.submit({"name": "e0", "tenant": "ops", "gpus": 4, "duration_s": 0.2}),
            ]
            heard = await events_of(stream, later)
        assert heard == set(later)

        # usage: every cell's, summed by tenant and period (runs still holding GPUs grow between the reads, so the
        # router's sum lies between the cells' own sums read before and after it)
        async def hours(at: str, **params: str) -> dict[tuple[str, str], float]:
            async with http.get(f"{at}/v1/usage", params=params) as r:
                assert r.status == 200, await r.text()
                return {(row["tenant"], row["period"]): row["gpu_hours"] for row in (await _json(r))["rows"]}

        def summed(*parts: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
            out: dict[tuple[str, str], float] = {}
            for part in parts:
                for k, v in part.items():
                    out[k] = out.get(k, 0.0) + v
            return out

        async def all_counted() -> bool | None:  # the usage views have folded the runs that hold GPUs now
            return {"homed", "ops", "roamer"} <= {
                t for t, _ in summed(await hours(c0.url), await hours(c1.url))
            } or None

        await wait_until(all_counted, "runs counted in the usage views")
        before = summed(await hours(c0.url), await hours(c1.url))
        routed_hours = await hours(url)
        after = summed(await hours(c0.url), await hours(c1.url))
        assert set(before) & set(after) <= set(routed_hours) <= set(before) | set(after)
        # a run's end is folded a moment after it: till then it counts up to the read (36 GPU-seconds of slack)
        slack = 0.01
        for k, got in routed_hours.items():
            lo, hi = min(before.get(k, 0.0), after.get(k, 0.0)), max(before.get(k, 0.0), after.get(k, 0.0))
            assert lo - slack <= got <= hi + slack, (k, before, routed_hours, after)
        assert (await hours(url, cell="c1")).keys() <= routed_hours.keys()
        async with http.get(f"{url}/v1/usage", params={"format": "csv"}) as r:
            assert r.status == 200 and r.headers[MISSING_HEADER] == "c2"
            assert (await r.text()).splitlines()[0] == "tenant,period,start,gpu_hours,jobs"

        # the CLI through the router: node names repeat across cells, so a node command names its cell
        monkeypatch.setenv("RACKSCALE_TOKEN", ADMIN)
        code, said = await rackscale("drain", "d00-n17", "--url", url)
        assert code != 0 and "name the cell" in said, said
        assert (await rackscale("drain", "d00-n17", "--cell", "c1", "--url", url))[0] == 0
        drained = {name: node_states(await e2e.cluster())["d00-n17"] for name, e2e in (("c0", c0), ("c1", c1))}
        assert drained == {"c0": "up", "c1": "draining"}
        code, said = await rackscale("cluster", "--cell", "c1", "--url", url)
        assert code == 0 and "d01" in said, said  # c1's second domain: c0 has one

        # the cells check the token the router passes on
        async with aiohttp.ClientSession() as anonymous:
            for path in ("/v1/jobs", "/v1/cells", f"/v1/jobs/{first}"):
                async with anonymous.get(f"{url}{path}") as r:
                    assert r.status == 401, path

    # an Idempotency-Key retry finds its job in whichever cell took it (here without the gone cell: while a cell
    # that may hold the first submit can't be asked, a retry is refused rather than sent to a second cell)
    body = {"name": "once", "tenant": "roamer", "gpus": 4, "duration_s": 600}
    key = {"Idempotency-Key": "k-1"}
    async with routed(cells) as (url, http), http.post(f"{url}/v1/jobs", json=body, headers=key) as r:
        err = await _json(r)
        assert (r.status, err["field"]) == (503, "Idempotency-Key") and "c2" in err["error"], err
    async with routed(Cells(gateways=gateways[:2], homes={})) as (url, http):
        once = await submit(http, url, body, **key)
        await wait_until(lambda: (c0 if job_cell(once) == "c0" else c1).maybe_job(once), f"{once} recorded")
        again = await submit(http, url, body, **key)
        assert again == once


async def rackscale(*argv: str) -> tuple[int, str]:
    """The CLI's exit code and what it printed."""
    out: list[str] = []
    code = await asyncio.to_thread(cli_main, list(argv), out.append, out.append)
    return code, "\n".join(out)


def node_states(view: dict[str, Any]) -> dict[str, str]:
    return {n["name"]: n["state"] for d in view["domains"] for n in d["nodes"]}


async def all_jobs(http: aiohttp.ClientSession, url: str, page: int) -> tuple[dict[str, dict[str, Any]], int]:
    """Every job through the router, `page` at a time, in the order listed; and the total it gave."""
    out: dict[str, dict[str, Any]] = {}
    total = 0
    while True:
        async with http.get(f"{url}/v1/jobs", params={"offset": len(out), "limit": page}) as r:
            assert r.status == 200 and r.headers[MISSING_HEADER] == "c2"
            data = await _json(r)
        total = data["total"]
        out.update((j["id"], j) for j in data["jobs"])
        if not data["jobs"] or len(out) >= total:
            return out, total


async def events_of(stream: aiohttp.ClientResponse, jobs: list[str]) -> set[str]:
    """The jobs among `jobs` the stream tells of, once it has told of each."""
    reader, heard = sse.Reader(), set[str]()

    async def read() -> None:
        async for raw in stream.content:
            ev = reader.feed(raw.decode())
            if ev is not None and ev.event == "job":
                job = msgspec.json.decode(ev.data)["job_id"]
                heard.update({job} & set(jobs))
                if heard == set(jobs):
                    return

    await asyncio.wait_for(read(), 60)
    return heard
