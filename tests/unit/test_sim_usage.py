"""Fair share's memory in the simulator (SimConfig.usage_half_life_s): attempts move the tenants' decayed usage and
the cycle orders by it, as the queue's leader does; and `rackscale sim --half-life` runs labels side by side.

One domain of 4 nodes x 4 GPUs (16 GPUs). Tenant `a` runs a1 on the whole fleet from 0 to 10,000 s; at 10,001 s
`a` and `b` each submit a whole-fleet job, so one of them goes first:

    without memory: both hold nothing, a ties before b by name: a2 first, b2 after it
    with memory:    a held 16 GPUs for 10,000 s: b2 first
"""

from __future__ import annotations

import argparse

import pytest

from services.cli import sim_cmd
from shared.core import JobSpec, Need
from shared.sim.engine import SimConfig, simulate
from shared.sim.experiment import duration, fmt_duration, split_half_life, with_half_life
from shared.sim.fleet import FailureModel, FleetConfig
from shared.sim.mapping import SimJob

FLEET = FleetConfig(domains=1, nodes_per_domain=4)


def job(job_id: str, tenant: str, submit: float, run_s: float) -> SimJob:
    spec = JobSpec(job_id, 16, nvlink=Need.NONE, tenant=tenant, submit_time=submit, expected_runtime_s=run_s)
    return SimJob(spec, run_s, nodes=4, unit_nodes=1, sensitive=False, ckpt_cost_s=0.0, large=False)


JOBS = [job("a1", "a", 0.0, 10_000.0), job("a2", "a", 10_001.0, 100.0), job("b2", "b", 10_001.0, 100.0)]


def starts(half_life_s: float) -> dict[str, float]:
    cfg = SimConfig(fleet=FLEET, failures=FailureModel(enabled=False), check_state=True, usage_half_life_s=half_life_s)
    res = simulate(JOBS, cfg)
    return {r.job.id: r.first_start for r in res.jobs if r.first_start is not None}


def test_without_memory_the_tie_goes_by_name() -> None:
    assert starts(0.0) == {"a1": 0.0, "a2": 10_001.0, "b2": 10_101.0}


@pytest.mark.parametrize("half_life_s", [3600.0, 7 * 86400.0])
def test_with_memory_the_tenant_that_used_the_fleet_goes_second(half_life_s: float) -> None:
    assert starts(half_life_s) == {"a1": 0.0, "b2": 10_001.0, "a2": 10_101.0}


@pytest.mark.parametrize(
    ("text", "seconds", "label"),
    [("0", 0.0, "off"), ("off", 0.0, "off"), ("7d", 604800.0, "7d"), ("1w", 604800.0, "7d"), ("6h", 21600.0, "6h"),
     ("90m", 5400.0, "90m"), ("3600", 3600.0, "1h"), ("45", 45.0, "45s")],
)  # fmt: skip
def test_half_life_durations(text: str, seconds: float, label: str) -> None:
    assert duration(text) == seconds and fmt_duration(seconds) == label
    assert split_half_life(with_half_life("rackscale+migration", seconds)) == ("rackscale+migration", seconds)
    assert split_half_life("block") == ("block", None)


@pytest.mark.parametrize("bad", ["-1d", "7x", "", "inf", "1,1"])
def test_bad_half_lives_are_refused_by_name(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    sim_cmd.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--trace", "x", "--out", "o", "--half-life", bad])
    assert "--half-life" in capsys.readouterr().err


def test_several_half_lives_become_labels_one_sets_the_config() -> None:
    parser = argparse.ArgumentParser()
    sim_cmd.add_arguments(parser)
    args = parser.parse_args(["--trace", "t.csv", "--out", "o", "--policy", "block,rackscale", "--half-life", "0,7d"])
    exp = sim_cmd.build_experiment(args)
    assert exp.policies == ("block hl=off", "block hl=7d", "rackscale hl=off", "rackscale hl=7d")
    args = parser.parse_args(["--trace", "t.csv", "--out", "o", "--half-life", "6h"])
    exp = sim_cmd.build_experiment(args)
    assert exp.sim.usage_half_life_s == 21600.0 and " hl=" not in "".join(exp.policies)


def test_the_report_sets_each_tenants_wait_side_by_side() -> None:
    from shared.sim.experiment import RunOut, tenants_summary
    from shared.sim.report import tenant_table

    def out(label: str, a: list[float], b: list[float]) -> RunOut:
        return RunOut(label, 1, {}, {}, {}, {}, 0.0, [], [], [], {"a": a, "b": b}, {"a": 30.0, "b": 10.0})

    outs = [out("rs hl=off", [0.0, 7200.0], [3600.0]), out("rs hl=7d", [0.0, 9000.0], [60.0])]
    tenants = tenants_summary(["rs hl=off", "rs hl=7d"], outs)
    assert tenants["rs hl=off"]["a"] == {"jobs": 2, "gpu_h": 30.0, "wait_mean": 3600.0, "wait_p50": 3600.0,
                                          "wait_p95": 6840.0}  # fmt: skip
    table = tenant_table({"policies": {"rs hl=off": {}, "rs hl=7d": {}}, "tenants": tenants})
    lines = table.splitlines()
    assert lines[2] == "| tenant | jobs | GPU-h share | rs hl=off | rs hl=7d |"
    assert lines[4] == "| a | 2 | 75.0% | 60.0 min / 114.0 min | 75.0 min / 2.4 h |"
    assert lines[5] == "| b | 1 | 25.0% | 60.0 min / 60.0 min | 60 s / 60 s |"
    assert tenant_table({"policies": {"x": {}}, "tenants": {"x": {"a": tenants["rs hl=off"]["a"]}}}) == ""
