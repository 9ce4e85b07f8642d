"""SIGKILL a service in the middle of a burst and start it again (issue #3, acceptance 5).

The service runs as a real child process (`Stack.start_process`), so the kill is honest: whatever it had
fetched and not acked comes back from JetStream to the restarted process. Every accepted job must still
reach its end, and none may run twice: per job, RankStarted events come from one attempt only, and each
rank of that attempt started once.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import pytest

from shared.schemas import RankStarted
from tests.e2e.conftest import E2E, StackFactory, double_bookings, service_errors

pytestmark = pytest.mark.asyncio

JOBS = 100
KILL_AFTER = 30
RESTART_AFTER = 60
OK_CMD = ["python3", "-c", "import sys; sys.exit(0)"]
CONSUMERS = {  # the durable consumers of each service: (subject, durable name's `what`)
    "queue": [("job_submit", "submit"), ("placement_events", "placement"), ("agent_events", "agent")],
    "placement": [("orders", "orders")],
}


def burst(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(JOBS):
        body: dict[str, Any] = {
            "name": f"burst-{i}",
            "tenant": rng.choice(("a", "b")),
            "gpus": rng.choice((1, 2, 4, 8)),
            "duration_s": round(rng.uniform(0.05, 0.3), 3),
        }
        if i % 10 == 0:
            body["command"] = OK_CMD
        out.append(body)
    return out


@pytest.mark.parametrize("victim", ["queue", "placement"])
async def test_sigkill_mid_burst_loses_nothing_and_runs_nothing_twice(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, victim: str
) -> None:
    in_process = tuple(s for s in ("inventory", "placement", "queue", "gateway") if s != victim)
    e2e: E2E = await open_stack(domains=2, in_process=in_process)
    stack = e2e.stack

    # the child is up and serving before the burst
    warm = await e2e.submit({"name": "warm-up", "tenant": "a", "gpus": 1, "duration_s": 0.05})
    await e2e.wait_state(warm, {"succeeded"})

    bodies = burst(seed=7 if victim == "queue" else 8)
    accepted = await e2e.submit_all(bodies[:KILL_AFTER], concurrency=8)
    # more of the burst keeps coming while the victim is killed with work in hand (messages delivered to it
    # and not acked yet: they must come back to the restarted process), and while it is down
    killer = asyncio.create_task(_kill_with_work_in_hand(e2e, victim))
    accepted += await e2e.submit_all(bodies[KILL_AFTER:RESTART_AFTER], concurrency=2)
    await killer
    stack.start_process(victim)
    accepted += await e2e.submit_all(bodies[RESTART_AFTER:], concurrency=8)
    assert len(set(accepted)) == JOBS

    jobs = await e2e.wait_terminal([warm, *accepted], timeout=120)
    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    assert not bad, f"{len(bad)} jobs did not succeed: {dict(list(bad.items())[:10])}"

    # none ran twice: one attempt per job, each of its ranks started once
    starts: dict[str, list[RankStarted]] = defaultdict(list)
    for ev in await e2e.decoded(e2e.names.agent_events):
        if isinstance(ev, RankStarted):
            starts[ev.job_id].append(ev)
    twice = {}
    for job_id, view in jobs.items():
        evs = starts.get(job_id, [])
        attempts = {e.attempt for e in evs}
        ranks = sorted(e.rank for e in evs)
        if attempts != {view["attempt"]} or ranks != list(range(len(view["allocation"]))):
            twice[job_id] = sorted((e.attempt, e.rank, e.node) for e in evs)
    assert not twice, f"{len(twice)} jobs started more (or less) than once: {dict(list(twice.items())[:5])}"

    problems = double_bookings(await e2e.job_events())
    assert not problems, problems[:10]
    assert not service_errors(caplog.records)


async def _kill_with_work_in_hand(e2e: E2E, victim: str, timeout: float = 10.0) -> None:
    """SIGKILL `victim` as soon as one of its consumers has delivered messages it hasn't acked yet (at the
    deadline regardless: the kill then still lands mid-burst)."""
    js, names = e2e.nc.jetstream(), e2e.names
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for attr, what in CONSUMERS[victim]:
            subject = getattr(names, attr)
            info = await js.consumer_info(names.stream_for(subject), names.consumer(victim, what))
            if info.num_ack_pending:
                e2e.stack.kill_process(victim)
                return
        await asyncio.sleep(0.001)
    e2e.stack.kill_process(victim)
