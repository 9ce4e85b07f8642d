"""SIGKILL each kind of service under a mixed burst and start it again (issue 21; was issue #3's test_crash).

The victim runs as a real child process (`Stack.start_process`), so the kill is honest. It is frozen
(SIGSTOP) for a moment first while the burst goes on: what the server delivers to it then (its open pull
request takes up to a batch) is in its hands, unacked, when SIGKILL lands, and JetStream must deliver it
again to the restarted process (after the consumer's ack wait). A killed gateway refuses connections until
it is back: the client retries its submits with an Idempotency-Key, as a client would.

The history checker (tests/history.py) proves the run sound: every accepted job readable and terminal, no
job on two allocations at once, no GPU in two live allocations, no 5xx outside the fault window. On top, no
node failed, so every job succeeds and none that can't be moved ran a second attempt; and the arrays and
dependencies submitted beside the burst (tests/faults/workflows.py) kept their caps and order.
"""

from __future__ import annotations

import pytest

from shared.embedded import free_port
from tests.e2e.conftest import E2E, StackFactory, service_errors
from tests.faults.burst import Burst, mixed_burst
from tests.faults.harness import (
    assert_sound,
    assert_workflows,
    freeze_kill_restart,
    plant_double_booking,
    plant_early_start,
    settled,
    victim_process,
    wait_ready,
)
from tests.faults.workflows import Workflows
from tests.history import Recorder, check, reruns

pytestmark = pytest.mark.asyncio

DOMAINS, NODES = 2, 18
JOBS = 100
KILL_AFTER = 30  # accepted before the victim is frozen
FROZEN_S = 1.0  # frozen this long while the burst goes on (what it is delivered then dies with it)
DOWN_S = 0.5  # dead this long before it starts again
SEEDS = {"gateway": 1, "queue": 7, "placement": 8, "inventory": 3, "migration": 4}


@pytest.mark.parametrize("victim", ["gateway", "queue", "placement", "inventory", "migration"])
async def test_sigkill_and_restart_under_a_burst_loses_nothing_and_runs_nothing_twice(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, victim: str
) -> None:
    e2e: E2E = await open_stack(
        domains=DOMAINS,
        nodes_per_domain=NODES,
        **victim_process(victim),
        # a gateway in a child process needs a port known to the test (and the same one after its restart)
        settings={"gateway_port": free_port()} if victim == "gateway" else None,
    )
    await wait_ready(e2e, DOMAINS * NODES)
    rec = Recorder(e2e.http, lambda: e2e.url)
    warm = await rec.submit({"name": "warm-up", "tenant": "alpha", "gpus": 1, "duration_s": 0.05})
    await e2e.wait_state(warm, {"succeeded"})

    workflows = Workflows(rec)  # arrays and dependencies beside the burst
    async with Burst(rec, mixed_burst(JOBS, seed=SEEDS[victim]), workflows=workflows) as burst:
        await burst.wait_accepted(KILL_AFTER)
        async with rec.fault(f"sigkill {victim}"):
            await freeze_kill_restart(e2e, victim, FROZEN_S, DOWN_S)
    accepted = [warm, *burst.accepted]
    assert not burst.refused, burst.refused[:5]
    assert len(accepted) == JOBS + 1

    every = await e2e.wait_terminal([*accepted, *workflows.jobs], timeout=120)
    jobs = {j: every[j] for j in accepted}
    # redelivered messages may still be on their way: once placement handled every order and the agents
    # answered every StartRank, a late second run would be in the history
    await settled(e2e)
    history = await rec.history(e2e.nc, e2e.names)
    assert_sound(history)
    # and the checker is not blind on this history: one GPU double-booked in it is caught, in the log and on the node
    caught = [v for v in check(plant_double_booking(history)) if v.startswith("(c)") and "planted" in v]
    assert len(caught) >= 2, caught
    assert_workflows(burst, history, every)
    # ... nor to a dependant that started before the array it waited for had ended
    after_sweep = next(j for j, d in workflows.depends.items() if d.startswith("afterany:"))
    early = workflows.check(plant_early_start(history, after_sweep), every)
    assert any(v.startswith(f"(f) {after_sweep} placed at event #0 before afterany:") for v in early), early

    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    assert not bad, f"{len(bad)} jobs did not succeed: {dict(list(bad.items())[:10])}"
    fixed = [j for j in accepted if not burst.spec.get(j, {}).get("checkpointable")]
    twice = reruns(history, fixed)
    assert not twice, f"{len(twice)} jobs that can't be moved ran more than one attempt: {twice[:5]}"
    assert not service_errors(caplog.records)
