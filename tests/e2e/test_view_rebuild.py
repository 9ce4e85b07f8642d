"""Redis comes back empty under load, and the view is rebuilt from the log (issue 21, part 3).

A mixed burst (multi-node, checkpointable, both `on_node_failure` values) runs on 2 NVL72 domains; some jobs
have ended, some run, some wait. Then every key of the cell is deleted at once, as a Valkey restart without
persistence leaves it. The queue finds no view and rebuilds it from JetStream; meanwhile nothing is served
from Redis: a job that got its 202 answers 200 or 503 (Retry-After), never 404, and no GPU is handed out
(the commit script refuses). After it, every job that had ended reads as it did, every job ends, and the
event log shows no GPU held by two jobs at once.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from shared.redis_client import redis_client as make_redis_client
from shared.schemas import Fault
from tests.e2e.conftest import E2E, TERMINAL, StackFactory, double_bookings, wait_until
from tests.servers import snapshot, swap_in, wipe

pytestmark = pytest.mark.asyncio

JOBS = 40
STALE_S = 10.0  # how old the copy is when it takes Redis's place (a replica that fell this far behind)


def burst(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(JOBS):
        gpus = rng.choice((1, 4, 8, 16))
        out.append(
            {
                "name": f"burst-{i}",
                "tenant": rng.choice(("a", "b")),
                "gpus": gpus,
                "checkpointable": rng.random() < 0.5,
                "on_node_failure": rng.choice(("requeue", "fail")),
                "duration_s": rng.choice((0.2, 1.0, 3.0, 6.0)),
            }
        )
    return out


async def test_an_empty_redis_is_rebuilt_from_the_log_under_load(open_stack: StackFactory, redis_url: str) -> None:
    e2e: E2E = await open_stack(domains=2, settings={"missed_heartbeats": 50})
    ids = await e2e.submit_all(burst(7))

    async def some_ended() -> bool:
        jobs = await e2e.all_jobs()
        return len(jobs) == JOBS and sum(j["state"] in TERMINAL for j in jobs.values()) >= JOBS // 4

    await wait_until(some_ended, "a quarter of the burst ended")
    before = await e2e.all_jobs()
    ended_before = {j: v for j, v in before.items() if v["state"] in TERMINAL}

    # Valkey restarted empty: every key of the cell gone at once
    deleted = await wipe(redis_url, e2e.names.prefix + "*")
    assert deleted > 0
    answers: dict[int, int] = {}
    probing = True

    async def probe() -> None:
        while probing:
            for job in ids:
                async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}") as r:
                    answers[r.status] = answers.get(r.status, 0) + 1
                    if r.status == 503:
                        assert r.headers.get("Retry-After"), "a 503 during the rebuild says when to come back"
            await asyncio.sleep(0.02)

    prober = asyncio.create_task(probe())

    async def ready() -> bool:
        async with e2e.http.get(f"{e2e.url}/readyz") as r:
            return r.status == 200

    await wait_until(ready, "the view rebuilt (readyz)")
    done = await e2e.wait_terminal(ids)
    probing = False
    await prober
    assert 404 not in answers, f"a job that exists answered 404 while the view was rebuilt: {answers}"
    assert set(answers) <= {200, 503}, answers

    for job, was in ended_before.items():
        now = done[job]
        assert (now["state"], now["attempt"], now["allocation"]) == (was["state"], was["attempt"], was["allocation"])
    assert all(v["state"] in TERMINAL for v in done.values())
    assert double_bookings(await e2e.job_events()) == []


async def test_drains_and_fatal_faults_outlive_an_empty_redis(open_stack: StackFactory, redis_url: str) -> None:
    """A node's verdicts are in the log (its last NodeChanged): the record its next registration makes again
    is still drained, and a GPU a fatal XID took out is still down (not cleared as by a new boot)."""
    e2e: E2E = await open_stack(domains=1, settings={"telemetry_s": 0.2, "missed_heartbeats": 50})
    drained, faulty = "d00-n03", "d00-n07"
    await e2e.admin(drained, "drain")
    fleet = e2e.stack.fleet
    assert fleet is not None and fleet.inject(Fault(node=faulty, gpu=2, xid=79)) == [faulty]

    async def nodes() -> dict[str, dict[str, Any]] | None:
        async with e2e.http.get(f"{e2e.url}/v1/cluster") as r:
            if r.status != 200:
                return None
            view = await r.json()
        return {n["name"]: n for d in view["domains"] for n in d["nodes"]}

    def verdicts_hold(seen: dict[str, dict[str, Any]] | None) -> bool:
        if seen is None or drained not in seen or faulty not in seen:
            return False
        return seen[drained]["state"] == "draining" and seen[faulty]["gpus"][2]["health"] == "down"

    async def before() -> bool:
        return verdicts_hold(await nodes())

    await wait_until(before, "the drain and the fatal XID in the cluster view")
    assert await wipe(redis_url, e2e.names.prefix + "*") > 0

    async def every_node_back() -> dict[str, dict[str, Any]] | None:
        seen = await nodes()
        return seen if seen is not None and len(seen) == 18 else None

    after = await wait_until(every_node_back, "every node registered again after the wipe")
    assert verdicts_hold(after), {n: after[n] for n in (drained, faulty)}
    assert sum(1 for n in after.values() if n["state"] == "draining") == 1


async def test_a_stale_copy_of_redis_is_caught_up_from_the_log(open_stack: StackFactory, redis_url: str) -> None:
    """Redis replaced by a copy taken 10 s before (a replica promoted before it caught up): the first
    commit or job write finds the view's clock behind what it saw, the view is marked behind, and the queue
    replays the log from the copy's position. Jobs that ended after the copy was taken end again (not run
    again), and no GPU is handed out twice on the stale allocations."""
    e2e: E2E = await open_stack(domains=2, settings={"missed_heartbeats": 50})
    bodies = burst(11)
    first = await e2e.submit_all(bodies[: JOBS // 2])

    async def some_running() -> bool:
        jobs = await e2e.all_jobs()
        return sum(j["state"] == "running" for j in jobs.values()) >= 4

    await wait_until(some_running, "jobs running before the copy is taken")
    client = make_redis_client(redis_url)
    try:

        async def position_recorded() -> bool:
            return int(await client.hget(e2e.names.view_key, "events_seq") or 0) > 0

        await wait_until(position_recorded, "the view's position recorded (the catch-up starts there)")
        copy = await snapshot(client, e2e.names.key_pattern)
        taken = time.monotonic()
        rest = await e2e.submit_all(bodies[JOBS // 2 :])

        async def moved_on() -> bool:
            jobs = await e2e.all_jobs()
            return sum(j["state"] in TERMINAL for i, j in jobs.items() if i in first) >= JOBS // 4

        await wait_until(moved_on, "jobs ended after the copy was taken")
        await asyncio.sleep(max(0.0, STALE_S - (time.monotonic() - taken)))
        ended = {i: j for i, j in (await e2e.all_jobs()).items() if j["state"] in TERMINAL}
        # the copy takes the place of what the system wrote since, at once (as a failover does)
        await swap_in(client, e2e.names.key_pattern, copy)
    finally:
        await client.aclose()

    left: dict[str, Any] = {}  # what hasn't ended, for the message if it never does

    async def every_job_ended() -> dict[str, dict[str, Any]] | None:
        async with e2e.http.get(f"{e2e.url}/v1/jobs", params={"limit": 500}) as r:
            if r.status != 200:
                return None
            jobs = {j["id"]: j for j in (await r.json())["jobs"]}
        left.clear()
        left.update({i: (j["state"], j["attempt"], j["reason"]) for i, j in jobs.items() if j["state"] not in TERMINAL})
        return jobs if len(jobs) == JOBS and not left else None

    try:
        done = await wait_until(every_job_ended, "every job ended after the stale copy")
    except AssertionError as e:
        raise AssertionError(f"{e}; not ended: {left}") from None
    assert set(done) == set(first) | set(rest)
    for job, was in ended.items():
        assert (done[job]["state"], done[job]["attempt"]) == (was["state"], was["attempt"]), (job, was, done[job])
    assert double_bookings(await e2e.job_events()) == []
