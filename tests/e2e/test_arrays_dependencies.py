"""Job arrays and dependencies on the running system (issue 25, items 2 and 3; real NATS and Valkey).

An array of 20 capped at `%4` never has more than 4 tasks running — over the whole job log in stream order, and
over the ranks' own start and exit times — and does run 4 at once (the cap, not the room, is the limit: the
fleet has room for all 20); each task sees its index. `afterok` on a failed job cancels the dependant with the
reason; `afternotok` and `afterany` on it run after its end; a dependency on an array waits for every task;
singletons of one name and tenant run one at a time in submit order. The log checks are tests/history_rules.py's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from services.cli.main import main as cli_main
from shared.schemas import RankExited, RankStarted
from tests.e2e.conftest import E2E, StackFactory, service_errors, wait_until
from tests.history_rules import array_caps, dependencies, most_running

pytestmark = pytest.mark.asyncio

# each task writes what it was told of its array (named by its index), then runs a moment
TASK = r"""
import json, os, sys, time
e = os.environ
keys = [k for k in e if k.startswith(("RACKSCALE_ARRAY_", "SLURM_ARRAY_"))] + ["RACKSCALE_JOB_ID"]
json.dump({k: e[k] for k in keys}, open(os.path.join(sys.argv[1], e["RACKSCALE_ARRAY_TASK_ID"]), "w"))
time.sleep(float(sys.argv[2]))
"""
FAIL = [sys.executable, "-c", "import sys, time; time.sleep(1.0); sys.exit(3)"]


async def listing(e2e: E2E, **query: Any) -> tuple[int, dict[str, Any]]:
    async with e2e.http.get(f"{e2e.url}/v1/jobs", params={k: str(v) for k, v in query.items()}) as r:
        return r.status, dict(await r.json())


async def recorded(e2e: E2E, array: str, tasks: int) -> None:
    """Until the queue has written the array's tasks (before, its id is "not recorded yet": 503, as a job's)."""

    async def listed() -> bool:
        status, page = await listing(e2e, array=array)
        return status == 200 and page["total"] == tasks

    await wait_until(listed, f"array {array}'s {tasks} tasks recorded")


def rank_runs(events: list[Any]) -> dict[tuple[str, int, int], tuple[float, float | None]]:
    """(job, attempt, rank) → (started, exited) as the agents said (exited None: no exit heard)."""
    runs: dict[tuple[str, int, int], list[float | None]] = defaultdict(lambda: [None, None])
    for ev in events:
        if isinstance(ev, RankStarted):
            runs[(ev.job_id, ev.attempt, ev.rank)][0] = ev.at
        elif isinstance(ev, RankExited):
            runs[(ev.job_id, ev.attempt, ev.rank)][1] = ev.at
    return {k: (s, x) for k, (s, x) in runs.items() if s is not None}


async def test_an_array_of_20_with_a_cap_of_4_never_runs_more_than_4(
    open_stack: StackFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    e2e = await open_stack(domains=1)  # 72 GPUs: room for all 20 one-GPU tasks at once
    body = {
        "name": "sweep",
        "tenant": "a",
        "gpus": 1,
        "array": "0-19%4",
        "slurm_env": True,
        "command": [sys.executable, "-c", TASK, str(tmp_path), "0.6"],
    }
    async with e2e.http.post(f"{e2e.url}/v1/jobs", json=body) as r:
        accepted = await r.json()
        assert r.status == 202 and r.headers["Location"] == f"/v1/jobs?array={accepted['id']}", accepted
    array = accepted["id"]
    tasks = [f"{array}_{i}" for i in range(20)]
    await recorded(e2e, array, 20)
    # a job that waits for the whole array, submitted while it runs
    after = await e2e.submit(
        {"name": "after-sweep", "tenant": "a", "gpus": 1, "duration_s": 0.1, "dependency": f"afterok:{array}"}
    )

    # while it runs, a waiting task says the cap holds it, and the dependant what it waits for
    async def capped() -> str | None:
        _, page = await listing(e2e, array=array)
        return next((j["reason"] for j in page["jobs"] if j["reason"].startswith(f"array {array}: ")), None)

    reason = await wait_until(capped, "a task held by its array's cap")
    assert "of %4 running" in reason, reason
    await e2e.wait_state(after, {"pending"}, check=lambda j: j["reason"].startswith(f"waits for afterok: {array} ("))

    done = await e2e.wait_terminal([*tasks, after], timeout=120)
    assert {done[t]["state"] for t in tasks} == {"succeeded"}
    assert done[after]["state"] == "succeeded", done[after]

    # the cap over the whole log, in stream order (tests/history_rules.py (e)), and reached: 4 at once
    events = await e2e.job_events()
    assert array_caps(events, {array: 4}) == []
    assert most_running(events, dict.fromkeys(tasks, array))[array][0] == 4
    # ... and over the ranks' own lives: never 5 tasks' processes alive at once
    runs = rank_runs(await e2e.decoded(e2e.names.agent_events))
    assert {j for j, _, _ in runs} >= set(tasks)
    edges = sorted(
        (t, +1 if start else -1)
        for (j, _, _), (s, x) in runs.items()
        if j in tasks
        for t, start in ((s, True), (x if x is not None else float("inf"), False))
    )
    alive, most = 0, 0
    for _, step in edges:  # an exit and a start at the same instant: the exit first
        alive += step
        most = max(most, alive)
    assert most <= 4, f"{most} tasks' ranks alive at once"
    # the dependant started after every task ended (history_rules (f))
    assert dependencies(events, {after: f"afterok:{array}"}, {array: tasks}) == []

    # each task was told its index and its array, under both names
    for i, task in enumerate(tasks):
        seen = json.loads((tmp_path / str(i)).read_text())
        assert seen == {
            "RACKSCALE_JOB_ID": task,
            "RACKSCALE_ARRAY_JOB_ID": array,
            "RACKSCALE_ARRAY_TASK_ID": str(i),
            "RACKSCALE_ARRAY_TASK_COUNT": "20",
            "RACKSCALE_ARRAY_TASK_MIN": "0",
            "RACKSCALE_ARRAY_TASK_MAX": "19",
            "SLURM_ARRAY_JOB_ID": array,
            "SLURM_ARRAY_TASK_ID": str(i),
            "SLURM_ARRAY_TASK_COUNT": "20",
            "SLURM_ARRAY_TASK_MIN": "0",
            "SLURM_ARRAY_TASK_MAX": "19",
        }, (i, seen)

    # listing: the array's tasks in index order, each with its array; the array's id is no job
    status, page = await listing(e2e, array=array, limit=500)
    assert status == 200 and page["total"] == 20
    assert [(j["id"], j["array_id"], j["array_index"], j["array"]) for j in page["jobs"]] == [
        (t, array, i, "0-19%4") for i, t in enumerate(tasks)
    ]
    _, everything = await listing(e2e, limit=500)
    assert [j["id"] for j in everything["jobs"] if j["id"] in tasks] == tasks  # index order among all jobs too
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{array}") as r:
        err = await r.json()
        assert r.status == 404 and f"GET /v1/jobs?array={array}" in err["error"], err
    assert not service_errors(caplog.records)


async def test_cancel_an_array_or_one_task(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    out: list[str] = []

    async def cli(argv: list[str]) -> int:  # (the gateway serves on this loop: the CLI's blocking calls go aside)
        return int(await asyncio.to_thread(cli_main, argv, out.append, out.append))

    array = await e2e.submit({"name": "long", "tenant": "a", "gpus": 4, "array": "0-9%2", "duration_s": 300})
    tasks = [f"{array}_{i}" for i in range(10)]
    await recorded(e2e, array, 10)
    for task in tasks[:2]:
        await e2e.wait_state(task, {"running"})
    # one waiting task alone
    status, doc = await e2e.cancel(tasks[5])
    assert status == 202, doc
    await e2e.wait_state(tasks[5], {"cancelled"})
    # the CLI lists the array (`jobs --array`, and `job` of the array's id)
    assert await cli(["jobs", "--url", e2e.url, "--array", array]) == 0
    table = "\n".join(out)
    assert all(t in table for t in tasks) and f"array {array}: 2 of %2 running" in table, table
    out.clear()
    assert await cli(["job", "--url", e2e.url, array]) == 0
    assert tasks[9] in "\n".join(out)
    out.clear()
    # the whole array: every task not ended (the one cancelled already stays as it was)
    assert await cli(["cancel", "--url", e2e.url, array]) == 0
    assert out == [f"{array}: cancelling"]
    done = await e2e.wait_terminal(tasks)
    assert {j["state"] for j in done.values()} == {"cancelled"}
    status, doc = await e2e.cancel(array)
    assert status == 409 and doc["error"] == f"every task of array {array} has ended", doc
    # both running tasks had their GPUs back: a 72-GPU job fits
    big = await e2e.submit({"name": "big", "tenant": "a", "gpus": 72, "duration_s": 0.1})
    await e2e.wait_state(big, {"succeeded"})


async def test_dependencies_and_singletons(open_stack: StackFactory, caplog: pytest.LogCaptureFixture) -> None:
    e2e = await open_stack(domains=1)
    one = {"tenant": "a", "gpus": 1}
    bad = await e2e.submit({**one, "name": "fails", "command": FAIL})
    ok = await e2e.submit({**one, "name": "ok", "duration_s": 1.0})
    need_ok = await e2e.submit({**one, "name": "need-ok", "dependency": f"afterok:{bad}", "duration_s": 0.1})
    need_fail = await e2e.submit({**one, "name": "need-fail", "dependency": f"afternotok:{bad}", "duration_s": 0.1})
    need_end = await e2e.submit(
        {**one, "name": "need-end", "dependency": f"afterany:{bad},afterok:{ok}", "duration_s": 0.1}
    )
    never = await e2e.submit({**one, "name": "never", "dependency": f"afternotok:{ok}", "duration_s": 0.1})
    # what a waiting job waits for, in its reason
    waiting = await e2e.wait_state(need_ok, {"pending"}, check=lambda j: j["reason"].startswith("waits for"))
    assert waiting["reason"] == f"waits for afterok: {bad} (not ended)" and waiting["dependency"] == f"afterok:{bad}"

    # an unknown id is refused at the gateway, naming it (once the queue has handled the submits before: till
    # then it may be one of them, 503 with Retry-After)
    async def refused() -> dict[str, Any] | None:
        body = {**one, "name": "x", "dependency": "afterok:nope"}
        async with e2e.http.post(f"{e2e.url}/v1/jobs", json=body) as r:
            return None if r.status == 503 else {"status": r.status, **await r.json()}

    err = await wait_until(refused, "an answer to a submit with an unknown dependency")
    assert err["status"] == 422 and err["field"] == "dependency" and "afterok:nope" in err["error"], err

    # singletons: four of one name submitted in order (and one of another name beside them)
    singles = [
        await e2e.submit({**one, "name": "single", "dependency": "singleton", "duration_s": 0.3}) for _ in range(4)
    ]
    other = await e2e.submit({**one, "name": "other", "dependency": "singleton", "duration_s": 0.3})

    jobs = [bad, ok, need_ok, need_fail, need_end, never, *singles, other]
    done = await e2e.wait_terminal(jobs)
    assert done[bad]["state"] == "failed" and done[ok]["state"] == "succeeded"
    assert (done[need_ok]["state"], done[need_ok]["end"], done[need_ok]["reason"]) == (
        "cancelled",
        "cancelled",
        f"dependency can never be met: afterok:{bad} failed",
    )
    assert done[never]["state"] == "cancelled"
    assert done[never]["reason"] == f"dependency can never be met: afternotok:{ok} succeeded"
    assert done[need_fail]["state"] == done[need_end]["state"] == "succeeded"
    assert {done[j]["state"] for j in [*singles, other]} == {"succeeded"}

    # the log: no dependant before its condition, the doomed cancelled by what the log held, singletons one at a
    # time in submit order (history_rules (f), (g))
    events = await e2e.job_events()
    depends = {j: done[j]["dependency"] for j in jobs if done[j]["dependency"]}
    assert dependencies(events, depends, singletons={"a/single": singles, "a/other": [other]}) == []
    placed = [ev.job_id for ev in events if ev.state.value == "placed" and ev.job_id in singles]
    assert list(dict.fromkeys(placed)) == singles
    assert not service_errors(caplog.records)


async def test_a_dependency_on_a_cancelled_array_and_a_task(open_stack: StackFactory) -> None:
    """A dependency may name one task of an array, or the array; cancelling the array dooms what needs it ok."""
    e2e = await open_stack(domains=1)
    array = await e2e.submit({"name": "arr", "tenant": "a", "gpus": 1, "array": "0-2", "duration_s": 300})
    first = f"{array}_0"
    await recorded(e2e, array, 3)
    quick = {"tenant": "a", "gpus": 1, "duration_s": 0.1}
    on_array = await e2e.submit({**quick, "name": "d1", "dependency": f"afterok:{array}"})
    on_any = await e2e.submit({**quick, "name": "d2", "dependency": f"afterany:{array}"})
    on_task = await e2e.submit({**quick, "name": "d3", "dependency": f"afternotok:{first}"})
    await e2e.wait_state(first, {"running"})
    status, _ = await e2e.cancel(array)
    assert status == 202
    done = await e2e.wait_terminal([on_array, on_any, on_task])
    assert done[on_array]["state"] == "cancelled" and done[on_array]["reason"].startswith(
        f"dependency can never be met: afterok:{array} (its task {array}_"
    )
    assert done[on_any]["state"] == done[on_task]["state"] == "succeeded"
    tasks = [f"{array}_{i}" for i in range(3)]
    events = await e2e.job_events()
    depends = {j: done[j]["dependency"] for j in (on_array, on_any, on_task)}
    assert dependencies(events, depends, {array: tasks}) == []


async def test_a_job_held_by_its_dependency_reserves_nothing_and_blocks_no_one(open_stack: StackFactory) -> None:
    """A job of the whole domain (18 nodes) waits for a 1-node job of its priority: were it in the cycle, it would
    reserve every free node from that job's expected end on, and a long small job could not start before it (Slurm's
    backfill rule; without the dependency the small job waits "reserved to start in ~80 s"). Held out of the cycle
    by its dependency, it blocks nothing: the small job starts at once."""
    e2e = await open_stack(domains=1)
    top = {"tenant": "a", "priority": 100}
    first = await e2e.submit({**top, "name": "first", "gpus": 4, "duration_s": 300, "expected_runtime_s": 30})
    await e2e.wait_state(first, {"running"})
    big = await e2e.submit({**top, "name": "big", "gpus": 72, "dependency": f"afterok:{first}"})
    await e2e.wait_state(big, {"pending"}, check=lambda j: j["reason"] == f"waits for afterok: {first} (not ended)")
    small = await e2e.submit({"name": "small", "tenant": "b", "gpus": 4, "duration_s": 300})
    await e2e.wait_state(small, {"running"})
    # its dependency cancelled: it can never run, and is cancelled with the reason
    await e2e.cancel(first)
    done = await e2e.wait_state(big, {"cancelled"})
    assert done["reason"] == f"dependency can never be met: afterok:{first} cancelled"
