"""The dashboard in a real headless browser (issue 6, item 5): Debian's chromium driven by Playwright.

The whole stack runs with bearer tokens; the page is opened as tenant alice with `?token=`, so the test also
covers the token's way into the page and into its EventSource, and the tenant filter. The page must render
every domain's 18x4 grid, colour a job's cells when it starts (pushed by server-sent events, no reload),
list a pending job with its reason, hide another tenant's jobs, show a drained node with its reason (free
text, rendered as text, never as HTML), and on a click show a job's placement and its Jaeger trace link. Screenshots go
to artifacts/ (or $RACKSCALE_ARTIFACTS). Skipped only when no chromium can be had (tests/browser.py tries
apt-get first).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, async_playwright

from services.router.routing import Cells
from services.router.service import Router, RouterServer
from tests.browser import ensure_chromium
from tests.e2e.conftest import E2E, StackFactory, service_errors

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]
ALICE, BOB, ADMIN = "alice-dashboard-token-0001", "bob-dashboard-token-00002", "ops-dashboard-token-000003"
TOKENS_YAML = f"""
tokens:
  - {{token: "{ALICE}", tenant: alice, role: user}}
  - {{token: "{BOB}", tenant: bob, role: user}}
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
"""
JAEGER = "http://jaeger.test:16686"
HOSTILE = '<img src=x onerror="window.__pwned=1">tray & <b>fan</b>'  # a drain reason is free text
WAIT_MS = 60_000


def artifacts_dir() -> Path:
    path = Path(os.environ.get("RACKSCALE_ARTIFACTS") or ROOT / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest_asyncio.fixture
async def browser() -> AsyncIterator[Browser]:
    path, why = ensure_chromium()
    if path is None:
        pytest.skip(why)
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=path)  # Debian's build; Playwright downloads nothing
        try:
            yield b
        finally:
            await b.close()


def nvlink(name: str, tenant: str, gpus: int) -> dict[str, Any]:
    return {"name": name, "tenant": tenant, "gpus": gpus, "topology": {"nvlink": "required"}, "duration_s": 600}


async def cells_of(page: Page, job: str) -> set[tuple[str, int]]:
    found = await page.eval_on_selector_all(
        "#domains .gpu[data-job]",
        "(cells, job) => cells.filter(c => c.dataset.job === job).map(c => [c.dataset.node, +c.dataset.gpu])",
        job,
    )
    return {(n, g) for n, g in found}


async def wait_cells(page: Page, job: str, count: int) -> None:
    await page.wait_for_function(
        "([job, n]) => [...document.querySelectorAll('#domains .gpu[data-job]')]"
        ".filter(c => c.dataset.job === job).length === n",
        arg=[job, count],
    )


def allocation(view: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["node"], g) for p in view["allocation"] for g in p["gpus"]}


async def test_dashboard_renders_updates_live_and_shows_placement_and_reasons(
    open_stack: StackFactory, browser: Browser, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS_YAML)
    e2e: E2E = await open_stack(domains=2, token=ADMIN, settings={"tokens_file": str(tokens), "jaeger_ui_url": JAEGER})
    # bypass_csp: Playwright's waits evaluate strings, which the page's policy forbids; and the escaping of
    # job names must hold on its own, not only because the policy would block an inline handler.
    page = await browser.new_page(viewport={"width": 1280, "height": 1100}, bypass_csp=True)
    page.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)

    # -- every domain's grid, opened through / with the token (which then leaves the address bar) ---------
    await page.goto(f"{e2e.url}/?token={ALICE}")
    await page.wait_for_function("document.querySelectorAll('#domains .domain').length === 2")
    grids = await page.eval_on_selector_all(
        "#domains .domain", "ds => ds.map(d => [d.dataset.domain, d.querySelectorAll('.gpu').length])"
    )
    assert grids == [["d00", 72], ["d01", 72]], grids
    order = await page.eval_on_selector_all("#domains [data-domain=d00] .gpu", "cs => cs.map(c => c.dataset.node)")
    assert order == [f"d00-n{n:02d}" for n in range(18) for _ in range(4)], "one row of 4 GPUs per node, in order"
    assert page.url == f"{e2e.url}/dashboard", page.url
    await page.wait_for_selector('#live[data-live="1"]')  # the EventSource is connected (with ?token=)
    await page.evaluate("window.__sameDocument = true")

    # -- a job starts: its cells get its colour, pushed by server-sent events -------------------------------
    hello = "import os, time; print('hello from', os.environ['RANK'], flush=True); time.sleep(600)"
    a = await e2e.submit(nvlink("train-a", "alice", 8) | {"command": [sys.executable, "-c", hello]})
    await wait_cells(page, a, 8)
    view_a = await e2e.wait_state(a, {"running"})
    assert await cells_of(page, a) == allocation(view_a)
    colours = await page.eval_on_selector_all(
        "#domains .gpu[data-job]", "cs => [...new Set(cs.map(c => getComputedStyle(c).backgroundColor))]"
    )
    free = await page.eval_on_selector("#domains .gpu.free", "c => getComputedStyle(c).backgroundColor")
    assert len(colours) == 1 and colours[0] != free, (colours, free)

    # -- another tenant's job: busy cells without its id; its pending job not listed ------------------------
    b = await e2e.submit(nvlink("bob-full", "bob", 72))
    await e2e.wait_state(b, {"running"})
    await page.wait_for_function("document.querySelectorAll('#domains .gpu.other').length === 72")
    # -- a job that can't fit: pending, with its reason -----------------------------------------------------------
    c = await e2e.submit(nvlink("ckpt-72", "alice", 72))
    d = await e2e.submit(nvlink("bob-waits", "bob", 72))
    view_c = await e2e.wait_state(c, {"pending"}, check=lambda j: "domain" in j["reason"])
    await e2e.wait_state(d, {"pending"}, check=lambda j: bool(j["reason"]))
    first_clause = view_c["reason"].split(";")[0]
    row = page.locator(f"#pending li[data-job='{c}']")
    await row.locator(".reason", has_text=first_clause).wait_for()
    assert await row.locator(".name").text_content() == "ckpt-72"
    assert await page.locator("#pending li").count() == 1, "bob's pending job is not alice's to see"
    html = await page.content()
    assert b not in html and d not in html, "another tenant's job ids never reach the page"

    # -- a drained node shows as draining -----------------------------------------------------------------------
    cluster = await e2e.cluster()
    busy = {n for n, _ in allocation(view_a)}
    idle = next(n["name"] for dom in cluster["domains"] if dom["name"] == view_a["allocation"][0]["domain"]
                for n in dom["nodes"] if n["name"] not in busy)  # fmt: skip
    async with e2e.http.post(f"{e2e.url}/v1/nodes/{idle}/drain", json={"reason": HOSTILE}) as r:
        assert r.status == 200, await r.text()
    await page.wait_for_function(
        "node => [...document.querySelectorAll('#domains .gpu.draining')].filter(c => c.dataset.node === node)"
        ".length === 4",
        arg=idle,
    )
    note = page.locator(f"#domains .troubled li[data-node='{idle}']")
    assert await note.text_content() == f"{idle} draining ({HOSTILE})", "free text is shown as text"
    assert await page.evaluate("window.__pwned") is None and await page.locator("#domains img").count() == 0

    # -- a click on a job's cell: placement and the Jaeger link -----------------------------------------------
    await page.locator(f"#domains .gpu[data-job='{a}']").first.click()
    await page.wait_for_selector(f"#details[data-job='{a}']:not([hidden])")
    rows = await page.eval_on_selector_all(
        "#d-placement tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))"
    )
    expect = [[p["domain"], p["node"], ",".join(map(str, p["gpus"]))] for p in view_a["allocation"]]
    assert rows == expect, (rows, expect)
    assert await page.text_content("#d-name") == "train-a"
    assert re.fullmatch(r"[0-9a-f]{32}", view_a["trace_id"]), view_a["trace_id"]
    assert await page.get_attribute("#d-trace", "href") == f"{JAEGER}/trace/{view_a['trace_id']}"
    assert await page.locator(f"#domains .gpu.selected[data-job='{a}']").count() == 8
    await page.wait_for_function(  # its last lines, every rank's
        "() => ['0: hello from 0', '1: hello from 1']"
        ".every(l => document.querySelector('#d-logs').textContent.includes(l))"
    )
    await page.screenshot(path=artifacts_dir() / "dashboard.png", full_page=True)

    # -- a click on the pending row: its reason, no placement ---------------------------------------------------
    await row.click()
    await page.wait_for_selector(f"#details[data-job='{c}']")
    assert await page.text_content("#d-state") == "pending"
    assert first_clause in (await page.text_content("#d-reason") or "")
    assert await page.is_visible("#d-unplaced") and not await page.is_visible("#d-placement")
    assert await page.text_content("#d-logs") == "no output"
    assert await page.text_content("#d-name") == "ckpt-72"
    await page.screenshot(path=artifacts_dir() / "dashboard-pending.png", full_page=True)

    assert await page.evaluate("window.__sameDocument") is True, "the page updated without a reload"
    assert not problems, problems
    await page.close()
    assert not service_errors(caplog.records)


async def test_through_a_router_the_dashboard_shows_one_cell_and_a_row_of_every_cells_summary(
    open_stack: StackFactory, browser: Browser, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS_YAML)
    cell = {"tokens_file": str(tokens)}
    c0 = await open_stack(domains=1, token=ADMIN, settings=cell)
    c1 = await open_stack(domains=2, token=ADMIN, settings={**cell, "cell": "c1"})
    job = await c1.submit(nvlink("in-c1", "ops", 8))
    await c1.wait_state(job, {"running"})
    router = RouterServer(Router(Cells(gateways=(("c0", c0.url), ("c1", c1.url)), homes={})), "127.0.0.1", 0)
    await router.start()
    page = await browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
    page.set_default_timeout(WAIT_MS)
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    try:
        # the router's first cell by default: its one domain, and a link per cell with its figures
        await page.goto(f"{router.url}/?token={ADMIN}")
        await page.wait_for_function("document.querySelectorAll('#cells a').length === 2")
        assert await page.locator("#domains .domain").count() == 1
        links = await page.eval_on_selector_all("#cells a", "as => as.map(a => [a.dataset.cell, a.className])")
        assert links == [["c0", "current"], ["c1", ""]], links
        assert "8/144 GPUs busy" in (await page.text_content("#cells a[data-cell=c1]") or "")
        # a click on c1: its two domains, its job's cells
        await page.locator("#cells a[data-cell=c1]").click()
        await page.wait_for_function("document.querySelectorAll('#domains .domain').length === 2")
        await wait_cells(page, job, 8)
        assert await page.get_attribute("#cells a.current", "data-cell") == "c1"
        assert page.url == f"{router.url}/dashboard?cell=c1"
        await page.wait_for_selector('#live[data-live="1"]')  # every cell's events, merged by the router
        await page.screenshot(path=artifacts_dir() / "dashboard-cells.png", full_page=True)
        assert not problems, problems
    finally:
        await page.close()
        await router.stop()
