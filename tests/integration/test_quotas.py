"""Per-tenant quotas hold under a burst: the whole system (real NATS, Redis, services, simulated agents).

Quotas come from RACKSCALE_TENANTS_FILE; the queue hands them to the core's cycle, which enforces them.
A burst of submits from one tenant never holds more than its quota — checked live against placement's
allocations (the GPUs actually handed out) and afterwards against the jobs' event log — while another
tenant without a quota runs beside it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from shared.schemas import JobState
from tests.e2e.conftest import HOLDING, StackFactory, open_stack  # noqa: F401 (open_stack: a fixture)

pytestmark = pytest.mark.asyncio

QUOTA = 16


async def test_a_tenants_quota_holds_under_a_burst(open_stack: StackFactory, tmp_path: Path) -> None:  # noqa: F811
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(f"tenants:\n  alice: {{quota_gpus: {QUOTA}}}\n")
    e2e = await open_stack(domains=2, settings={"tenants_file": str(tenants)})
    await e2e.wait_nodes(36)
    burst = [{"name": f"b{i}", "tenant": "alice", "gpus": 8, "duration_s": 0.5} for i in range(12)]
    other = {"name": "big", "tenant": "bob", "gpus": 32, "duration_s": 1.0}
    ids = await e2e.submit_all([*burst, other], concurrency=13)
    alice = set(ids[:-1])

    peak_live, quota_reasons = 0, set()
    done = asyncio.Event()

    async def watch() -> None:
        nonlocal peak_live
        while not done.is_set():
            cluster = await e2e.cluster()
            held = sum(len(p["gpus"]) for a in cluster["allocations"] if a["job_id"] in alice for p in a["nodes"])
            assert held <= QUOTA, f"alice holds {held} GPUs, quota {QUOTA}: {cluster['allocations']}"
            peak_live = max(peak_live, held)
            for j in (await e2e.all_jobs()).values():
                if j["state"] == "pending" and "quota" in j["reason"]:
                    quota_reasons.add(j["reason"])
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        jobs = await e2e.wait_terminal(ids)
    finally:
        done.set()
        await watcher  # re-raises a quota breach seen live
    assert {j["state"] for j in jobs.values()} == {"succeeded"}, {i: j["state"] for i, j in jobs.items()}
    assert quota_reasons, "the burst waited at the quota with the reason saying so"
    assert any(f"of {QUOTA} GPUs in use" in r for r in quota_reasons), quota_reasons

    # the event log, replayed: at no point did alice's placed/running jobs hold more than the quota
    holding: dict[str, int] = {}
    peak_log = 0
    for ev in await e2e.job_events():
        if ev.job_id not in alice:
            continue
        if ev.state in HOLDING:
            holding[ev.job_id] = sum(len(ng.gpus) for ng in ev.nodes)
        elif ev.state is not JobState.PLACED:
            holding.pop(ev.job_id, None)
        peak_log = max(peak_log, sum(holding.values()))
        assert peak_log <= QUOTA, f"alice held {peak_log} GPUs at {ev}"
    assert peak_log == QUOTA, "the quota was reached (the burst is big enough to test it)"
