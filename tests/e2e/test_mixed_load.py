"""300 jobs of mixed shapes through the whole system on a 4-domain fleet (issue #3, acceptance 1).

Every job reaches the terminal state it should (a failing command → failed, everything else → succeeded),
and the event log proves the placements sound: replayed in stream order, no GPU is ever held by two jobs,
required-NVLink jobs stay inside one domain and segmented jobs split into whole segments per domain.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from tests.e2e.conftest import (
    E2E,
    StackFactory,
    domain_of,
    double_bookings,
    placements,
    service_errors,
    wait_until,
)

pytestmark = pytest.mark.asyncio

OK_CMD = ["python3", "-c", "import os,sys; sys.exit(0)"]
FAIL_CMD = ["python3", "-c", "import sys; sys.exit(3)"]
TENANTS = ("alpha", "beta", "gamma")


def mixed_jobs(seed: int = 20240603) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    jobs: list[dict[str, Any]] = []

    def add(gpus: int, topology: dict[str, Any] | None = None, **extra: Any) -> None:
        body: dict[str, Any] = {
            "name": f"mix-{len(jobs)}",
            "tenant": rng.choice(TENANTS),
            "gpus": gpus,
            "priority": rng.choice((0, 0, 0, 5, 10, -5)),
            "duration_s": round(rng.uniform(0.05, 0.5), 3),
        }
        if topology is not None:
            body["topology"] = topology
        body.update(extra)
        jobs.append(body)

    for _ in range(60):
        add(1, {"nvlink": rng.choice(("required", "preferred", "none"))})
    for _ in range(50):
        add(2, {"nvlink": rng.choice(("required", "preferred", "none"))})
    for _ in range(50):
        add(4)
    for _ in range(80):
        add(rng.choice((8, 12, 16, 24, 32, 48, 64)))  # required NVLink (the default)
    for _ in range(20):
        add(rng.choice((8, 16, 32)), {"nvlink": "preferred"})
    for _ in range(10):
        add(rng.choice((8, 16)), {"nvlink": "none"})
    for _ in range(4):
        add(128, {"nvlink": "required", "segment": 16})
    for _ in range(20):
        add(rng.choice((1, 2, 4, 8)), command=OK_CMD)
    for _ in range(6):
        add(rng.choice((1, 4, 8)), command=FAIL_CMD)
    assert len(jobs) == 300
    rng.shuffle(jobs)
    return jobs


async def test_300_mixed_jobs_end_as_expected_and_never_share_a_gpu(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    e2e: E2E = await open_stack(domains=4)
    bodies = mixed_jobs()
    ids = await e2e.submit_all(bodies)
    spec = dict(zip(ids, bodies, strict=True))

    jobs = await e2e.wait_terminal(ids, timeout=120)

    wrong = {}
    for job_id, view in jobs.items():
        expected = "failed" if spec[job_id].get("command") == FAIL_CMD else "succeeded"
        if view["state"] != expected:
            wrong[job_id] = (expected, view["state"], view["reason"])
        elif expected == "succeeded":
            assert set(view["exit_codes"].values()) <= {0}, view
            assert len(view["exit_codes"]) == len(view["allocation"]), view
    assert not wrong, f"{len(wrong)} jobs ended in the wrong state: {dict(list(wrong.items())[:10])}"

    # every GPU is handed back once everything ended
    async def released() -> bool:
        c = await e2e.cluster()
        return not c["allocations"] and c["utilisation"]["busy"] == 0

    await wait_until(released, "every GPU free again")

    events = await e2e.job_events()
    problems = double_bookings(events)
    assert not problems, f"{len(problems)} double bookings in the event log: {problems[:10]}"

    placed = placements(events)
    unplaced = {j: [(e.state.value, e.attempt) for e in events if e.job_id == j] for j in set(ids) - set(placed)}
    assert not unplaced, f"{len(unplaced)} jobs ended without a placed event: {dict(list(unplaced.items())[:5])}"
    for job_id, allocations in placed.items():
        body = spec[job_id]
        topo = body.get("topology", {})
        nvlink, segment = topo.get("nvlink", "required"), topo.get("segment")
        for alloc in allocations:
            gpus = sum(len(ng.gpus) for ng in alloc)
            assert gpus == body["gpus"], (job_id, body, alloc)
            assert len({ng.node for ng in alloc}) == len(alloc), f"{job_id} names a node twice: {alloc}"
            per_domain = Counter(domain_of(ng.node) for ng in alloc)
            if segment is not None:
                assert all(n % segment == 0 for n in per_domain.values()), (
                    f"{job_id} splits a segment of {segment} nodes: {dict(per_domain)}"
                )
            elif nvlink == "required":
                assert len(per_domain) == 1, f"required-NVLink {job_id} spans domains {dict(per_domain)}"

    # the system got there without a scheduling cycle (or any other loop) failing on the way
    errors = service_errors(caplog.records)
    assert not errors, f"{len(errors)} errors logged by the services, e.g. {errors[:3]}"
