"""Conservation on real traces (the Philly and Kalos copies in data/traces): every job finishes or is
reported unfinished with a reason, GPU-hours add up, no GPU is double-booked at any event (state.check
after every event batch), same seed same numbers."""

from __future__ import annotations

import itertools

import pytest

from shared.sim.engine import SimConfig, simulate
from shared.sim.fleet import FailureModel, FleetConfig
from shared.sim.mapping import MappingConfig, map_jobs, mix, scale_to_load
from shared.sim.metrics import compute, finished_work, gpu_seconds_balance
from shared.sim.traces import DATA_TRACES, load_trace

FLEET = FleetConfig(domains=6)
# frequent failures so kills, requeues and restores all happen in a short run
FAILS = FailureModel(enabled=True, mtbf_days=2.0, repair_hours=6.0)


def workload() -> list:
    philly = load_trace(DATA_TRACES / "philly", limit=600).jobs
    kalos = [j for j in load_trace(DATA_TRACES / "kalos").jobs if j.gpus <= 256][:40]
    jobs, _ = scale_to_load(mix([philly, kalos]), FLEET.gpus, 0.9)
    return jobs


@pytest.fixture(scope="module")
def mapped() -> list:
    return map_jobs(workload(), MappingConfig(), FLEET.topology(), seed=3).jobs


@pytest.mark.parametrize("policy", ["flat", "tree", "block", "rackscale"])
def test_conservation_on_real_traces(policy: str, mapped: list) -> None:
    cfg = SimConfig(
        policy=policy, seed=3, fleet=FLEET, failures=FAILS, check_state=True, cycle_interval_s=10.0, queue_depth=50
    )
    res = simulate(mapped, cfg)
    assert len(res.jobs) == len(mapped)
    for r in res.jobs:
        assert (r.end is not None) != bool(r.unfinished), r.job.id
        assert not r.running
    bal = gpu_seconds_balance(res)
    assert bal["allocated"] == pytest.approx(bal["useful"] + bal["lost"] + bal["overhead"] + bal["slowdown"], rel=1e-9)
    for job_id, kept, duration in finished_work(res):
        assert kept == pytest.approx(duration, abs=1e-6), job_id
    # attempts of one job never overlap; none runs on a node while it is down is checked by state.check
    by_job: dict[int, list] = {}
    for a in res.attempts:
        by_job.setdefault(a.job, []).append(a)
    for atts in by_job.values():
        atts.sort(key=lambda a: a.start)
        assert all(x.end <= y.start for x, y in itertools.pairwise(atts))
    m = compute(res)
    assert res.failures > 0 and m["failure_kills"] >= 0
    assert 0.0 < m["occupancy"] <= 1.0 and 0.0 < m["goodput"] <= m["occupancy"] + 1e-9
    if policy in ("block", "rackscale"):
        assert m["locality"] == 1.0
    assert res.state_checks == res.batches


def test_same_seed_identical_metrics(mapped: list) -> None:
    cfg = SimConfig(policy="rackscale", seed=5, fleet=FLEET, failures=FAILS, cycle_interval_s=10.0, queue_depth=50)
    a, b = compute(simulate(mapped, cfg)), compute(simulate(mapped, cfg))
    assert a == b
