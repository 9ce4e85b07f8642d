"""The migration service on the running system (issue 5): evacuation, the crash-safe move protocol,
defragmentation, hysteresis, dead letters. Real NATS and Redis, the whole stack, simulated agents.

Timings are read from event timestamps (JobEvent.at, RankStarted.at: the services' clock), never from how
long the test waited; waits only bound how long a test may take.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from collections import defaultdict
from typing import Any

import pytest

from services.agent.backends import SimBackend
from services.cli.main import main as cli
from shared.schemas import (
    ORDERS,
    Fault,
    JobEvent,
    JobState,
    MigrationEvent,
    NodeChanged,
    PlaceOrder,
    RankExited,
    RankStarted,
)
from tests.e2e.conftest import E2E, StackFactory, domain_of, double_bookings, service_errors, wait_until

pytestmark = pytest.mark.asyncio

FAULT_TO_RUNNING_S = 10.0  # the acceptance bound: fault → the job running again on healthy GPUs
FAST_TELEMETRY = {"telemetry_s": 0.2}
ALICE, BOB, ADMIN = "alice-migration-token-0001", "bob-migration-token-000002", "ops-migration-token-000003"
TOKENS_YAML = f"""
tokens:
  - {{token: "{ALICE}", tenant: alice, role: user}}
  - {{token: "{BOB}", tenant: bob, role: user}}
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
"""


def nodes_of(view: dict[str, Any]) -> list[str]:
    return [p["node"] for p in view["allocation"]]


def inject(e2e: E2E, fault: Fault) -> None:
    fleet = e2e.stack.fleet
    assert fleet is not None
    assert fleet.inject(fault) == [fault.node]


def backend(e2e: E2E, node: str) -> SimBackend:
    fleet = e2e.stack.fleet
    assert fleet is not None
    b = fleet.agents[node].backend
    assert isinstance(b, SimBackend)
    return b


async def events_of(e2e: E2E, job: str) -> list[JobEvent]:
    return [e for e in await e2e.job_events() if e.job_id == job]


async def migration_events(e2e: E2E) -> list[MigrationEvent]:
    return [e for e in await e2e.decoded(e2e.names.migration_events) if isinstance(e, MigrationEvent)]


async def starts_and_exits(e2e: E2E) -> tuple[dict[str, list[RankStarted]], dict[str, list[RankExited]]]:
    starts: dict[str, list[RankStarted]] = defaultdict(list)
    exits: dict[str, list[RankExited]] = defaultdict(list)
    for ev in await e2e.decoded(e2e.names.agent_events):
        if isinstance(ev, RankStarted):
            starts[ev.job_id].append(ev)
        elif isinstance(ev, RankExited):
            exits[ev.job_id].append(ev)
    return starts, exits


def ran_once(job: str, starts: list[RankStarted], exits: list[RankExited]) -> list[str]:
    """Each (attempt, rank) started once, and an attempt's ranks started only after every rank of the
    attempt before had exited: the job never ran twice at once."""
    problems = []
    seen = defaultdict(int)
    for s in starts:
        seen[(s.attempt, s.rank)] += 1
    problems += [f"{job} attempt {a} rank {r} started {n} times" for (a, r), n in seen.items() if n > 1]
    attempts = sorted({s.attempt for s in starts})
    for prev, nxt in itertools.pairwise(attempts):
        last_exit = max((e.at for e in exits if e.attempt == prev), default=None)
        first_start = min(s.at for s in starts if s.attempt == nxt)
        if last_exit is None or first_start < last_exit:
            problems.append(f"{job}: attempt {nxt} started at {first_start} before attempt {prev} ended ({last_exit})")
    return problems


async def test_fatal_gpu_fault_moves_checkpointable_job_within_one_domain_and_requeues_the_other(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS_YAML)
    settings = {"checkpoint_s": 0.3, "tokens_file": str(tokens), **FAST_TELEMETRY}
    e2e: E2E = await open_stack(domains=2, token=ADMIN, settings=settings)
    body = {"name": "ckpt", "tenant": "alice", "gpus": 16, "checkpointable": True, "duration_s": 8.0}
    movable = await e2e.submit(body)
    plain = await e2e.submit({"name": "plain", "tenant": "bob", "gpus": 4, "duration_s": 8.0})
    fragile = await e2e.submit({"name": "fragile", "tenant": "bob", "gpus": 4, "on_node_failure": "fail"})
    first = {j: await e2e.wait_state(j, {"running"}) for j in (movable, plain, fragile)}
    hit = nodes_of(first[movable])[1]
    other = nodes_of(first[plain])[0]
    third = nodes_of(first[fragile])[0]
    assert len({hit, other, third}) == 3

    fault_at = time.time()  # the services' clock (Deps.clock defaults to time.time)
    inject(e2e, Fault(node=hit, gpu=2, xid=79))  # fell off the bus: fatal
    inject(e2e, Fault(node=other, gpu=0, xid=48))  # double-bit ECC: fatal
    inject(e2e, Fault(node=third, gpu=3, xid=79))

    moved = await e2e.wait_state(movable, {"running", "succeeded"}, check=lambda v: v["attempt"] >= 2)
    assert (hit, 2) not in {(p["node"], g) for p in moved["allocation"] for g in p["gpus"]}, moved
    assert len({domain_of(n) for n in nodes_of(moved)}) == 1, moved  # required NVLink: one domain
    # in place: the three good nodes keep their ranks, the failed node's rank went to a spare of the domain
    assert len(set(nodes_of(moved)) & set(nodes_of(first[movable]))) == 3, (first[movable], moved)
    evs = await events_of(e2e, movable)
    states = [(e.state, e.attempt) for e in evs]
    assert (JobState.MIGRATING, 1) in states, states
    assert states.index((JobState.MIGRATING, 1)) < states.index((JobState.RUNNING, 2)), states
    running_again = next(e for e in evs if e.state is JobState.RUNNING and e.attempt == 2)
    assert running_again.at - fault_at < FAULT_TO_RUNNING_S, (running_again.at - fault_at, states)

    # restored, not restarted: the next attempt restores from the checkpoint and runs only what was left
    orders = [o for o in await e2e.decoded(e2e.names.orders, ORDERS) if isinstance(o, PlaceOrder)]
    restore = next(o for o in orders if o.job_id == movable and o.attempt == 2)
    assert restore.restore, restore
    starts, exits = await starts_and_exits(e2e)
    ran_first = max(e.ran_s for e in exits[movable] if e.attempt == 1 and e.checkpointed)
    assert ran_first > 0 and restore.duration_s == pytest.approx(8.0 - ran_first, abs=0.05), (restore, ran_first)

    # the job that can't checkpoint is requeued (its on_node_failure is requeue) and runs elsewhere
    again = await e2e.wait_state(plain, {"running", "succeeded"}, check=lambda v: v["attempt"] >= 2)
    assert (other, 0) not in {(p["node"], g) for p in again["allocation"] for g in p["gpus"]}, again
    plain_states = [(e.state, e.attempt, e.reason) for e in await events_of(e2e, plain)]
    assert any(s is JobState.PENDING and a == 2 and "evacuated" in r for s, a, r in plain_states), plain_states
    # one that asked for on_node_failure: fail fails, once its ranks have stopped
    failed = await e2e.wait_state(fragile, {"failed", "succeeded", "cancelled"})
    assert failed["state"] == "failed" and "evacuated" in failed["reason"] and failed["attempt"] == 1, failed

    done = await e2e.wait_terminal([movable, plain])
    assert {j["state"] for j in done.values()} == {"succeeded"}, done
    starts, exits = await starts_and_exits(e2e)
    for job in (movable, plain):
        assert not ran_once(job, starts[job], exits[job])
    kinds = {(e.record.job_id, e.record.state) for e in await migration_events(e2e)}
    assert {(movable, "done"), (plain, "requeued"), (fragile, "requeued")} <= kinds, kinds

    # the API: each move with job, from, to, why, state and timings; a user sees only its tenant's
    everything = await _migrations(e2e, ADMIN)
    by_job = {m["job_id"]: m for m in everything["migrations"]}
    assert set(by_job) == {movable, plain, fragile} and everything["total"] == 3, everything
    move = by_job[movable]
    assert move["state"] == "done" and move["kind"] == "evacuate" and "failed" in move["why"], move
    assert move["from"] == first[movable]["allocation"] and move["to"] == moved["allocation"], move
    assert {"requested", "checkpointing", "restoring", "placed", "running", "done"} <= set(move["steps"]), move
    assert 0 < move["took_s"] < FAULT_TO_RUNNING_S, move
    assert by_job[plain]["state"] == "requeued" and by_job[plain]["to"] == [], by_job[plain]
    assert by_job[fragile]["error"] == "job failed", by_job[fragile]
    assert [m["job_id"] for m in (await _migrations(e2e, ALICE))["migrations"]] == [movable]
    assert [m["job_id"] for m in (await _migrations(e2e, BOB, tenant="alice"))["migrations"]] == []
    # and the CLI's table of the same
    monkeypatch.setenv("RACKSCALE_TOKEN", ALICE)
    lines: list[str] = []
    assert await asyncio.to_thread(cli, ["migrations", "--url", e2e.url], lines.append, lines.append) == 0
    table = "\n".join(lines)
    assert movable in table and "done" in table and plain not in table, table

    assert not double_bookings(await e2e.job_events())
    assert not service_errors(caplog.records)


async def _migrations(e2e: E2E, token: str, **query: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with e2e.http.get(f"{e2e.url}/v1/migrations", params=query, headers=headers) as r:
        assert r.status == 200, await r.text()
        return dict(await r.json())


async def test_sigkill_mid_move_every_job_runs_exactly_once(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # a long checkpoint keeps the move open; the migration service dies while the job is migrating
    e2e: E2E = await open_stack(domains=2, migration="process", settings={"checkpoint_s": 2.0})
    stack = e2e.stack
    jobs = [
        await e2e.submit({"name": f"ckpt-{i}", "tenant": "a", "gpus": 8, "checkpointable": True, "duration_s": 10.0})
        for i in range(3)
    ]
    views = {j: await e2e.wait_state(j, {"running"}) for j in jobs}
    victim = jobs[0]
    hit = nodes_of(views[victim])[0]
    backend(e2e, hit).set_health(1, "down")

    async def migrating() -> bool:
        return any(e.state is JobState.MIGRATING for e in await events_of(e2e, victim))

    await wait_until(migrating, f"job {victim} migrating")
    os.kill(stack.processes["migration"].pid, signal.SIGSTOP)
    stack.kill_process("migration")
    stack.start_process("migration")

    moved = await e2e.wait_state(victim, {"running", "succeeded"}, check=lambda v: v["attempt"] >= 2)
    assert hit not in nodes_of(moved) or moved["state"] == "succeeded", moved

    async def record_done() -> list[MigrationEvent] | None:
        evs = [e for e in await migration_events(e2e) if e.record.job_id == victim and e.record.state == "done"]
        return evs or None

    await wait_until(record_done, f"the restarted migration service to close the move of {victim}")
    done = await e2e.wait_terminal(jobs)
    assert {j["state"] for j in done.values()} == {"succeeded"}, done
    starts, exits = await starts_and_exits(e2e)
    for job in jobs:
        assert not ran_once(job, starts[job], exits[job]), (job, starts[job])
    assert {s.attempt for s in starts[victim]} == {1, 2}, starts[victim]
    assert not double_bookings(await e2e.job_events())
    assert not service_errors(caplog.records)


async def test_defragmentation_moves_the_fewest_jobs_so_a_domain_sized_job_runs(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Three domains of 18 nodes. Walls: a 16-node job in d01 and one in d02 (not checkpointable), so each
    keeps 2 free nodes; four one-node checkpointable jobs in d00, so it keeps 14. 18 free nodes in total,
    but a 16-node job needing one NVLink domain fits nowhere. The fewest moves: two of d00's singles go to
    the free nodes of d01/d02 (every other domain would need its non-checkpointable wall moved)."""
    e2e: E2E = await open_stack(
        domains=3, settings={"checkpoint_s": 0.3, "migration_interval_s": 0.5, "max_migrations": 8}
    )
    d = {f"d{i:02d}": [f"d{i:02d}-n{j:02d}" for j in range(18)] for i in range(3)}

    async def drain(nodes: list[str], action: str = "drain") -> None:
        for node in nodes:
            await e2e.admin(node, action)

    # walls in d01 and d02 (d00 drained meanwhile)
    await drain(d["d00"])
    walls = [await e2e.submit({"name": f"wall-{i}", "tenant": "w", "gpus": 64, "duration_s": 300.0}) for i in range(2)]
    wall_views = [await e2e.wait_state(w, {"running"}) for w in walls]
    assert sorted(domain_of(nodes_of(v)[0]) for v in wall_views) == ["d01", "d02"], wall_views
    spare = [n for dom in ("d01", "d02") for n in d[dom] if n not in {x for v in wall_views for x in nodes_of(v)}]
    assert len(spare) == 4, spare
    # four singles in d00 (the walls' spare nodes drained meanwhile)
    await drain(spare)
    await drain(d["d00"], "undrain")
    singles = [
        await e2e.submit({"name": f"one-{i}", "tenant": "s", "gpus": 4, "checkpointable": True, "duration_s": 300.0})
        for i in range(4)
    ]
    single_views = {s: await e2e.wait_state(s, {"running"}) for s in singles}
    assert {domain_of(nodes_of(v)[0]) for v in single_views.values()} == {"d00"}, single_views
    await drain(spare, "undrain")

    big = await e2e.submit({"name": "big", "tenant": "b", "gpus": 64, "topology": {"nvlink": "required"}})
    ran = await e2e.wait_state(big, {"running"}, timeout=90)
    assert {domain_of(n) for n in nodes_of(ran)} == {"d00"}, ran

    # the big job may start before the moved ones have restored (their old GPUs were released first)
    async def moves_ended() -> list[Any] | None:
        records = {e.record.id: e.record for e in await migration_events(e2e)}
        moves = [r for r in records.values() if r.kind == "defrag"]
        return moves if moves and all(r.state in ("done", "requeued", "rolled_back") for r in moves) else None

    moves = await wait_until(moves_ended, "the defragmentation moves to end")
    assert len(moves) == 2, moves  # the fewest: 16 nodes needed, d00 had 14 free
    assert all(r.job_id in singles and r.state == "done" and big in r.why for r in moves), moves
    assert {domain_of(r.target[0].node) for r in moves} <= {"d01", "d02"}, moves
    for r in moves:
        view = await e2e.job(r.job_id)
        assert view["state"] == "running" and view["attempt"] == 2 and nodes_of(view)[0] in spare, view
    starts, exits = await starts_and_exits(e2e)
    for job in singles:
        assert not ran_once(job, starts[job], exits[job])
    assert not double_bookings(await e2e.job_events())
    assert not service_errors(caplog.records)


