"""Migration in the simulator: the engine calls the core's planner (shared/core/migration.py) and applies its
moves. Fleet: 2 domains x 4 nodes x 4 GPUs, exact estimates, a cycle at every event time:

    d00: n0 n1 n2 n3      d01: n4 n5 n6 n7
"""

from __future__ import annotations

import pytest

from shared.sim.metrics import compute, finished_work, gpu_seconds_balance
from tests.unit.test_sim_engine import run, schedule


def balanced(res) -> None:  # type: ignore[no-untyped-def]
    bal = gpu_seconds_balance(res)
    assert bal["allocated"] == pytest.approx(bal["useful"] + bal["lost"] + bal["overhead"] + bal["slowdown"])
    for _job, kept, duration in finished_work(res):
        assert kept == pytest.approx(duration)


def test_defrag_moves_a_checkpointable_job_so_a_blocked_one_starts() -> None:
    """migration.csv: p (2 nodes, checkpointable) on n0-n1 and r (2 nodes, not) on n4-n5 run 1,000 s; q on
    n2-n3 ends at 5; big (4 nodes, one domain) arrives at 10 and fits no domain although 4 nodes are free
    (n2, n3, n6, n7).
    With migration p is checkpointed and moved to n6-n7 at 10, paying checkpoint + restore (2 x 34 s), and
    big starts at once in d00; without it big waits for p's end at 1,000."""
    off = run("migration.csv", "rackscale")
    assert schedule(off)["big"] == [(1000, 1500, (0, 1, 2, 3), "done")]
    res = run("migration.csv", "rackscale", migration=True)
    assert schedule(res) == {
        "p": [(0, 10, (0, 1), "moved"), (10, 10 + 68 + 990, (6, 7), "done")],
        "q": [(0, 5, (2, 3), "done")],
        "r": [(0, 1000, (4, 5), "done")],
        "big": [(10, 510, (0, 1, 2, 3), "done")],
    }
    m = compute(res)
    assert m["migrations"] == 1 and m["defrag_moves"] == 1 and m["beneficiaries_started"] == 1
    assert m["move_pause_gpu_h"] == pytest.approx(8 * 68 / 3600)
    assert m["move_gain_gpu_h"] == pytest.approx(16 * 990 / 3600)
    assert "migrations" in compute(off) and "defrag_moves" not in compute(off)
    balanced(res)


def test_defrag_budget_of_zero_moves_changes_nothing() -> None:
    from shared.core import MigrationBudget

    res = run("migration.csv", "rackscale", migration=True, migration_budget=MigrationBudget(max_moves=0))
    assert schedule(res) == schedule(run("migration.csv", "rackscale"))


def test_failed_node_of_a_checkpointable_gang_is_replaced_in_place() -> None:
    """backfill.csv under rackscale: b (3 nodes, checkpointable) runs on n4-n6; n4 fails at 20. With
    migration its ranks on n4 move to the spare n7 of the same domain at once: the work since the last
    checkpoint (15 s of work at 15 s intervals, so 5 s) is lost and the restore (36 s) paid, no requeue."""
    kw = {"ckpt": True, "outages": ((4, 20.0, 200.0),), "ckpt_interval_s": 15.0}
    res = run("backfill.csv", "rackscale", migration=True, **kw)
    b = schedule(res)["b"]
    assert b == [(0, 20, (4, 5, 6), "killed"), (20, 20 + 36 + 35, (7, 5, 6), "done")]
    m = compute(res)
    assert m["evac_moves"] == 1 and m["evac_in_place"] == 1 and m["evac_requeued"] == 0
    assert m["failure_kills"] == 0  # moved, not killed and requeued
    balanced(res)
    off = run("backfill.csv", "rackscale", **kw)
    assert compute(off)["failure_kills"] == 1


def test_non_checkpointable_job_on_a_failed_node_is_requeued() -> None:
    res = run("backfill.csv", "rackscale", migration=True, ckpt=False, outages=((4, 20.0, 200.0),))
    m = compute(res)
    assert m["evac_moves"] == 0 and m["evac_requeued"] == 1 and m["failure_kills"] == 1
    assert schedule(res)["b"][0] == (0, 20, (4, 5, 6), "killed")


