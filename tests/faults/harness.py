"""What the fault tests share beyond the burst: killing a service's process and waiting for it again, for the
system to settle, and asserting a history sound."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from pathlib import Path
from typing import Any

import msgspec

from shared.schemas import AGENT_COMMANDS, JobState, RankExited, RankStarted, StartRank
from tests.e2e.conftest import E2E, TERMINAL, wait_until
from tests.faults.burst import Burst, mixed_burst
from tests.faults.workflows import Workflows
from tests.history import History, Logged, Recorder, check, summary

JOBS = 100  # the burst of every fault test, on 2 NVLink domains of 18 four-GPU nodes


def started_count(log_dir: Path, name: str) -> int:
    """How often the child process `name` logged that it started (its log is appended across restarts)."""
    path = log_dir / f"{name}.log"
    return path.read_text(errors="replace").count(f"rackscale.runtime: {name} started") if path.exists() else 0


async def wait_started(e2e: E2E, name: str, before: int, timeout: float = 60.0) -> None:
    """Until the child process `name` started once more than `before` times (its consumers bound, or for the
    gateway its port answering /readyz)."""

    async def probe() -> bool:
        if started_count(e2e.log_dir, name) <= before:
            return False
        if name != "gateway":
            return True
        try:
            async with e2e.http.get(f"{e2e.url}/readyz") as r:
                return r.status == 200
        except OSError:
            return False

    await wait_until(probe, f"{name} started again", timeout)


def victim_process(victim: str) -> dict[str, Any]:
    """`open_stack` options running `victim` as a real child process (every other service in the test's own)."""
    return {
        "in_process": tuple(s for s in ("inventory", "placement", "queue", "gateway") if s != victim),
        "migration": "process" if victim == "migration" else "in_process",
    }


async def freeze_kill_restart(e2e: E2E, victim: str, frozen_s: float, down_s: float) -> None:
    """SIGSTOP the child process `victim` for `frozen_s` (what the server delivers to it then is in its hands,
    unacked), SIGKILL it, start it again `down_s` later and wait until it is up."""
    before = started_count(e2e.log_dir, victim)
    os.kill(e2e.stack.processes[victim].pid, signal.SIGSTOP)
    await asyncio.sleep(frozen_s)
    e2e.stack.kill_process(victim)
    await asyncio.sleep(down_s)
    e2e.stack.start_process(victim)
    await wait_started(e2e, victim, before)


async def wait_ready(e2e: E2E, nodes: int) -> None:
    """The gateway answers (a child process takes a while) and `nodes` nodes are up."""

    async def answers() -> bool:
        try:
            async with e2e.http.get(f"{e2e.url}/readyz") as r:
                return r.status == 200
        except OSError:
            return False

    await wait_until(answers, "the gateway to answer /readyz", 60)
    await e2e.wait_nodes(nodes)


async def settled(e2e: E2E, timeout: float = 90.0) -> None:
    """Until placement handled every order (redeliveries included) and the agents answered every StartRank
    sent with a RankStarted or RankExited: a late second run would be in the history by then."""
    js, names = e2e.nc.jetstream(), e2e.names

    async def orders_handled() -> bool:
        info = await js.consumer_info(names.stream_for(names.orders), names.consumer("placement", "orders"))
        return info.num_pending == 0 and info.num_ack_pending == 0

    await wait_until(orders_handled, "placement to handle every order (redeliveries included)", timeout)

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
        return None if sent - answered else sent

    await wait_until(commands_answered, "a RankStarted or RankExited for every StartRank sent", timeout)


def assert_sound(history: History, per_property: int = 6) -> None:
    """No violation; else the first few of each property, with how many there are of each."""
    violations = check(history)
    print(summary(history))  # shown with a failure (and with -s)
    if not violations:
        return
    groups: dict[str, list[str]] = {}
    for v in violations:
        groups.setdefault(v[:3], []).append(v)
    counts = ", ".join(f"{p} {len(vs)}" for p, vs in groups.items())
    shown = "\n".join(v for vs in groups.values() for v in vs[:per_property])
    raise AssertionError(f"{len(violations)} violations of the history ({counts}; {summary(history)}), e.g.:\n{shown}")


def plant_double_booking(history: History) -> History:
    """The history with one GPU double-booked: a job `planted` placed on the GPUs of the first job placed, right
    after it, and its rank running on them alongside that job's rank (to show the checker catches it)."""
    i, victim = next((i, le) for i, le in enumerate(history.job_events) if le.event.state is JobState.PLACED)
    ev = victim.event
    planted = Logged(victim.seq, victim.at, msgspec.structs.replace(ev, job_id="planted"))
    node = ev.nodes[0].node
    start = next(r for r in history.rank_events if r.job_id == ev.job_id and r.attempt == ev.attempt and r.node == node)
    rank = RankStarted(job_id="planted", attempt=ev.attempt, node=node, rank=0, pid=1, at=start.at)
    return dataclasses.replace(
        history,
        job_events=[*history.job_events[: i + 1], planted, *history.job_events[i + 1 :]],
        rank_events=[*history.rank_events, rank],
    )


def plant_early_start(history: History, job: str) -> History:
    """The history with `job`'s first `placed` event copied to the head of the log: it started before anything it
    waited for had ended (to show the arrays and dependencies checks catch it)."""
    first = next(le for le in history.job_events if le.event.job_id == job and le.event.state is JobState.PLACED)
    return dataclasses.replace(history, job_events=[Logged(0, first.at, first.event), *history.job_events])


async def jobs_at_end(e2e: E2E, ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """The jobs' views once every one is terminal, or whatever they are at the deadline (errors ignored): for
    faults whose outcome the history checker judges, so a stuck job doesn't end the test before it."""
    deadline = time.monotonic() + timeout
    jobs: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            every = await e2e.all_jobs()
            jobs = {i: every[i] for i in ids if i in every}
            if len(jobs) == len(ids) and all(j["state"] in TERMINAL for j in jobs.values()):
                break
        await asyncio.sleep(0.5)
    return jobs


async def finish(e2e: E2E, rec: Recorder, burst: Burst, end_wait_s: float = 60.0) -> dict[str, dict[str, Any]]:
    """Give the jobs `end_wait_s` to end and the system to settle, then assert the history sound (the burst's
    workflows too: arrays within their caps, dependants after what they waited for) and every submit accepted;
    the burst's jobs' views at the end."""
    side = burst.workflows.jobs if burst.workflows is not None else []
    jobs = await jobs_at_end(e2e, [*burst.accepted, *side], end_wait_s)
    with contextlib.suppress(AssertionError):
        await settled(e2e, timeout=20)
    history = await rec.history(e2e.nc, e2e.names)
    assert_sound(history)
    assert not burst.refused, f"{len(burst.refused)} valid submits refused, e.g. {burst.refused[:3]}"
    assert_workflows(burst, history, jobs)
    return {j: v for j, v in jobs.items() if j in burst.spec}


def assert_workflows(burst: Burst, history: History, views: dict[str, dict[str, Any]]) -> None:
    """The burst's arrays and dependencies as the history shows them (tests/faults/workflows.py)."""
    if burst.workflows is None:
        return
    violations = burst.workflows.check(history, views)
    assert not violations, f"{len(violations)} violations by arrays and dependencies, e.g.:\n" + "\n".join(
        violations[:10]
    )


async def under_burst(e2e: E2E, seed: int) -> tuple[Recorder, Burst]:
    """A recorder whose warm-up job succeeded (the system serves), and the burst to run under the fault, with
    arrays and dependencies beside it."""
    rec = Recorder(e2e.http, lambda: e2e.url)
    warm = await rec.submit({"name": "warm-up", "tenant": "alpha", "gpus": 1, "duration_s": 0.05})
    await e2e.wait_state(warm, {"succeeded"})
    return rec, Burst(rec, mixed_burst(JOBS, seed=seed), workflows=Workflows(rec))
