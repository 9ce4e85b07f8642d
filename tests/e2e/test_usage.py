"""Usage accounting on the running system (issue 25, item 6): jobs of two tenants run and end (one cancelled while it
runs), then `GET /v1/usage` — JSON, CSV, and `rackscale usage` — matches GPU-hours worked out here from the EVENTS
stream's messages alone: per job attempt, from its first event holding GPUs (placed, running, migrating) to the
job's next event that doesn't show that attempt holding, times the GPUs of its allocation, cut at UTC midnight.
A user token sees only its tenant. Then Redis loses everything (a restart without persistence): the queue's leader
folds the log again and the same figures come back.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from services.cli.main import main as cli
from services.queue.service import QueueService
from shared.core.usage import tau
from shared.schemas import JobEvent, JobState
from tests.e2e.conftest import E2E, StackFactory, wait_until
from tests.servers import wipe

pytestmark = pytest.mark.asyncio

ADMIN, ALICE = "usage-admin-token-000001", "usage-alice-token-000001"
TOKENS = f"""
tokens:
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
  - {{token: "{ALICE}", tenant: alice, role: user}}
"""
DAY = 86400
HOLDING = {JobState.PLACED, JobState.RUNNING, JobState.MIGRATING}


def gpu_hours_from_the_log(events: list[JobEvent]) -> dict[tuple[str, int], tuple[float, set[str]]]:
    """(tenant, UTC day start) → (GPU-hours, jobs), from the job events in stream order (see the module doc)."""
    by_job: dict[str, list[JobEvent]] = {}
    for e in events:
        by_job.setdefault(e.job_id, []).append(e)
    out: dict[tuple[str, int], tuple[float, set[str]]] = {}
    for job, evs in by_job.items():
        done: set[int] = set()
        for i, e in enumerate(evs):
            if e.state not in HOLDING or e.attempt in done:
                continue
            done.add(e.attempt)
            end = next((x.at for x in evs[i + 1 :] if x.state not in HOLDING or x.attempt != e.attempt), None)
            assert end is not None, f"job {job} attempt {e.attempt} still holds GPUs: the test waits for every end"
            gpus = sum(len(ng.gpus) for ng in e.nodes)
            t = e.at
            while t < end:  # cut at midnight UTC
                day = math.floor(t / DAY) * DAY
                stop = min(end, day + DAY)
                hours, jobs = out.get((e.tenant, day), (0.0, set()))
                out[(e.tenant, day)] = (hours + gpus * (stop - t) / 3600.0, jobs | {job})
                t = stop
    return out


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).date().isoformat()


async def usage(e2e: E2E, params: dict[str, str], token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with e2e.http.get(f"{e2e.url}/v1/usage", params=params, headers=headers) as r:
        body = await r.text()
        if r.status == 503:
            assert r.headers.get("Retry-After"), "a 503 while the view is built says when to come back"
        if r.content_type == "text/csv":
            return r.status, body
        return r.status, (await r.json()) if body else None


def as_figures(rows: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[float, int]]:
    return {(r["tenant"], int(r["start"])): (float(r["gpu_hours"]), int(r["jobs"])) for r in rows}


def matches(got: dict[tuple[str, int], tuple[float, int]], want: dict[tuple[str, int], tuple[float, set[str]]]) -> bool:
    return set(got) == set(want) and all(
        math.isclose(got[k][0], want[k][0], rel_tol=1e-9, abs_tol=1e-9) and got[k][1] == len(want[k][1]) for k in want
    )


async def test_usage_matches_gpu_hours_from_the_log_and_survives_an_empty_redis(
    open_stack: StackFactory, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    e2e = await open_stack(domains=1, token=ADMIN, settings={"tokens_file": str(tokens), "missed_heartbeats": 50})
    bodies = [
        {"name": "a1", "tenant": "alice", "gpus": 8, "duration_s": 1.0},
        {"name": "a2", "tenant": "alice", "gpus": 4, "duration_s": 0.5},
        {"name": "a3", "tenant": "alice", "gpus": 16, "duration_s": 1.5},
        {"name": "b1", "tenant": "bob", "gpus": 4, "duration_s": 1.0},
        {"name": "b2", "tenant": "bob", "gpus": 12, "duration_s": 0.5},
    ]
    ids = await e2e.submit_all(bodies)
    long = await e2e.submit({"name": "b-long", "tenant": "bob", "gpus": 8, "duration_s": 600.0})
    await e2e.wait_state(long, ["running"])
    await asyncio.sleep(0.5)  # it holds its GPUs a while
    assert (await e2e.cancel(long))[0] == 202
    await e2e.wait_terminal([*ids, long])

    async def logged() -> list[JobEvent] | None:
        evs = [e for e in await e2e.job_events() if e.job_id in {*ids, long}]
        ended = {e.job_id for e in evs if e.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)}
        return evs if ended == {*ids, long} else None

    events = await wait_until(logged, "every job's end in the job log")
    want = gpu_hours_from_the_log(events)
    assert {t for t, _ in want} == {"alice", "bob"} and all(h > 0 for h, _ in want.values())
    first = min(e.at for e in events)
    span = {"from": iso(first - DAY), "to": iso(first + 2 * DAY)}

    last: Any = None

    async def agrees() -> bool:
        nonlocal last
        status, last = await usage(e2e, span)
        return status == 200 and matches(as_figures(last["rows"]), want)

    await wait_until(agrees, f"/v1/usage to match the log's GPU-hours {want}; last answer {last}")
    assert last["by"] == "day" and last["from"] == (math.floor(first / DAY) - 1) * DAY

    # the queue's leader orders tenants by the same GPU-seconds, decayed (7 days: seconds ago is all of it), in GPUs
    queue = e2e.stack.services["queue"]
    assert isinstance(queue, QueueService)
    shares = queue.usage.shares(time.time(), ["alice", "bob"])
    assert shares is not None and set(shares) == {"alice", "bob"}
    for tenant in ("alice", "bob"):
        gpu_s = 3600.0 * sum(h for (t, _), (h, _) in want.items() if t == tenant)
        assert math.isclose(shares[tenant] * tau(queue.usage.half_life_s), gpu_s, rel_tol=1e-3), (tenant, shares)

    # CSV, asked for either way
    status, text = await usage(e2e, {**span, "format": "csv"})
    assert status == 200
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["tenant", "period", "start", "gpu_hours", "jobs"]
    assert [(r["tenant"], r["period"]) for r in rows] == [(r["tenant"], r["period"]) for r in last["rows"]]
    from_csv = as_figures(rows)
    assert set(from_csv) == set(want)
    for key, (hours, jobs) in want.items():
        assert abs(from_csv[key][0] - hours) < 1e-6 and from_csv[key][1] == len(jobs), key
    async with e2e.http.get(f"{e2e.url}/v1/usage", params=span, headers={"Accept": "text/csv"}) as r:
        assert r.status == 200 and r.content_type == "text/csv" and await r.text() == text

    # a week's row is the sum of its days; a user sees only its tenant, and nothing of another's
    status, weekly = await usage(e2e, {**span, "by": "week"})
    assert status == 200
    for tenant in ("alice", "bob"):
        total = sum(h for (t, _), (h, _) in want.items() if t == tenant)
        assert math.isclose(sum(r["gpu_hours"] for r in weekly["rows"] if r["tenant"] == tenant), total, rel_tol=1e-9)
    status, mine = await usage(e2e, span, token=ALICE)
    assert status == 200 and {r["tenant"] for r in mine["rows"]} == {"alice"}
    assert matches(as_figures(mine["rows"]), {k: v for k, v in want.items() if k[0] == "alice"})
    status, theirs = await usage(e2e, {**span, "tenant": "bob"}, token=ALICE)
    assert status == 200 and theirs["rows"] == []

    # a bad parameter names itself
    status, err = await usage(e2e, {"by": "month"})
    assert status == 422 and err["field"] == "by"
    status, err = await usage(e2e, {"from": "2025-02-30"})
    assert status == 422 and err["field"] == "from"

    # `rackscale usage`, against the same gateway
    out: list[str] = []

    def run(*argv: str) -> int:
        return cli([*argv, "--url", e2e.url], out.append, out.append)

    monkeypatch.setenv("RACKSCALE_TOKEN", ADMIN)
    assert await asyncio.to_thread(run, "usage", "--from", span["from"], "--to", span["to"], "--csv") == 0
    assert "\n".join(out) + "\n" == text
    out.clear()
    assert await asyncio.to_thread(run, "usage", "--from", span["from"], "--to", span["to"], "--tenant", "bob") == 0
    table = out[0].splitlines()
    assert table[0].split() == ["PERIOD", "TENANT", "GPU-HOURS", "JOBS"]
    assert {line.split()[1] for line in table[1:]} == {"bob"}

    # Redis restarts empty: the usage view is folded again from the log, to the same figures
    assert await wipe(redis_url, e2e.names.prefix + "*") > 0
    answers: set[int] = set()

    async def back() -> bool:
        nonlocal last
        status, last = await usage(e2e, span)
        answers.add(status)
        return status == 200 and matches(as_figures(last["rows"]), want)

    await wait_until(back, f"/v1/usage after the wipe to match {want} again; last answer {last}")
    assert answers <= {200, 503}, answers
