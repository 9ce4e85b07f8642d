"""Decayed usage (shared/core/usage.py): the decay, its incremental form against the integral, the units the
cycle's order takes, and the acceptance case — a tenant with heavy decayed usage goes after a light one when
both hold as much now (issue 25, item 6)."""

from __future__ import annotations

import math
import random

import pytest

from shared.core import Allocate
from shared.core.usage import (
    NO_USAGE,
    TenantUsage,
    UsageLedger,
    charged,
    decayed_gpu_s,
    held,
    tau,
    usage_gpus,
)
from tests.unit.cycle_builders import Run, cycle, fleet, job

H = 3600.0  # a one-hour half-life keeps the numbers readable
DAY = 86400.0


def test_a_charge_halves_after_one_half_life_and_quarters_after_two() -> None:
    u = charged(NO_USAGE, 1000.0, 0.0, 0.0, H)  # 1,000 GPU-seconds used at t=0
    assert decayed_gpu_s(u, 0.0, H) == pytest.approx(1000.0)
    assert decayed_gpu_s(u, H, H) == pytest.approx(500.0)
    assert decayed_gpu_s(u, 2 * H, H) == pytest.approx(250.0)


def test_a_run_accrues_the_integral_of_the_decay() -> None:
    """8 GPUs held from 0 to 2h, seen at 5h: 8·τ·(2^(−3) − 2^(−5)); while it runs, up to now."""
    u = held(held(NO_USAGE, 8, 0.0, H), -8, 2 * H, H)
    expected = 8 * tau(H) * (2**-3 - 2**-5)
    assert decayed_gpu_s(u, 5 * H, H) == pytest.approx(expected)
    running = held(NO_USAGE, 8, 0.0, H)
    assert decayed_gpu_s(running, 2 * H, H) == pytest.approx(8 * tau(H) * (1 - 2**-2))
    # with no decay to speak of (a half-life of years), a run is its GPU-seconds
    assert decayed_gpu_s(held(held(NO_USAGE, 8, 0.0, 1e12), -8, 100.0, 1e12), 100.0, 1e12) == pytest.approx(800.0)


def test_changes_in_any_order_give_the_same_value() -> None:
    """The queue's fold may see a run's start after a later one's: backdated changes land where they belong."""
    rng = random.Random(7)
    runs = [(rng.uniform(0, 10 * H), rng.uniform(0, 5 * H), rng.randint(1, 64)) for _ in range(40)]
    changes = [(s, g) for s, d, g in runs] + [(s + d, -g) for s, d, g in runs]
    in_order = NO_USAGE
    for t, g in sorted(changes):
        in_order = held(in_order, g, t, H)
    rng.shuffle(changes)
    shuffled = NO_USAGE
    for t, g in changes:
        shuffled = held(shuffled, g, t, H)
    integral = sum(g * tau(H) * (2 ** (-(20 * H - s - d) / H) - 2 ** (-(20 * H - s) / H)) for s, d, g in runs)
    assert decayed_gpu_s(in_order, 20 * H, H) == pytest.approx(integral, rel=1e-9)
    assert decayed_gpu_s(shuffled, 20 * H, H) == pytest.approx(integral, rel=1e-9)


def test_a_charge_spread_over_a_span_is_the_run_that_used_it() -> None:
    """An hour bucket of 4 GPU-hours (the usage view's) weighs as 4 GPUs held through that hour."""
    bucket = charged(NO_USAGE, 4 * 3600.0, 10 * H, 11 * H, H)
    run = held(held(NO_USAGE, 4, 10 * H, H), -4, 11 * H, H)
    assert decayed_gpu_s(bucket, 15 * H, H) == pytest.approx(decayed_gpu_s(run, 15 * H, H))
    # charged after later changes (the leader read its buckets after a run opened): the same
    later = held(NO_USAGE, 2, 12 * H, H)
    both = charged(later, 4 * 3600.0, 10 * H, 11 * H, H)
    assert decayed_gpu_s(both, 15 * H, H) == pytest.approx(
        decayed_gpu_s(run, 15 * H, H) + decayed_gpu_s(later, 15 * H, H)
    )


def test_usage_in_gpus_is_the_moving_average_of_the_gpus_held() -> None:
    """Held G GPUs for many half-lives: usage G; for a short while d: about G·d/τ (the module doc's example)."""
    steady = held(NO_USAGE, 100, 0.0, H)
    assert usage_gpus(steady, 50 * H, H) == pytest.approx(100.0)
    week = 7 * DAY
    night = held(held(NO_USAGE, 1000, 0.0, week), -1000, 8 * 3600.0, week)
    assert usage_gpus(night, 8 * 3600.0, week) == pytest.approx(1000 * (1 - math.exp(-8 * 3600.0 / tau(week))))
    assert 32 < usage_gpus(night, 8 * 3600.0, week) < 34
    assert usage_gpus(night, 8 * 3600.0 + week, week) == pytest.approx(usage_gpus(night, 8 * 3600.0, week) / 2)


def test_a_ledger_refuses_a_half_life_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        UsageLedger(0.0)


def test_the_ledger_shares_only_the_tenants_asked_for() -> None:
    ledger = UsageLedger(H)
    ledger.hold("a", 8, 0.0)
    ledger.hold("b", 4, 0.0)
    assert set(ledger.shares(H)) == {"a", "b"}
    assert set(ledger.shares(H, ["b", "c"])) == {"b"}
    assert ledger.shares(H)["a"] == pytest.approx(2 * ledger.shares(H)["b"])
    assert ledger.tenants["a"] == TenantUsage(gpu_s=0.0, gpus=8, at=0.0)


# d00 AAAA..............   heavy and light hold 16 GPUs each right now; heavy ran 288 GPUs all night, light
# d00 BBBB..............   ran nothing: at equal holdings the decayed usage puts heavy's job second
def test_heavy_decayed_usage_is_ordered_after_a_light_tenant_at_equal_holdings() -> None:
    now = 9 * 3600.0
    ledger = UsageLedger(7 * DAY)
    ledger.hold("heavy", 288, 0.0)  # all night, then ended
    ledger.hold("heavy", -288, 8 * 3600.0)
    ledger.hold("heavy", 16, 8 * 3600.0)  # what each holds now
    ledger.hold("light", 16, 8 * 3600.0)
    state = fleet(["AAAA" + "." * 14, "BBBB" + "." * 14], {"A": Run(tenant="heavy"), "B": Run(tenant="light")})
    # ids and submit times favour heavy: without usage, it would go first
    jobs = [job("h1", 4, tenant="heavy", submit_time=0.0), job("l1", 4, tenant="light", submit_time=5.0)]
    without = cycle(
        fleet(["AAAA" + "." * 14, "BBBB" + "." * 14], {"A": Run(tenant="heavy"), "B": Run(tenant="light")}), jobs
    )
    assert without.order == ["h1", "l1"]
    usage = ledger.shares(now)
    assert usage["heavy"] > usage["light"] + 4  # more than one job's GPUs apart
    result = cycle(state, jobs, now=now, usage=usage)
    assert result.order == ["l1", "h1"]
    assert all(isinstance(d, Allocate) for d in result.decisions)
