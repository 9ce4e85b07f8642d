"""SIGKILL a service in the middle of a burst and start it again (issue #3, acceptance 5).

The service runs as a real child process (`Stack.start_process`), so the kill is honest. It is frozen
(SIGSTOP) for a moment first while the burst goes on: what the server delivers to it then (its open pull
request takes up to a batch) is in its hands, unacked, when SIGKILL lands, and JetStream must deliver it
again to the restarted process (after the consumer's ack wait). Every accepted job must still reach its
end, and none may run twice: once every order and every agent command has been handled, per job the
RankStarted events come from one attempt only, and each rank of that attempt started once.
"""

from __future__ import annotations

import os
import random
import signal
from collections import defaultdict
from typing import Any

import pytest

from shared.schemas import AGENT_COMMANDS, RankExited, RankStarted, StartRank
from tests.e2e.conftest import E2E, StackFactory, double_bookings, service_errors, wait_until

pytestmark = pytest.mark.asyncio

JOBS = 100
KILL_AFTER = 30  # accepted before the victim is frozen
FROZEN = 10  # accepted while it is frozen (delivered to it, then lost with it)
RESTART_AFTER = 60  # accepted before it starts again
OK_CMD = ["python3", "-c", "import sys; sys.exit(0)"]


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
    os.kill(stack.processes[victim].pid, signal.SIGSTOP)
    accepted += await e2e.submit_all(bodies[KILL_AFTER : KILL_AFTER + FROZEN], concurrency=FROZEN)
    stack.kill_process(victim)
    accepted += await e2e.submit_all(bodies[KILL_AFTER + FROZEN : RESTART_AFTER], concurrency=8)
    stack.start_process(victim)
    accepted += await e2e.submit_all(bodies[RESTART_AFTER:], concurrency=8)
    assert len(set(accepted)) == JOBS

    jobs = await e2e.wait_terminal([warm, *accepted], timeout=120)
    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    assert not bad, f"{len(bad)} jobs did not succeed: {dict(list(bad.items())[:10])}"
    # redelivered messages may still be on their way: wait until placement has handled every order and
    # every StartRank it sent has been answered by the agent, so a late second run would be seen
    await _settled(e2e)

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


async def _settled(e2e: E2E) -> None:
    js, names = e2e.nc.jetstream(), e2e.names

    async def orders_handled() -> bool:
        info = await js.consumer_info(names.stream_for(names.orders), names.consumer("placement", "orders"))
        return info.num_pending == 0 and info.num_ack_pending == 0

    await wait_until(orders_handled, "placement to handle every order (redeliveries included)", timeout=90)

    async def commands_answered() -> set[tuple[str, int, int]] | None:
        sent = {
            (c.job_id, c.attempt, c.rank)
            for c in (AGENT_COMMANDS.decode(m.data) for m in await e2e.stream(names.agent_cmd_all))
            if isinstance(c, StartRank)
        }
        answered = {
            (e.job_id, e.attempt, e.rank)
            for e in await e2e.decoded(names.agent_events)
            if isinstance(e, RankStarted | RankExited)
        }
        missing = sent - answered
        return None if missing else sent

    await wait_until(commands_answered, "a RankStarted or RankExited for every StartRank sent")
