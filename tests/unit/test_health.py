"""Health rules (shared.health): every rule fires, stays quiet below its threshold, ignores flapping inside its
hysteresis window and recovers only after its clear window (latched rules only through clear())."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.inventory.health import load_rules
from shared.health import (
    DEFAULT_HYSTERESIS,
    RULES,
    GpuChange,
    HealthRules,
    HealthRulesError,
    Hysteresis,
    clear,
    evaluate,
    merge_health,
    rules_from_mapping,
    verdicts,
)
from shared.schemas import GpuSample, NodeHealthState, NvLinkSample, Telemetry

PERIOD = 5.0  # seconds between samples, the default RACKSCALE_TELEMETRY_S
HEALTHY: dict[str, Any] = {
    "util": 0.9,
    "temp_c": 70.0,
    "power_w": 900.0,
    "nvlink": NvLinkSample(up=18, total=18, errors=40),
    "fabric": "completed",
    "ecc_uncorrected": 2,
}

Fields = Callable[[int], dict[str, Any]]  # sample number → the GPU's fields that differ from HEALTHY


@dataclass(frozen=True)
class Case:
    rule: str
    verdict: str
    bad: Fields  # the condition holds
    near: Fields  # close to the threshold but below it

    def __str__(self) -> str:
        return self.rule


def _errors(per_sample: int) -> Fields:
    return lambda i: {"nvlink": NvLinkSample(up=18, total=18, errors=40 + per_sample * i)}


CASES = [
    Case("xid_fatal", "down", lambda i: {"xids": [79]}, lambda i: {"xids": [13, 31, 43]}),
    Case("fell_off_bus", "down", lambda i: {"lost": True}, lambda i: {}),
    Case("xid_degraded", "degraded", lambda i: {"xids": [92]}, lambda i: {"xids": [13]}),
    # uncorrected grows by one every sample; near: corrected ones grow, the uncorrected count stays (old errors)
    Case("ecc_uncorrected", "degraded", lambda i: {"ecc_uncorrected": 2 + i}, lambda i: {"ecc_corrected": 100 * i}),
    # 10 errors per 5 s = 120/min > 60/min; near: 4 per 5 s = 48/min
    Case("nvlink_errors", "degraded", _errors(10), _errors(4)),
    Case("nvlink_down", "degraded", lambda i: {"nvlink": NvLinkSample(up=17, total=18, errors=40)}, lambda i: {}),
    Case("throttle", "degraded", lambda i: {"throttle": ["hw_thermal"]}, lambda i: {"throttle": ["sw_power_cap"]}),
    Case("temperature", "degraded", lambda i: {"temp_c": 91.0}, lambda i: {"temp_c": 89.9}),
    Case("fabric", "degraded", lambda i: {"fabric": "in_progress"}, lambda i: {"fabric": ""}),
]


def test_every_rule_has_a_case() -> None:
    assert sorted(c.rule for c in CASES) == sorted(RULES)


def sample(i: int, fields: dict[str, Any], gpu: int = 0) -> Telemetry:
    return Telemetry(node="d00-n00", at=i * PERIOD, seq=i, gpus=[GpuSample(index=gpu, **(HEALTHY | fields))])


class Feeder:
    """Feeds samples numbered 0, 1, 2, ... PERIOD s apart; records the changes and at which sample."""

    def __init__(self, rules: HealthRules | None = None) -> None:
        self.rules = rules or HealthRules()
        self.state = NodeHealthState()
        self.i = 0
        self.changes: list[tuple[int, GpuChange]] = []

    def feed(self, fields: dict[str, Any], n: int = 1) -> list[GpuChange]:
        got = []
        for _ in range(n):
            out = evaluate(self.rules, self.state, sample(self.i, fields), self.i * PERIOD)
            self.changes += [(self.i, c) for c in out]
            got += out
            self.i += 1
        return got

    def run(self, fields: Fields, n: int) -> list[GpuChange]:
        """n samples whose fields depend on the sample number (growing counters)."""
        got = []
        for _ in range(n):
            got += self.feed(fields(self.i))
        return got

    def health(self) -> str:
        return verdicts(self.state).get("0", "ok")


def hold_of(rule: str) -> int:
    """Samples (PERIOD s apart) it takes for the default hysteresis to activate the rule."""
    h = DEFAULT_HYSTERESIS[rule]
    return max(h.hold_samples, int(h.hold_s // PERIOD) + 1)


def clear_of(rule: str) -> int:
    h = DEFAULT_HYSTERESIS[rule]
    return max(h.clear_samples, int(h.clear_s // PERIOD) + 1)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rule_fires_after_its_hold(case: Case) -> None:
    f = Feeder()
    f.feed(HEALTHY)  # a first sample, so counters have a baseline
    for k in range(1, hold_of(case.rule)):
        assert f.feed(case.bad(f.i)) == [], f"{case.rule} fired after {k} sample(s)"
    changes = f.feed(case.bad(f.i))
    assert len(changes) == 1
    c = changes[0]
    assert (c.gpu, c.before, c.after, c.cause) == (0, "ok", case.verdict, case.rule)
    assert c.detail
    assert f.health() == case.verdict


@pytest.mark.parametrize("case", CASES, ids=str)
def test_rule_stays_quiet_below_its_threshold(case: Case) -> None:
    f = Feeder()
    for _ in range(40):
        f.feed(case.near(f.i))
    assert f.changes == []
    assert verdicts(f.state) == {}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_flapping_inside_the_window_changes_nothing_back_and_forth(case: Case) -> None:
    f = Feeder()
    f.feed(HEALTHY)
    for _ in range(30):  # bad, good, bad, good, ...
        f.feed(case.bad(f.i) if f.i % 2 else case.near(f.i))
    if DEFAULT_HYSTERESIS[case.rule].hold_samples > 1:
        assert f.changes == []  # never held long enough
        assert f.health() == "ok"
    else:
        # immediate rules fire on the first bad sample and the good ones in between never clear them
        assert [(c.after, c.cause) for _, c in f.changes] == [(case.verdict, case.rule)]


@pytest.mark.parametrize("case", [c for c in CASES if not DEFAULT_HYSTERESIS[c.rule].latched], ids=str)
def test_rule_recovers_only_after_its_clear_window(case: Case) -> None:
    f = Feeder()
    f.feed(HEALTHY)
    f.run(case.bad, hold_of(case.rule))
    assert f.health() == case.verdict
    for k in range(1, clear_of(case.rule)):
        assert f.feed(case.near(f.i)) == [], f"{case.rule} cleared after {k} clear sample(s)"
    (c,) = f.feed(case.near(f.i))
    assert (c.before, c.after, c.cause) == (case.verdict, "ok", case.rule)
    assert f.health() == "ok"


@pytest.mark.parametrize("case", [c for c in CASES if DEFAULT_HYSTERESIS[c.rule].latched], ids=str)
def test_latched_rule_stays_down_until_cleared(case: Case) -> None:
    f = Feeder()
    f.feed(case.bad(f.i))
    f.feed(HEALTHY, 500)  # over 40 minutes of clean samples
    assert f.health() == "down"
    assert [c.after for _, c in f.changes] == ["down"]
    (c,) = clear(f.state)
    assert (c.gpu, c.before, c.after, c.cause) == (0, "down", "ok", "cleared")
    assert f.health() == "ok" and clear(f.state) == []
    f.feed(HEALTHY, 3)
    assert f.health() == "ok"  # afresh: the old fault doesn't come back by itself


def test_hold_needs_the_time_span_too() -> None:
    # temperature: 3 samples AND 10 s; samples 1 s apart reach 3 samples after 2 s and must wait for 10 s
    rules, state = HealthRules(), NodeHealthState()
    fired_at = None
    for t in range(30):
        tel = Telemetry(node="n", at=float(t), gpus=[GpuSample(index=0, **(HEALTHY | {"temp_c": 95.0}))])
        if evaluate(rules, state, tel, float(t)) and fired_at is None:
            fired_at = t
    assert fired_at == 10


def test_down_outranks_degraded_and_the_cause_is_the_worst_rule() -> None:
    f = Feeder()
    f.feed({"temp_c": 95.0}, 3)
    assert f.health() == "degraded"
    (c,) = f.feed({"temp_c": 95.0, "xids": [48]})
    assert (c.before, c.after, c.cause, c.detail) == ("degraded", "down", "xid_fatal", "XID 48")
    # the temperature clears underneath: still down, no event
    assert f.feed(HEALTHY, 20) == []
    assert f.health() == "down"


def test_lifting_one_rule_while_another_holds_reports_what_is_left() -> None:
    f = Feeder()
    f.feed({"temp_c": 95.0}, 3)
    f.feed({"temp_c": 95.0, "ecc_uncorrected": 9})
    # temperature clears after 13 clear samples but ECC holds the GPU degraded: no change yet
    assert f.feed({"ecc_uncorrected": 9}, 13) == []
    assert f.health() == "degraded"
    (c,) = f.feed({"ecc_uncorrected": 9}, 120)
    assert (c.after, c.cause) == ("ok", "ecc_uncorrected")


def test_counters_dropping_is_a_reset_not_errors() -> None:
    f = Feeder()
    f.feed({"ecc_uncorrected": 50, "nvlink": NvLinkSample(up=18, total=18, errors=10_000)})
    f.feed({"ecc_uncorrected": 0, "nvlink": NvLinkSample(up=18, total=18, errors=0)}, 10)  # driver reloaded
    assert f.changes == []


def test_a_lost_gpu_keeps_its_last_counters() -> None:
    f = Feeder(HealthRules(hysteresis=DEFAULT_HYSTERESIS | {"fell_off_bus": Hysteresis(enabled=False)}))
    f.feed({"ecc_uncorrected": 7})
    f.feed({"lost": True, "ecc_uncorrected": 0}, 3)
    assert f.changes == []
    f.feed({"ecc_uncorrected": 7}, 3)  # back with the same count: nothing grew
    assert f.changes == []


def test_a_rate_after_a_gap_spans_the_gap() -> None:
    # 50 NVLink errors over the 55 s since the last real sample: 55/min, under 60/min (over 5 s it would be 600/min)
    at_once = Hysteresis(hold_samples=1, hold_s=0.0)
    rules = {"fell_off_bus": Hysteresis(enabled=False), "nvlink_errors": at_once}
    f = Feeder(HealthRules(hysteresis=DEFAULT_HYSTERESIS | rules))
    f.feed({"nvlink": NvLinkSample(up=18, total=18, errors=100)})
    f.feed({"lost": True}, 10)
    f.run(lambda i: {"nvlink": NvLinkSample(up=18, total=18, errors=150)}, 5)
    assert f.changes == []


def test_a_disabled_rule_never_fires() -> None:
    f = Feeder(HealthRules(hysteresis=DEFAULT_HYSTERESIS | {"temperature": Hysteresis(enabled=False)}))
    f.feed({"temp_c": 99.0}, 20)
    assert f.changes == []


def test_each_gpu_has_its_own_state_and_clear_can_pick_one() -> None:
    rules, state = HealthRules(), NodeHealthState()
    tel = Telemetry(
        node="n",
        at=0.0,
        gpus=[GpuSample(index=i, **(HEALTHY | ({"xids": [79]} if i in (1, 3) else {}))) for i in range(4)],
    )
    changes = evaluate(rules, state, tel, 0.0)
    assert [(c.gpu, c.after) for c in changes] == [(1, "down"), (3, "down")]
    assert verdicts(state) == {"1": "down", "3": "down"}
    assert [c.gpu for c in clear(state, 3)] == [3]
    assert verdicts(state) == {"1": "down"}


def test_idle_rules_are_not_stored() -> None:
    f = Feeder()
    f.feed(HEALTHY, 5)
    assert f.state.gpus["0"].rules == {}


def test_merge_health_takes_the_worst() -> None:
    assert merge_health({"0": "degraded", "2": "down"}, {"0": "down", "1": "degraded"}, {}) == {
        "0": "down",
        "1": "degraded",
        "2": "down",
    }
    assert merge_health({"0": "ok"}) == {}


# -- the rules file ----------------------------------------------------------------------------------------


def test_no_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_rules(None) == HealthRules()
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_rules(empty) == HealthRules()


def test_file_overrides_what_it_names(tmp_path: Path) -> None:
    path = tmp_path / "health.yaml"
    path.write_text(
        "fatal_xids: [79]\ntemperature_c: 80\nrules:\n  temperature: {hold_samples: 5, clear_s: 120}\n"
        "  fabric: {enabled: false}\n"
    )
    r = load_rules(path)
    assert r.fatal_xids == frozenset({79}) and r.temperature_c == 80
    assert r.of("temperature") == Hysteresis(hold_samples=5, hold_s=10.0, clear_samples=6, clear_s=120.0)
    assert not r.of("fabric").enabled
    assert r.of("xid_fatal") == DEFAULT_HYSTERESIS["xid_fatal"]


@pytest.mark.parametrize(
    ("doc", "names"),
    [
        ({"temprature_c": 80}, "temprature_c"),
        ({"rules": {"heat": {"hold_s": 1}}}, "rules.heat"),
        ({"rules": {"temperature": {"hold": 1}}}, "hold"),
        ({"rules": {"temperature": {"hold_samples": 0}}}, "rules.temperature"),
        ({"fatal_xids": ["79"]}, "fatal_xids"),
    ],
)
def test_bad_rules_name_the_field(doc: dict[str, Any], names: str) -> None:
    with pytest.raises(HealthRulesError, match=names.replace(".", r"\.")):
        rules_from_mapping(doc, "health.yaml")


def test_the_example_file_is_the_defaults() -> None:
    assert load_rules(Path(__file__).resolve().parents[2] / "deploy" / "health-rules.example.yaml") == HealthRules()


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(HealthRulesError, match=r"nope\.yaml"):
        load_rules(tmp_path / "nope.yaml")
