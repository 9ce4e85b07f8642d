"""The simulator on tiny hand-made traces gives exactly the hand-computed schedule for each policy.

Fleet for every case but `preempt` and `lend`: 2 domains x 4 nodes x 4 GPUs, exact runtime estimates, no random
failures, a cycle at every event time, every pending job tested:

    d00: n0 n1 n2 n3      d01: n4 n5 n6 n7
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from shared.sim.engine import SimConfig, SimResult, simulate
from shared.sim.fleet import FailureModel, FleetConfig
from shared.sim.mapping import MappingConfig, map_jobs
from shared.sim.metrics import compute, finished_work, gpu_seconds_balance
from shared.sim.traces import load_trace

FIXTURES = Path(__file__).parent / "sim_fixtures"
SMALL = FleetConfig(domains=2, nodes_per_domain=4)
EXACT = MappingConfig(exact_estimates=True, ckpt_share=0.0)


def run(
    trace: str,
    policy: str,
    fleet: FleetConfig = SMALL,
    mapping: MappingConfig = EXACT,
    ckpt: bool | None = None,
    **kw: object,
) -> SimResult:
    rows = load_trace(FIXTURES / trace).jobs
    if ckpt is not None:
        rows = [replace(r, checkpointable=ckpt) for r in rows]
    jobs = map_jobs(rows, mapping, fleet.topology(), seed=1).jobs
    cfg = SimConfig(policy=policy, fleet=fleet, failures=FailureModel(enabled=False), check_state=True, **kw)  # type: ignore[arg-type]
    return simulate(jobs, cfg)


def schedule(res: SimResult) -> dict[str, list[tuple[float, float, tuple[int, ...], str]]]:
    out: dict[str, list[tuple[float, float, tuple[int, ...], str]]] = {}
    for a in sorted(res.attempts, key=lambda a: (a.start, res.jobs[a.job].job.id)):
        out.setdefault(res.jobs[a.job].job.id, []).append((a.start, a.end, a.nodes, a.outcome))
    return out


# backfill.csv: a 4 nodes/100 s, b 3 nodes/50 s, c 2 nodes/30 s at t=0; d 1 node/10 s at t=5.
# a and b start; c waits for b (reservation at 50 on b's nodes) and d backfills the free node at 5.
# flat/tree/rackscale put a in d00 (first fit / lowest index on a tie); block breaks ties to the highest index.
BACKFILL = {
    "flat": {"a": (0, 100, (0, 1, 2, 3)), "b": (0, 50, (4, 5, 6)), "c": (50, 80, (4, 5)), "d": (5, 15, (7,))},
    "tree": {"a": (0, 100, (0, 1, 2, 3)), "b": (0, 50, (4, 5, 6)), "c": (50, 80, (4, 5)), "d": (5, 15, (7,))},
    "block": {"a": (0, 100, (4, 5, 6, 7)), "b": (0, 50, (0, 1, 2)), "c": (50, 80, (0, 1)), "d": (5, 15, (3,))},
    "rackscale": {"a": (0, 100, (0, 1, 2, 3)), "b": (0, 50, (4, 5, 6)), "c": (50, 80, (4, 5)), "d": (5, 15, (7,))},
}


@pytest.mark.parametrize("policy", sorted(BACKFILL))
def test_backfill_schedule(policy: str) -> None:
    res = run("backfill.csv", policy)
    got = {job: [(s, e, n) for s, e, n, _ in atts] for job, atts in schedule(res).items()}
    assert got == {job: [want] for job, want in BACKFILL[policy].items()}
    m = compute(res)
    assert m["reservations"] == 1 and m["reservation_hits"] == 1  # c started when promised
    assert m["wait_p50"] == 0.0 and m["makespan"] == 100.0
    assert m["locality"] == 1.0


# split.csv: x one node (no NVLink need), y and z two nodes each, all at t=0 for 100 s.
# flat takes nodes in index order: z lands on n3 + n4, across domains, and runs 1 + 0.05*0.5*35 = 1.875x.
SPLIT = {
    "flat": {"x": (0, 100, (0,)), "y": (0, 100, (1, 2)), "z": (0, 187.5, (3, 4))},
    "tree": {"x": (0, 100, (0,)), "y": (0, 100, (1, 2)), "z": (0, 100, (4, 5))},
    "block": {"x": (0, 100, (4,)), "y": (0, 100, (5, 6)), "z": (0, 100, (0, 1))},
    "rackscale": {"x": (0, 100, (0,)), "y": (0, 100, (1, 2)), "z": (0, 100, (4, 5))},
    # the yardstick places as flat does and is charged nothing for the split
    "ceiling": {"x": (0, 100, (0,)), "y": (0, 100, (1, 2)), "z": (0, 100, (3, 4))},
}


@pytest.mark.parametrize("policy", sorted(SPLIT))
def test_split_schedule_and_slowdown(policy: str) -> None:
    res = run("split.csv", policy)
    got = {job: [(s, e, n) for s, e, n, _ in atts] for job, atts in schedule(res).items()}
    assert got == {job: [want] for job, want in SPLIT[policy].items()}
    m = compute(res)
    if policy == "flat":
        # sensitive GPU-time: y 8 GPUs x 100 s local, z 8 x 187.5 split
        assert m["locality"] == pytest.approx(800 / (800 + 1500))
        assert m["slowdown_gpu_h"] == pytest.approx(8 * 87.5 / 3600)
    elif policy == "ceiling":
        assert m["locality"] == pytest.approx(800 / (800 + 800)) and m["slowdown_gpu_h"] == 0.0
    else:
        assert m["locality"] == 1.0 and m["slowdown_gpu_h"] == 0.0


@pytest.mark.parametrize("policy", ["flat", "tree", "block", "rackscale"])
def test_preemption_checkpoint_and_restore(policy: str) -> None:
    """One domain of 4 nodes. `low` (4 nodes, checkpointable) runs; `high` (priority 5, 2 nodes) arrives at 10
    and preempts it; low keeps its 10 s of work and restarts at 30 paying restore 30 + 0.5 x 16 = 38 s."""
    res = run("preempt.csv", policy, fleet=FleetConfig(domains=1, nodes_per_domain=4))
    assert schedule(res) == {
        "low": [(0, 10, (0, 1, 2, 3), "preempted"), (30, 30 + 38 + 90, (0, 1, 2, 3), "done")],
        "high": [(10, 30, (0, 1), "done")],
    }
    m = compute(res)
    assert m["preemptions"] == 1 and m["unfinished"] == 0
    assert m["lost_gpu_h"] == 0.0 and m["overhead_gpu_h"] == pytest.approx(16 * 38 / 3600)


# lend.csv, one domain of 8 nodes: a (2 nodes, 100 s) at 0; big (8 nodes, 50 s) at 1 waits for a, reserved at
# 100 on all 8, holding the 6 free ones; loan (4 nodes, 500 s, checkpointable) at 2 and tiny (3 nodes, 500 s,
# checkpointable) at 3 would both outlast big's start.
# block (Slurm's rule): neither backfills; big runs 100-150, loan and tiny 150-650.
# rackscale (lends to checkpointable jobs of 4+ nodes): loan borrows n2-n5 at 2; tiny, under the floor, waits.
# At 100 a ends and big fits without loan: loan is preempted (checkpointed: 98 s of its work kept), big runs
# 100-150, loan restarts at 150 paying restore 30 + 0.5 x 16 = 38 s and ends at 150 + 38 + 402 = 590.
LEND = {
    "block": {
        "a": [(0, 100, (0, 1), "done")],
        "big": [(100, 150, tuple(range(8)), "done")],
        "loan": [(150, 650, (0, 1, 2, 3), "done")],
        "tiny": [(150, 650, (4, 5, 6), "done")],
    },
    "rackscale": {
        "a": [(0, 100, (0, 1), "done")],
        "big": [(100, 150, tuple(range(8)), "done")],
        "loan": [(2, 100, (2, 3, 4, 5), "preempted"), (150, 590, (0, 1, 2, 3), "done")],
        "tiny": [(150, 650, (4, 5, 6), "done")],
    },
}


@pytest.mark.parametrize("policy", sorted(LEND))
def test_lending_reserved_nodes_schedule(policy: str) -> None:
    res = run("lend.csv", policy, fleet=FleetConfig(domains=1, nodes_per_domain=8))
    assert schedule(res) == LEND[policy]
    m = compute(res)
    assert m["preemptions"] == (1 if policy == "rackscale" else 0) and m["unfinished"] == 0
    assert m["lost_gpu_h"] == 0.0  # the borrower kept its work
    # rackscale with Slurm's rule keeps block's times
    if policy == "rackscale":
        off = run("lend.csv", policy, fleet=FleetConfig(domains=1, nodes_per_domain=8), lend_reserved=False)
        assert {j: [(s, e) for s, e, _, _ in atts] for j, atts in schedule(off).items()} == {
            j: [(s, e) for s, e, _, _ in atts] for j, atts in LEND["block"].items()
        }


def test_scripted_failure_kills_and_requeues() -> None:
    """block on backfill.csv; n0 fails at 20 (repaired at 200): b (non-checkpointable, on n0-n2) is killed,
    restarts from zero on n1-n3 at 20; c then waits for b's new end at 70."""
    res = run("backfill.csv", "block", outages=((0, 20.0, 200.0),))
    assert schedule(res) == {
        "a": [(0, 100, (4, 5, 6, 7), "done")],
        "b": [(0, 20, (0, 1, 2), "killed"), (20, 70, (1, 2, 3), "done")],
        "c": [(70, 100, (1, 2), "done")],
        "d": [(5, 15, (3,), "done")],
    }
    m = compute(res)
    assert m["failures"] == 1 and m["failure_kills"] == 1
    assert m["lost_gpu_h"] == pytest.approx(12 * 20 / 3600)
    bal = gpu_seconds_balance(res)
    assert bal["allocated"] == pytest.approx(bal["useful"] + bal["lost"] + bal["overhead"] + bal["slowdown"])