async def test_flapping_telemetry_within_the_hysteresis_window_moves_nothing(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """Temperature rule: degraded after 3 hot samples spanning 1 s, lifted after 6 clear ones spanning 3 s.
    A sensor flapping every sample never holds 3 in a row: no health change, no move. The control, a GPU
    that stays hot, turns degraded and its checkpointable job moves — so the same path does act."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "temperature_c: 87\nrules:\n  temperature: {hold_samples: 3, hold_s: 1, clear_samples: 6, clear_s: 3}\n"
    )
    settings = {"checkpoint_s": 0.2, "health_rules_file": str(rules), **FAST_TELEMETRY}
    e2e: E2E = await open_stack(domains=1, settings=settings)
    body = {"tenant": "a", "gpus": 4, "checkpointable": True, "duration_s": 120.0}
    flappy = await e2e.submit({**body, "name": "flappy"})
    steady = await e2e.submit({**body, "name": "steady"})
    views = {j: await e2e.wait_state(j, {"running"}) for j in (flappy, steady)}
    flap_node, hot_node = nodes_of(views[flappy])[0], nodes_of(views[steady])[0]

    inject(e2e, Fault(node=flap_node, gpu=1, temp_c=95.0, flap=1))
    inject(e2e, Fault(node=hot_node, gpu=1, temp_c=95.0))
    moved = await e2e.wait_state(steady, {"running"}, check=lambda v: v["attempt"] >= 2)
    assert hot_node not in nodes_of(moved), moved

    # the flapping GPU has flapped for as long as the steady one took to be moved, and longer
    async def samples_enough() -> bool:
        nodes = [e for e in await e2e.decoded(e2e.names.node_events) if isinstance(e, NodeChanged)]
        return sum(e.node == hot_node and bool(e.changed_gpus) for e in nodes) >= 1

    await wait_until(samples_enough, "the steady GPU's health change on the bus")
    hot_for = time.time()
    await wait_until(lambda: _later(hot_for + 4.0), "4 s more of flapping (20 samples)")
    view = await e2e.job(flappy)
    assert view["state"] == "running" and view["attempt"] == 1, view
    changes = [
        e for e in await e2e.decoded(e2e.names.node_events) if isinstance(e, NodeChanged) and e.node == flap_node
    ]
    assert not [e for e in changes if e.changed_gpus], changes
    moves = [e.record for e in await migration_events(e2e)]
    assert {r.job_id for r in moves} == {steady}, moves
    assert not service_errors(caplog.records)


async def _later(at: float) -> bool:
    return time.time() >= at


async def test_a_checkpoint_not_acknowledged_in_time_rolls_the_move_back_and_requeues_the_job(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # the agents take 60 s to checkpoint; the migration service gives each step 1 s
    settings = {"checkpoint_s": 60.0, "migration_step_timeout_s": 1.0, "migration_interval_s": 0.5, **FAST_TELEMETRY}
    e2e: E2E = await open_stack(domains=1, settings=settings)
    job = await e2e.submit({"name": "slow-ckpt", "tenant": "a", "gpus": 4, "checkpointable": True, "duration_s": 60})
    first = await e2e.wait_state(job, {"running"})
    hit = nodes_of(first)[0]
    inject(e2e, Fault(node=hit, gpu=0, xid=79))

    again = await e2e.wait_state(job, {"running"}, check=lambda v: v["attempt"] >= 2)
    assert hit not in nodes_of(again), again
    states = [(e.state, e.attempt, e.reason) for e in await events_of(e2e, job)]
    assert any(s is JobState.MIGRATING and a == 1 for s, a, _ in states), states
    assert any(s is JobState.PENDING and a == 2 and "move aborted" in r for s, a, r in states), states

    async def rolled_back() -> list[Any] | None:
        recs = [e.record for e in await migration_events(e2e) if e.record.state == "rolled_back"]
        return recs or None

    (rec,) = await wait_until(rolled_back, "the move's record rolled back")
    assert rec.job_id == job and "checkpoint not acknowledged" in rec.error and "abort" in rec.steps, rec
    assert not service_errors(caplog.records)


async def test_a_domain_running_hot_sheds_jobs_to_a_cool_one(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """Four one-node checkpointable jobs land in d00; then d00 runs 12 C hot (a scripted fault on the whole
    domain). At equal load d00 is 12 C above d01, past the 8 C spread for longer than the hold: the two
    cheapest jobs move to d01, after which d00 carries no more than d01 and nothing moves again. The
    temperature health rule is set out of reach, so this is rebalancing, not evacuation."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("temperature_c: 120\n")
    settings = {
        "checkpoint_s": 0.2,
        "health_rules_file": str(rules),
        "migration_interval_s": 0.5,
        "rebalance_spread_c": 8.0,
        "rebalance_hold_s": 1.0,
        **FAST_TELEMETRY,
    }
    e2e: E2E = await open_stack(domains=2, settings=settings)
    body = {"tenant": "a", "gpus": 4, "checkpointable": True, "duration_s": 120.0}
    d01 = [f"d01-n{j:02d}" for j in range(18)]
    for node in d01:  # the jobs land in d00
        await e2e.admin(node, "drain")
    jobs = [await e2e.submit({**body, "name": f"warm-{i}"}) for i in range(4)]
    views = {j: await e2e.wait_state(j, {"running"}) for j in jobs}
    assert {domain_of(nodes_of(v)[0]) for v in views.values()} == {"d00"}, views
    for node in d01:
        await e2e.admin(node, "undrain")
    inject_all = e2e.stack.fleet
    assert inject_all is not None
    assert len(inject_all.inject(Fault(domain="d00", hot_c=12.0))) == 18

    async def two_moved() -> list[Any] | None:
        recs = {e.record.id: e.record for e in await migration_events(e2e)}
        done = [r for r in recs.values() if r.kind == "rebalance" and r.state == "done"]
        return done if len(done) >= 2 else None

    moved = await wait_until(two_moved, "two rebalancing moves done")
    assert all("d00 runs" in r.why and domain_of(r.target[0].node) == "d01" for r in moved), moved
    # settled: d00 and d01 carry two jobs each, and later rounds move nothing more
    settle_from = time.time()
    await wait_until(lambda: _later(settle_from + 3.0), "3 s more of rounds (6 of them)")
    recs = {e.record.id: e.record for e in await migration_events(e2e)}
    assert len(recs) == 2 and {r.kind for r in recs.values()} == {"rebalance"}, recs
    domains = sorted([domain_of(nodes_of(await e2e.job(j))[0]) for j in jobs])
    assert domains == ["d00", "d00", "d01", "d01"], domains
    starts, exits = await starts_and_exits(e2e)
    for job in jobs:
        assert not ran_once(job, starts[job], exits[job])
    assert not service_errors(caplog.records)


async def test_a_flexible_job_on_smaller_segments_is_consolidated_onto_its_preferred_ones(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Three domains of 18 nodes: one held whole by C, the others by a 10-node job each, so a 16-node job that
    accepts segments of 16 or 8 starts on two 8s (waiting two minutes for a 16 would end later). When C is
    cancelled its domain is free: the migration service moves the flexible job onto one segment of 16 there
    (checkpoint, release, pinned restore), and its next attempt runs in that domain with segment 16."""
    e2e: E2E = await open_stack(
        domains=3, settings={"checkpoint_s": 0.3, "restore_s": 0.3, "migration_interval_s": 0.5, "max_migrations": 8}
    )
    whole = await e2e.submit({"name": "whole", "tenant": "w", "gpus": 72, "duration_s": 600.0})
    held = nodes_of(await e2e.wait_state(whole, {"running"}))
    walls = [await e2e.submit({"name": f"wall{i}", "tenant": "w", "gpus": 40, "duration_s": 120.0}) for i in range(2)]
    for w in walls:
        await e2e.wait_state(w, {"running"})
    flex = await e2e.submit(
        {
            "name": "flexible",
            "tenant": "f",
            "gpus": 64,
            "topology": {"segment": [16, 8]},
            "checkpointable": True,
            "duration_s": 600.0,
        }
    )
    first = await e2e.wait_state(flex, {"running"})
    assert first["segment"] == 8 and len({domain_of(n) for n in nodes_of(first)}) == 2, first
    await e2e.cancel(whole)
    free = domain_of(held[0])

    def consolidated(view: dict[str, Any]) -> bool:
        return view["attempt"] == 2 and view["segment"] == 16

    moved = await e2e.wait_state(flex, {"running"}, timeout=60, check=consolidated)
    assert {domain_of(n) for n in nodes_of(moved)} == {free}, moved
    records = [e.record for e in await migration_events(e2e) if e.record.job_id == flex]
    assert records and {r.kind for r in records} == {"consolidate"}, records
    assert records[-1].segment == 16 and "preferred segments of 16 nodes" in records[-1].why
    starts, exits = await starts_and_exits(e2e)
    assert {s.attempt for s in starts[flex]} == {1, 2}
    assert {x.attempt for x in exits[flex] if x.checkpointed} == {1}  # every rank of attempt 1 checkpointed
    assert not double_bookings(await e2e.job_events())
    assert not service_errors(caplog.records)
    for w in walls:
        await e2e.cancel(w)
    await e2e.cancel(flex)
