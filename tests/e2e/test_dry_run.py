"""`POST /v1/jobs?dry_run=true` on the running system: where a job would go if it were submitted now.

Two NVL72 domains. A holds 14 nodes of one. A dry run of J (4 nodes, NVLink required) says where it would start;
nothing of it reaches the job list or the JOBS and EVENTS streams; then J submitted for real lands on exactly that
placement. A dry run of W (two segments of 18 nodes: both domains whole) says it would wait for A and J, with its
reservation's start and the queue's pending reason. An impossible shape gets the 422 a submit gets.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.schemas import JOB_INTAKE
from tests.e2e.conftest import E2E, StackFactory

pytestmark = pytest.mark.asyncio

DRY = "/v1/jobs?dry_run=true"


async def _dry(e2e: E2E, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with e2e.http.post(f"{e2e.url}{DRY}", json=body) as r:
        return r.status, dict(await r.json())


async def _logged_job_ids(e2e: E2E) -> set[str]:
    """Every job id the JOBS and EVENTS streams hold a message of."""
    names = e2e.names
    messages = [*await e2e.decoded(names.job_submit, JOB_INTAKE), *await e2e.decoded(names.events_all)]
    return {job_id for m in messages if (job_id := getattr(m, "job_id", None))}


async def test_a_dry_run_says_where_the_job_would_go_and_changes_nothing(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=2)
    a = await e2e.submit({"name": "a", "tenant": "t", "gpus": 56, "duration_s": 600})
    await e2e.wait_state(a, {"running"})

    j = {"name": "j", "tenant": "t", "gpus": 16, "topology": {"nvlink": "required"}, "duration_s": 600}
    status, dry = await _dry(e2e, j)
    assert status == 200, dry
    assert dry["start"] == "now" and dry["gpus"] == 16 and len(dry["allocation"]) == 4, dry
    assert len(dry["domains"]) == 1 and {p["domain"] for p in dry["allocation"]} == set(dry["domains"])
    assert dry["forecast_start"] is None and not dry["reserved"] and dry["reason"] == ""

    # the job does not exist: not in the job list, nothing of it in the JOBS or EVENTS streams
    assert set(await e2e.all_jobs()) == {a}
    assert await _logged_job_ids(e2e) == {a}

    # the same submit lands on that placement
    j_id = await e2e.submit(j)
    ran = await e2e.wait_state(j_id, {"running"})
    assert ran["allocation"] == dry["allocation"], (ran["allocation"], dry["allocation"])

    # a job that can't start now: the reservation's start and the queue's pending reason
    w = {"name": "w", "tenant": "t", "gpus": 144, "topology": {"segment": 18}, "expected_runtime_s": 60}
    status, later = await _dry(e2e, w)
    assert status == 200, later
    assert later["start"] == "later" and later["reserved"] and later["gpus"] == 144, later
    started = min(ran["started_at"], (await e2e.job(a))["started_at"])
    assert later["forecast_start"] >= started + 600  # when both A and J are expected to have ended
    assert sorted(later["domains"]) == ["d00", "d01"] and len(later["allocation"]) == 36
    assert later["reason"].startswith("needs 2 segments of 18 nodes, each in one NVLink domain")
    assert "reserved to start in" in later["reason"]

    # an impossible shape: the very 422 a submit gets, and still nothing submitted
    too_big = {"name": "x", "tenant": "t", "gpus": 76, "topology": {"nvlink": "required"}}
    status, refused = await _dry(e2e, too_big)
    async with e2e.http.post(f"{e2e.url}/v1/jobs", json=too_big) as r:
        assert (r.status, await r.json()) == (status, refused)
    assert status == 422 and refused["field"] is not None, refused
    assert set(await e2e.all_jobs()) == {a, j_id}
    assert await _logged_job_ids(e2e) == {a, j_id}
    for job in (a, j_id):
        await e2e.cancel(job)
