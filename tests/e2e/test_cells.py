"""Two scheduling cells on one NATS and one Valkey (issue 24's scale-out: a fleet past one queue leader is split
into cells). Each cell is a whole system of its own — queue leader, placement, inventory, gateway, agents — under
the same prefix: its Redis keys carry its hash tag `{cell}` and its subjects and streams its name
(`Names.scope`), so the cells share the servers and nothing else. Both schedule their own fleets at once; a job
of one is unknown to the other; each log holds only its own cell's jobs; each cluster view only its nodes."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from shared.redis_client import redis_client
from shared.schemas import JobEvent
from tests.e2e.conftest import StackFactory

pytestmark = pytest.mark.asyncio


async def test_two_cells_share_one_nats_and_one_valkey_and_nothing_else(
    open_stack: StackFactory, redis_url: str
) -> None:
    c0 = await open_stack(domains=1)
    c1 = await open_stack(domains=1, settings={"cell": "c1"})
    n0, n1 = c0.names, c1.names
    assert (n0.prefix, n0.scope, n1.scope) == (n1.prefix, n0.prefix, f"{n0.prefix}.c1")
    assert not {s.name for s in n0.streams} & {s.name for s in n1.streams}

    bodies = [{"name": f"j{i}", "tenant": "t", "gpus": 8, "duration_s": 0.3} for i in range(6)]
    ids0, ids1 = await asyncio.gather(c0.submit_all(bodies), c1.submit_all(bodies))
    ended0, ended1 = await asyncio.gather(c0.wait_terminal(ids0, timeout=60), c1.wait_terminal(ids1, timeout=60))
    assert {j["state"] for j in [*ended0.values(), *ended1.values()]} == {"succeeded"}
    # a job of one cell is unknown to the other's gateway, and each cell's log holds only its own jobs
    assert await c1.maybe_job(ids0[0]) is None and await c0.maybe_job(ids1[0]) is None
    assert {e.job_id for e in await c0.job_events() if isinstance(e, JobEvent)} == set(ids0)
    assert {e.job_id for e in await c1.job_events() if isinstance(e, JobEvent)} == set(ids1)
    # each cell's view shows its own 18 nodes (the fleets have the same node names: only the cell tells them apart)
    for e2e in (c0, c1):
        view = await e2e.cluster()
        assert sum(len(d["nodes"]) for d in view["domains"]) == 18
    # every key of cell c1 carries its hash tag, and c0 wrote none of them
    r: aioredis.Redis = redis_client(redis_url, decode_responses=True)
    try:
        keys1 = [k async for k in r.scan_iter(match=f"{n1.prefix}:{{c1}}:*")]
        assert keys1 and all(k.startswith(f"{n1.prefix}:{{c1}}:") for k in keys1)
        assert [k async for k in r.scan_iter(match=f"{n1.prefix}:{{c0}}:job:{ids1[0]}")] == []
    finally:
        await r.aclose()
