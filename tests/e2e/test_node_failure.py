"""A node whose agent falls silent goes down, and its jobs follow their on_node_failure (issue #3, acceptance 3).

The agent is silenced the way a lost node or a network partition looks to the system: its heartbeats stop
(its stop_event is set, which ends the heartbeat loop) while nothing reports the ranks' end. The ranks are
commands that run long on attempt 1 only, so the first attempt can't finish by itself before the node is
declared down, and a requeued attempt finishes quickly elsewhere.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.schemas import JobState
from tests.e2e.conftest import E2E, StackFactory, service_errors, wait_until

pytestmark = pytest.mark.asyncio

LONG_ON_FIRST_ATTEMPT = [
    "python3",
    "-c",
    "import os,time; time.sleep(300 if os.environ['RACKSCALE_ATTEMPT'] == '1' else 0.1)",
]


def nodes_of(view: dict[str, Any]) -> set[str]:
    return {p["node"] for p in view["allocation"]}


async def test_silent_agent_node_goes_down_and_its_jobs_requeue_or_fail(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    e2e: E2E = await open_stack(domains=2, settings={"missed_heartbeats": 4})
    body = {"tenant": "ops", "gpus": 4, "command": LONG_ON_FIRST_ATTEMPT}
    requeue = await e2e.submit({**body, "name": "requeue-me", "on_node_failure": "requeue"})
    fail = await e2e.submit({**body, "name": "fail-me", "on_node_failure": "fail"})
    first = {job: await e2e.wait_state(job, {"running"}) for job in (requeue, fail)}
    silent = nodes_of(first[requeue]) | nodes_of(first[fail])
    assert len(silent) == 2, first

    fleet = e2e.stack.fleet
    assert fleet is not None
    for node in silent:
        fleet.agents[node].stop_event.set()  # its heartbeat loop ends; it reports nothing more

    async def down() -> bool:
        c = await e2e.cluster()
        states = {n["name"]: n["state"] for d in c["domains"] for n in d["nodes"]}
        return all(states[n] == "down" for n in silent)

    await wait_until(down, f"{sorted(silent)} marked down")

    failed = await e2e.wait_state(fail, {"failed", "succeeded", "cancelled"})
    assert failed["state"] == "failed", failed
    assert "went down" in failed["reason"], failed

    done = await e2e.wait_state(requeue, {"failed", "succeeded", "cancelled"})
    assert done["state"] == "succeeded", done
    assert done["attempt"] >= 2, done
    assert not nodes_of(done) & silent, f"the requeued attempt ran on a silent node: {done['allocation']}"

    events = [e for e in await e2e.job_events() if e.job_id == requeue]
    states = [(e.state, e.attempt) for e in events]
    assert (JobState.RUNNING, 1) in states, states
    requeued = states.index((JobState.RUNNING, 1)) + 1
    assert states[requeued][0] is JobState.PENDING and states[requeued][1] >= 2, states
    assert "went down" in events[requeued].reason, events[requeued]
    assert states[-3:] == [(JobState.PLACED, done["attempt"]), (JobState.RUNNING, done["attempt"]),
                           (JobState.SUCCEEDED, done["attempt"])], states  # fmt: skip

    fail_states = [e.state for e in await e2e.job_events() if e.job_id == fail]
    assert fail_states[-1] is JobState.FAILED and JobState.PENDING not in fail_states[1:], fail_states

    # both nodes' GPUs went back: nothing is held on a down node
    async def released() -> bool:
        c = await e2e.cluster()
        return not any(p["node"] in silent for a in c["allocations"] for p in a["nodes"])

    await wait_until(released, "no allocation left on the silent nodes")
    assert not service_errors(caplog.records)


async def test_agent_shutdown_requeues_or_fails_its_jobs_like_a_node_loss(open_stack: StackFactory) -> None:
    # a graceful agent stop (node taken out of service) kills its ranks: not the job's fault, so no plain failure
    e2e: E2E = await open_stack(domains=2)
    body = {"tenant": "ops", "gpus": 4, "command": LONG_ON_FIRST_ATTEMPT}
    requeue = await e2e.submit({**body, "name": "requeue-me", "on_node_failure": "requeue"})
    fail = await e2e.submit({**body, "name": "fail-me", "on_node_failure": "fail"})
    first = {job: await e2e.wait_state(job, {"running"}) for job in (requeue, fail)}
    stopped = nodes_of(first[requeue]) | nodes_of(first[fail])
    fleet = e2e.stack.fleet
    assert fleet is not None
    for node in stopped:
        await fleet.agents[node].stop(grace_s=5.0)

    failed = await e2e.wait_state(fail, {"failed", "succeeded", "cancelled"})
    assert failed["state"] == "failed", failed
    assert "stopped" in failed["reason"] and "exited with" not in failed["reason"], failed

    done = await e2e.wait_state(requeue, {"failed", "succeeded", "cancelled"})
    assert done["state"] == "succeeded", done
    assert done["attempt"] >= 2 and not nodes_of(done) & stopped, done
    states = [(e.state, e.attempt) for e in await e2e.job_events() if e.job_id == requeue]
    assert (JobState.RUNNING, 1) in states and (JobState.FAILED, 1) not in states, states
