"""The yardstick's arithmetic: headroom captured with paired confidence intervals, and run-to-completion figures."""

from __future__ import annotations

import pytest

from shared.sim.metrics import compute, headroom, mean_ci
from tests.unit.test_sim_engine import run


def test_mean_ci_uses_students_t() -> None:
    assert mean_ci([]) == {"mean": None, "ci95": None, "n": 0}
    assert mean_ci([0.5]) == {"mean": 0.5, "ci95": None, "n": 1}
    two = mean_ci([0.4, 0.6])  # sd 0.1414, t(1) = 12.706
    assert two["mean"] == pytest.approx(0.5) and two["ci95"] == pytest.approx(12.706 * 0.1414214 / 2**0.5, rel=1e-4)
    many = mean_ci([1.0] * 40)
    assert many["ci95"] == 0.0 and many["n"] == 40


def test_headroom_is_paired_by_seed() -> None:
    per_seed = {
        "block": {"1": {"goodput": 0.60}, "2": {"goodput": 0.70}},
        "ceiling": {"1": {"goodput": 0.70}, "2": {"goodput": 0.80}},
        "rackscale": {"1": {"goodput": 0.65}, "2": {"goodput": 0.78}},
        "flat": {"1": {"goodput": 0.55}, "2": {"goodput": None}},  # a seed without a figure is left out
    }
    h = headroom(per_seed)
    assert h["rackscale"]["captured_per_seed"] == pytest.approx({"1": 0.5, "2": 0.8})
    assert h["rackscale"]["captured"]["mean"] == pytest.approx(0.65) and h["rackscale"]["captured"]["n"] == 2
    assert h["rackscale"]["ratio_to_block"]["mean"] == pytest.approx((0.65 / 0.60 + 0.78 / 0.70) / 2)
    assert h["block"]["captured"]["mean"] == 0.0 and h["ceiling"]["captured"]["mean"] == 1.0
    assert h["flat"]["captured_per_seed"] == pytest.approx({"1": -0.5})
    assert headroom({"block": per_seed["block"], "rackscale": per_seed["rackscale"]}) == {}  # no ceiling, no yardstick


def test_run_to_completion_figures() -> None:
    """backfill.csv on 2 x 4 nodes of 4 GPUs: a 16 GPUs x 100 s, b 12 x 50, c 8 x 30 (starts at 50), d 4 x 10 (from
    5 to 15); the window is the submits' span, 0 to 5."""
    m = compute(run("backfill.csv", "rackscale"))
    work = {"a": 1600.0, "b": 600.0, "c": 240.0, "d": 40.0}
    jct = {"a": 100.0, "b": 50.0, "c": 80.0, "d": 10.0}
    assert m["work_jct_mean"] == pytest.approx(sum(work[j] * jct[j] for j in work) / sum(work.values()))
    assert m["unstarted_gpu_h"] == pytest.approx(240.0 / 3600)  # c hadn't started at 5; d started at 5
    after = 16 * 95 + 12 * 45 + 8 * 30 + 4 * 10
    assert m["after_window_share"] == pytest.approx(after / sum(work.values()))