def test_cli_migration_on_reports_the_moves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    from pathlib import Path

    from services.cli import sim_cmd

    fixture = Path(__file__).parent / "sim_fixtures" / "migration.csv"
    base = ["--trace", str(fixture), "--domains", "2", "--nodes-per-domain", "4", "--policy", "rackscale"]
    base += ["--cycle-interval", "0", "--exact-estimates", "--quiet", "--no-plots"]
    assert sim_cmd.main([*base, "--out", str(tmp_path / "on"), "--migration", "on"]) == 0
    assert sim_cmd.main([*base, "--out", str(tmp_path / "off")]) == 0
    on = json.loads((tmp_path / "on" / "report.json").read_text())
    off = json.loads((tmp_path / "off" / "report.json").read_text())
    assert on["parameters"]["migration"] is True and "migration" not in off["parameters"]
    assert on["policies"]["rackscale"]["defrag_moves"] == 1 and off["policies"]["rackscale"]["migrations"] == 0
    md = (tmp_path / "on" / "report.md").read_text()
    assert "Migration: on" in md and "| moves per day |" in md and "| GPU-h paused by moves |" in md


def test_conservation_with_migration_on_real_traces() -> None:
    """The conservation test's Philly + Kalos workload with frequent failures and migration on: no GPU held
    twice at any event batch (state.check), GPU-time adds up, every finished job's work is done once, moves
    happen (both kinds) and locality stays whole."""
    import itertools

    from shared.core import MigrationBudget
    from shared.sim.engine import SimConfig, simulate
    from shared.sim.mapping import MappingConfig, map_jobs
    from tests.unit.test_sim_conservation import FAILS, FLEET, workload

    mapped = map_jobs(workload(), MappingConfig(), FLEET.topology(), seed=3).jobs
    cfg = SimConfig(
        policy="rackscale",
        seed=3,
        fleet=FLEET,
        failures=FAILS,
        check_state=True,
        cycle_interval_s=10.0,
        queue_depth=50,
        migration=True,
        migration_budget=MigrationBudget(max_moves=16, early=True),
    )
    res = simulate(mapped, cfg)
    balanced(res)
    for r in res.jobs:
        assert (r.end is not None) != bool(r.unfinished), r.job.id
    by_job: dict[int, list] = {}
    for a in res.attempts:
        by_job.setdefault(a.job, []).append(a)
    for atts in by_job.values():
        atts.sort(key=lambda a: a.start)
        assert all(x.end <= y.start for x, y in itertools.pairwise(atts))
    m = compute(res)
    assert m["evac_moves"] > 0 and m["defrag_moves"] > 0
    assert m["locality"] == 1.0
    assert res.state_checks > 0


def test_cli_fault_plan_with_migration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """--outage scripts a node failure; with migration on the checkpointable gang on it moves to the spare."""
    import json

    from services.cli import sim_cmd

    trace = tmp_path / "g.csv"
    trace.write_text("job_id,submit_s,gpus,duration_s,tenant,checkpointable\ng,0,12,1000,t,true\n")
    args = ["--trace", str(trace), "--domains", "2", "--nodes-per-domain", "4", "--policy", "rackscale"]
    args += ["--cycle-interval", "0", "--exact-estimates", "--quiet", "--no-plots", "--failures", "off"]
    args += ["--outage", f"d00-n00:{20 / 3600}:{200 / 3600}", "--migration", "on"]
    assert sim_cmd.main([*args, "--out", str(tmp_path / "r")]) == 0
    m = json.loads((tmp_path / "r" / "report.json").read_text())["policies"]["rackscale"]
    assert m["failures"] == 1 and m["evac_moves"] == 1 and m["evac_in_place"] == 1 and m["failure_kills"] == 0
    with pytest.raises(SystemExit, match="no node 'd09-n00'"):
        sim_cmd.main([*args[:-4], "--outage", "d09-n00:1:2", "--out", str(tmp_path / "x")])
