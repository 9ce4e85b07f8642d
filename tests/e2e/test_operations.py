"""Operator actions through the API on a running system (issue #3, acceptance 2 and 4).

- cancel frees the job's GPUs at once and stops its ranks;
- drain keeps new work off a whole NVLink domain; undrain lets it back.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.schemas import RankExited
from tests.e2e.conftest import E2E, StackFactory, domain_of, placements, service_errors, wait_until

pytestmark = pytest.mark.asyncio


def job_domains(view: dict[str, Any]) -> set[str]:
    return {domain_of(p["node"]) for p in view["allocation"]}


def gpus_of(view: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["node"], g) for p in view["allocation"] for g in p["gpus"]}


def cluster_owners(cluster: dict[str, Any]) -> dict[tuple[str, int], str]:
    return {
        (n["name"], g["index"]): g["job"] for d in cluster["domains"] for n in d["nodes"] for g in n["gpus"] if g["job"]
    }


async def test_cancel_frees_gpus_and_stops_the_ranks(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    e2e: E2E = await open_stack(domains=2)
    job = await e2e.submit({"name": "long", "tenant": "ops", "gpus": 8, "duration_s": 300})
    running = await e2e.wait_state(job, {"running"})
    held = gpus_of(running)
    assert len(held) == 8
    owners = cluster_owners(await e2e.cluster())
    assert {k for k, v in owners.items() if v == job} == held, "the cluster view shows the running job's GPUs"

    status, body = await e2e.cancel(job)
    assert status == 202, body
    view = await e2e.wait_state(job, {"cancelled"})
    assert view["reason"], view

    async def freed() -> bool:
        c = await e2e.cluster()
        return job not in cluster_owners(c).values() and all(a["job_id"] != job for a in c["allocations"])

    await wait_until(freed, f"the GPUs of cancelled job {job} free in /v1/cluster")

    ranks = len(running["allocation"])

    def stopped(evs: list[Any]) -> bool:
        exits = {e.rank for e in evs if isinstance(e, RankExited) and e.job_id == job}
        return exits == set(range(ranks))

    evs = await e2e.wait_events(e2e.names.agent_events, stopped, f"RankExited for every rank of {job}")
    exits = [e for e in evs if isinstance(e, RankExited) and e.job_id == job]
    assert all(e.exit_code != 0 for e in exits), f"the ranks were stopped, not left to finish: {exits}"

    status, body = await e2e.cancel(job)
    assert status == 409, body
    assert not service_errors(caplog.records)


async def test_drain_keeps_new_jobs_off_a_domain_until_undrained(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    e2e: E2E = await open_stack(domains=2)
    d00 = [f"d00-n{i:02d}" for i in range(18)]
    for node in d00:
        assert (await e2e.admin(node, "drain"))["state"] == "draining"
    cluster = await e2e.cluster()
    states = {n["name"]: n["state"] for d in cluster["domains"] for n in d["nodes"]}
    assert all(states[n] == "draining" for n in d00), states

    # one 16-node job fills d01; a second one has nowhere to go but the drained d00
    first = await e2e.submit({"name": "big-1", "tenant": "ops", "gpus": 64, "duration_s": 300})
    view = await e2e.wait_state(first, {"running"})
    assert job_domains(view) == {"d01"}, view["allocation"]
    second = await e2e.submit({"name": "big-2", "tenant": "ops", "gpus": 64, "duration_s": 300})
    # small jobs still run, on what d01 has left
    small = await e2e.submit_all(
        {"name": f"small-{i}", "tenant": "ops", "gpus": g, "duration_s": 0.1, "topology": {"nvlink": nv}}
        for i, (g, nv) in enumerate([(1, "none"), (2, "preferred"), (4, "required"), (8, "required")] * 3)
    )
    done = await e2e.wait_terminal(small)
    assert {v["state"] for v in done.values()} == {"succeeded"}, done
    assert all(job_domains(v) == {"d01"} for v in done.values()), [v["allocation"] for v in done.values()]

    # the queue has looked at the second job many times since and still keeps it off d00
    queue = e2e.stack.services["queue"]
    seen = queue.cycles  # type: ignore[attr-defined]
    await wait_until(lambda: _at_least(queue, seen + 10), "ten more scheduling cycles")
    view = await e2e.job(second)
    assert view["state"] == "pending" and not view["allocation"], view

    for node in d00:
        assert (await e2e.admin(node, "undrain"))["state"] == "up"
    view = await e2e.wait_state(second, {"running"})
    assert job_domains(view) == {"d00"}, view["allocation"]

    # the event log agrees: nothing was ever placed on d00 before the undrain
    placed = placements(await e2e.job_events())
    for job_id in [first, *small]:
        for alloc in placed[job_id]:
            assert {domain_of(ng.node) for ng in alloc} == {"d01"}, (job_id, alloc)
    for job_id in (first, second):
        status, _ = await e2e.cancel(job_id)
        assert status == 202
    assert not service_errors(caplog.records)


async def _at_least(queue: Any, cycles: int) -> bool:
    return bool(queue.cycles >= cycles)