def test_checkpointable_kill_keeps_work_to_last_checkpoint() -> None:
    res = run("backfill.csv", "block", ckpt=True, outages=((0, 20.0, 200.0),), ckpt_interval_s=15.0)
    b = schedule(res)["b"]
    # 20 s done, last checkpoint at 15 s of work: 35 s left + restore (30 + 0.5 x 12 = 36 s)
    assert b == [(0, 20, (0, 1, 2), "killed"), (20, 20 + 36 + 35, (1, 2, 3), "done")]
    for _job, kept, duration in finished_work(res):
        assert kept == pytest.approx(duration)


def test_cycle_interval_batches_events_into_ticks() -> None:
    res = run("backfill.csv", "block", cycle_interval_s=4.0)
    s = schedule(res)
    assert s["d"][0][:2] == (8.0, 18.0)  # arrived at 5, first tick at 8
    assert s["c"][0][0] == 52.0  # b ends at 50, next tick 52


def test_same_seed_same_result_and_queue_depth() -> None:
    a = run("backfill.csv", "rackscale", queue_depth=1)
    b = run("backfill.csv", "rackscale", queue_depth=1)
    assert schedule(a) == schedule(b)
    assert compute(a) == compute(b)


def test_the_pending_queue_refuses_a_job_already_waiting() -> None:
    from shared.core import JobSpec
    from shared.sim.engine import PendingQueue

    q = PendingQueue()
    spec = JobSpec("j", 4, tenant="t", submit_time=1.0)
    q.add(spec)
    with pytest.raises(ValueError, match="job j is already waiting"):
        q.add(spec)
    assert q.remove("j") == spec and len(q) == 0 and q.heads(10) == []
