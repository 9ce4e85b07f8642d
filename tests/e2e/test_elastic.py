"""An elastic gang on the running system (issue "Past the rigid ceiling", part 4): real ranks that start at
the job's least size, grow when room frees up and shrink for a reserved job; each resize is a move of the
job onto its new GPUs (checkpoint: the ranks get SIGTERM; restore: RACKSCALE_RESTORE names it) and the ranks
of each attempt see its world size in the launch contract.

One NVL72 domain of 18 nodes. B holds 14 (simulated, a few seconds), so E (4-16 nodes, one process per node)
starts on the 4 left. When B ends, the migration service grows E to 16 nodes. R (8 nodes, E's priority) then
waits with a reservation, and the next cycle shrinks E by 6 nodes to make R's room: E runs on 10, R on 8.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from shared.schemas import JobEvent
from tests.e2e.conftest import E2E, StackFactory, wait_until

pytestmark = pytest.mark.asyncio

RANK = r"""
import os, signal, sys, time
e = os.environ
print(f"attempt {e['RACKSCALE_ATTEMPT']} rank {e['RANK']} of {e['WORLD_SIZE']} nodes {e['NNODES']} "
      f"restore {e['RACKSCALE_RESTORE'] or '-'}", flush=True)
def stop(*_):
    print(f"attempt {e['RACKSCALE_ATTEMPT']} rank {e['RANK']} checkpointed", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.1)
"""


def _sizes(view: dict[str, Any]) -> tuple[int, int]:
    return view["attempt"], len(view["allocation"])


async def _log(e2e: E2E, job: str, attempts: range) -> list[str]:
    """The lines of these attempts (the log API answers one attempt at a time, by default the latest)."""
    out: list[str] = []
    for attempt in attempts:
        async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs", params={"attempt": attempt}) as r:
            assert r.status == 200, await r.text()
            out += [line.split(": ", 1)[1] for line in (await r.text()).splitlines()]
    return out


async def test_an_elastic_job_starts_at_its_least_grows_and_shrinks_for_a_reserved_job(
    open_stack: StackFactory,
) -> None:
    e2e: E2E = await open_stack(
        domains=1,
        settings={"checkpoint_s": 0.3, "restore_s": 0.3, "migration_interval_s": 0.5, "max_migrations": 8},
    )
    blocker = await e2e.submit({"name": "b", "tenant": "b", "gpus": 56, "duration_s": 6.0})
    await e2e.wait_state(blocker, {"running"})
    elastic = await e2e.submit(
        {
            "name": "elastic",
            "tenant": "e",
            "gpus": 64,
            "min_gpus": 16,
            "checkpointable": True,
            "expected_runtime_s": 3600,
            "command": [sys.executable, "-c", RANK],
        }
    )
    first = await e2e.wait_state(elastic, {"running"})
    assert _sizes(first) == (1, 4) and first["min_gpus"] == 16, first  # its least: all that was free

    # B ends: the migration service grows E into the room (a move: checkpoint, restore on 16 nodes)
    grown = await e2e.wait_state(elastic, {"running"}, timeout=60, check=lambda v: len(v["allocation"]) == 16)
    assert grown["attempt"] == 2, grown

    # R can't fit beside it (2 nodes free): reserved, then E shrinks by whole nodes to make its room
    reserved = await e2e.submit({"name": "r", "tenant": "r", "gpus": 32, "expected_runtime_s": 30, "duration_s": 30.0})
    ran = await e2e.wait_state(reserved, {"running"}, timeout=60)
    shrunk = await e2e.wait_state(elastic, {"running"}, timeout=60, check=lambda v: v["attempt"] == 3)
    assert len(shrunk["allocation"]) == 10, shrunk
    assert not {a["node"] for a in ran["allocation"]} & {a["node"] for a in shrunk["allocation"]}
    # the ranks kept the first 10 nodes of the 16 (a prefix: their places stay)
    assert [a["node"] for a in shrunk["allocation"]] == [a["node"] for a in grown["allocation"]][:10]

    # each step in its events, with why
    async def steps() -> list[str] | None:
        reasons = [ev.reason for ev in await e2e.job_events() if isinstance(ev, JobEvent) and ev.job_id == elastic]
        wanted = ("grown from 4 to 16 nodes", "shrunk from 16 to 10 nodes to make room for job " + reserved)
        return reasons if all(any(w in r for r in reasons) for w in wanted) else None

    await wait_until(steps, "the grow and shrink steps in the job's events")

    # and in its logs: every attempt's ranks saw their world size, the later ones restored from a checkpoint
    async def logged() -> list[str] | None:
        lines = await _log(e2e, elastic, range(1, 4))
        return lines if sum(line.startswith("attempt 3 rank") and "of 10" in line for line in lines) == 10 else None

    lines = await wait_until(logged, "attempt 3's ranks in the log")
    assert sum("attempt 1 rank" in x and "of 4 nodes 4 restore -" in x for x in lines) == 4, lines
    assert sum("attempt 2 rank" in x and "of 16 nodes 16 restore " + elastic in x for x in lines) == 16, lines
    assert sum("attempt 3 rank" in x and "restore " + elastic in x for x in lines) == 10, lines
    assert sum("attempt 1 rank" in x and "checkpointed" in x for x in lines) == 4, lines
    assert sum("attempt 2 rank" in x and "checkpointed" in x for x in lines) == 16, lines
    for job in (elastic, reserved):
        await e2e.cancel(job)
