"""GPU health rules: telemetry samples in, per-GPU verdicts out, with hysteresis. Pure: no I/O, time passed in.

Each rule looks at one GPU's sample (and the previous sample's counters) and says whether its condition
holds; an active rule gives the GPU its verdict, and the GPU's health is the worst active verdict.

| rule | verdict | condition (defaults) | hold; clear |
| --- | --- | --- | --- |
| `xid_fatal` | down | an XID in `fatal_xids` | at once; latched |
| `fell_off_bus` | down | NVML can't reach the GPU (`lost`) | at once; latched |
| `xid_degraded` | degraded | an XID in `degrading_xids` (92: high single-bit ECC rate) | at once; 12 / 600 s |
| `ecc_uncorrected` | degraded | the uncorrected ECC counter grew since the previous sample | at once; 12 / 600 s |
| `nvlink_errors` | degraded | NVLink error counters grow > `nvlink_errors_per_min` (60) | 3 / 10 s; 6 / 60 s |
| `nvlink_down` | degraded | fewer NVLink links up than the GPU has | 3 / 10 s; 6 / 60 s |
| `throttle` | degraded | a reason in `throttle_reasons` (HW slowdown, thermal, power brake) | 3 / 10 s; 6 / 60 s |
| `temperature` | degraded | `temp_c >= temperature_c` (90 C) | 3 / 10 s; 6 / 60 s |
| `fabric` | degraded | fabric registration reported and not `completed` | 3 / 10 s; 6 / 60 s |

("3 / 10 s": 3 consecutive samples spanning at least 10 s.)

Hysteresis: a rule becomes active once its condition held for `hold_samples` consecutive samples spanning at
least `hold_s` seconds, and is lifted once the condition was clear for `clear_samples` consecutive samples
spanning at least `clear_s` — a longer window, so a sensor flapping around a threshold changes nothing.
A latched rule (`xid_fatal`, `fell_off_bus`) is never lifted by samples: only `clear()` lifts it, which
inventory calls when an operator clears the node's health or its agent registers with a new boot id.
Samples count as received: a lost sample neither breaks nor extends a run (counters are cumulative, so a
rate over a gap is still right).

`rules_from_mapping(doc)` reads the same from a parsed YAML document (inventory loads RACKSCALE_HEALTH_RULES with
`services.inventory.health.load_rules`), every key optional:

    fatal_xids: [48, 63, 64, 74, 79, 94, 95, 119, 120, 140]
    temperature_c: 85
    rules:
      temperature: {hold_samples: 4, hold_s: 20, clear_samples: 10, clear_s: 120}
      fabric: {enabled: false}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import msgspec

from shared.schemas import GpuHealthState, GpuSample, NodeHealthState, RuleState, Telemetry

Health = Literal["ok", "degraded", "down"]
SEVERITY: dict[str, int] = {"ok": 0, "degraded": 1, "down": 2}

# NVIDIA XID catalogue: codes after which the GPU needs a reset before it can be trusted again.
FATAL_XIDS = frozenset(
    {
        48,  # double-bit ECC error
        63,  # ECC page retirement / row remapping recording event
        64,  # ECC page retirement / row remapping recording failure
        74,  # NVLink error
        79,  # GPU fell off the bus
        94,  # contained ECC error
        95,  # uncontained ECC error
        119,  # GSP RPC timeout
        120,  # GSP error
        140,  # unrecovered ECC error
    }
)
DEGRADING_XIDS = frozenset({92})  # high single-bit ECC error rate
THROTTLE_REASONS = frozenset({"hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"})


class HealthRulesError(ValueError):
    """The rules file can't be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class Hysteresis:
    hold_samples: int = 3
    hold_s: float = 10.0
    clear_samples: int = 6
    clear_s: float = 60.0
    latched: bool = False  # lifted only by clear(), never by samples
    enabled: bool = True


AT_ONCE = Hysteresis(hold_samples=1, hold_s=0.0)
LATCHED = replace(AT_ONCE, latched=True)
SLOW_CLEAR = replace(AT_ONCE, clear_samples=12, clear_s=600.0)

DEFAULT_HYSTERESIS: dict[str, Hysteresis] = {
    "xid_fatal": LATCHED,
    "fell_off_bus": LATCHED,
    "xid_degraded": SLOW_CLEAR,
    "ecc_uncorrected": SLOW_CLEAR,
    "nvlink_errors": Hysteresis(),
    "nvlink_down": Hysteresis(),
    "throttle": Hysteresis(),
    "temperature": Hysteresis(),
    "fabric": Hysteresis(),
}


@dataclass(frozen=True, slots=True)
class HealthRules:
    fatal_xids: frozenset[int] = FATAL_XIDS
    degrading_xids: frozenset[int] = DEGRADING_XIDS
    nvlink_errors_per_min: float = 60.0
    temperature_c: float = 90.0  # B200-class slowdown is near; a domain running 12 C hot stays below
    throttle_reasons: frozenset[str] = THROTTLE_REASONS
    hysteresis: Mapping[str, Hysteresis] = field(default_factory=lambda: dict(DEFAULT_HYSTERESIS))

    def __post_init__(self) -> None:
        unknown = set(self.hysteresis) - set(RULES)
        if unknown:
            raise ValueError(f"rules: unknown rule(s) {sorted(unknown)}; known: {', '.join(RULES)}")
        for name, h in self.hysteresis.items():
            if h.hold_samples < 1 or h.clear_samples < 1 or h.hold_s < 0 or h.clear_s < 0:
                raise ValueError(f"rules.{name}: hold_samples and clear_samples must be >= 1, hold_s and clear_s >= 0")

    def of(self, rule: str) -> Hysteresis:
        return self.hysteresis.get(rule) or DEFAULT_HYSTERESIS[rule]


@dataclass(frozen=True, slots=True)
class GpuChange:
    """A GPU whose health changed with this sample (or a clear)."""

    gpu: int
    before: Health
    after: Health
    cause: str  # the rule that fired (worse) or was lifted (better); "cleared" for clear()
    detail: str  # words for the reason, e.g. "XID 79"


# -- conditions: (rules, sample, previous state) → words when the condition holds, else None ------------------

Condition = Callable[[HealthRules, GpuSample, GpuHealthState, float], str | None]


def _xid_fatal(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    hit = [x for x in s.xids if x in r.fatal_xids]
    return f"XID {', '.join(map(str, hit))}" if hit else None


def _fell_off_bus(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    return "fell off the bus" if s.lost else None


def _xid_degraded(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    hit = [x for x in s.xids if x in r.degrading_xids]
    return f"XID {', '.join(map(str, hit))}" if hit else None


def _grew(now_count: int, before: int, seen_before: bool) -> int:
    """Growth of a cumulative counter; a drop is a reset (driver reload), not growth."""
    if not seen_before or now_count < before:
        return 0
    return now_count - before


def _ecc_uncorrected(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    if s.lost:
        return None
    grew = _grew(s.ecc_uncorrected, prev.ecc_uncorrected, prev.at is not None)
    return f"{grew} uncorrectable ECC error(s)" if grew else None


def _nvlink_errors(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    if s.lost or prev.at is None or now <= prev.at:
        return None
    grew = _grew(s.nvlink.errors, prev.nvlink_errors, True)
    per_min = grew * 60.0 / (now - prev.at)
    return (
        f"NVLink errors {per_min:.1f}/min > {r.nvlink_errors_per_min:g}/min"
        if per_min > r.nvlink_errors_per_min
        else None
    )


def _nvlink_down(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    link = s.nvlink
    return f"NVLink {link.up}/{link.total} links up" if not s.lost and link.total > 0 and link.up < link.total else None


def _throttle(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    hit = sorted(set(s.throttle) & r.throttle_reasons)
    return f"throttled ({', '.join(hit)})" if hit else None


def _temperature(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    return f"{s.temp_c:.0f} C >= {r.temperature_c:g} C" if not s.lost and s.temp_c >= r.temperature_c else None


def _fabric(r: HealthRules, s: GpuSample, prev: GpuHealthState, now: float) -> str | None:
    ok = ("", "completed", "not_supported")
    return f"fabric {s.fabric}" if not s.lost and s.fabric not in ok else None


# name → (verdict, condition), in the order causes are reported
RULES: dict[str, tuple[Health, Condition]] = {
    "xid_fatal": ("down", _xid_fatal),
    "fell_off_bus": ("down", _fell_off_bus),
    "xid_degraded": ("degraded", _xid_degraded),
    "ecc_uncorrected": ("degraded", _ecc_uncorrected),
    "nvlink_errors": ("degraded", _nvlink_errors),
    "nvlink_down": ("degraded", _nvlink_down),
    "throttle": ("degraded", _throttle),
    "temperature": ("degraded", _temperature),
    "fabric": ("degraded", _fabric),
}


# -- evaluation ------------------------------------------------------------------------------------------


def gpu_health(gpu: GpuHealthState) -> Health:
    worst: Health = "ok"
    for name, st in gpu.rules.items():
        if st.active and name in RULES and SEVERITY[RULES[name][0]] > SEVERITY[worst]:
            worst = RULES[name][0]
    return worst


def verdicts(state: NodeHealthState) -> dict[str, str]:
    """The rules' health per GPU index, ok GPUs left out (NodeRecord.rule_health)."""
    out = {idx: gpu_health(g) for idx, g in state.gpus.items()}
    return {idx: h for idx, h in sorted(out.items(), key=lambda kv: int(kv[0])) if h != "ok"}


def _step(h: Hysteresis, st: RuleState, holds: bool, now: float) -> bool:
    """Advance one rule's hysteresis by one sample; True when its activity changed."""
    if not st.active:
        st.clear, st.clear_since = 0, None
        if not holds:
            st.held, st.held_since = 0, None
            return False
        st.held += 1
        st.held_since = now if st.held_since is None else st.held_since
        if st.held >= h.hold_samples and now - st.held_since >= h.hold_s:
            st.active, st.held, st.held_since = True, 0, None
            return True
        return False
    if holds or h.latched:
        st.clear, st.clear_since = 0, None
        return False
    st.clear += 1
    st.clear_since = now if st.clear_since is None else st.clear_since
    if st.clear >= h.clear_samples and now - st.clear_since >= h.clear_s:
        st.active, st.clear, st.clear_since = False, 0, None
        return True
    return False


def evaluate(rules: HealthRules, state: NodeHealthState, sample: Telemetry, now: float) -> list[GpuChange]:
    """Apply one telemetry sample to `state` (updated in place); the GPUs whose health changed."""
    changes: list[GpuChange] = []
    for s in sorted(sample.gpus, key=lambda g: g.index):
        gpu = state.gpus.setdefault(str(s.index), GpuHealthState())
        before = gpu_health(gpu)
        fired: list[tuple[str, str]] = []  # (rule, detail) that became active
        lifted: list[str] = []
        for name, (_verdict, condition) in RULES.items():
            h = rules.of(name)
            if not h.enabled:
                gpu.rules.pop(name, None)
                continue
            detail = condition(rules, s, gpu, now)
            st = gpu.rules.get(name) or RuleState()
            if _step(h, st, detail is not None, now):
                if st.active:
                    fired.append((name, detail or ""))
                else:
                    lifted.append(name)
            if st.active or st.held or st.clear:
                gpu.rules[name] = st
            else:
                gpu.rules.pop(name, None)  # keep the stored state small: idle rules aren't stored
        if not s.lost:  # a lost GPU reports zeros: keep the last real counters and their time (rates span the gap)
            gpu.nvlink_errors, gpu.ecc_uncorrected, gpu.at = s.nvlink.errors, s.ecc_uncorrected, now
        after = gpu_health(gpu)
        if after == before:
            continue
        if SEVERITY[after] > SEVERITY[before]:
            cause, detail = next((n, d) for n, d in fired if RULES[n][0] == after)
        else:
            cause = lifted[0]
            still = [n for n, st in gpu.rules.items() if st.active]
            detail = f"{cause} clear" + (f"; still {', '.join(still)}" if still else "")
        changes.append(GpuChange(s.index, before, after, cause, detail))
    return changes


def clear(state: NodeHealthState, gpu: int | None = None) -> list[GpuChange]:
    """Forget the rules' state (latched faults included) of one GPU or all; the GPUs that get better."""
    keys = [str(gpu)] if gpu is not None else list(state.gpus)
    changes = []
    for key in sorted(keys, key=int):
        g = state.gpus.pop(key, None)
        if g is not None and gpu_health(g) != "ok":
            changes.append(GpuChange(int(key), gpu_health(g), "ok", "cleared", "health cleared"))
    return changes


def worse(a: str, b: str) -> str:
    return a if SEVERITY.get(a, 0) >= SEVERITY.get(b, 0) else b


def merge_health(*maps: Mapping[str, str]) -> dict[str, str]:
    """Per GPU index the worst of several health maps (ok GPUs left out)."""
    out: dict[str, str] = {}
    for m in maps:
        for idx, h in m.items():
            out[idx] = worse(out.get(idx, "ok"), h)
    return {idx: h for idx, h in sorted(out.items(), key=lambda kv: int(kv[0])) if h != "ok"}


# -- the rules file --------------------------------------------------------------------------------------


class _HysteresisFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    hold_samples: int | None = None
    hold_s: float | None = None
    clear_samples: int | None = None
    clear_s: float | None = None
    latched: bool | None = None
    enabled: bool | None = None


class _RulesFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    fatal_xids: list[int] | None = None
    degrading_xids: list[int] | None = None
    nvlink_errors_per_min: float | None = None
    temperature_c: float | None = None
    throttle_reasons: list[str] | None = None
    rules: dict[str, _HysteresisFile] = {}


def rules_from_mapping(doc: object, where: str = "health rules") -> HealthRules:
    """HealthRules from a parsed YAML/JSON document; raises HealthRulesError naming the field."""
    if doc is None:
        return HealthRules()
    try:
        f = msgspec.convert(doc, _RulesFile)
    except msgspec.ValidationError as e:
        raise HealthRulesError(f"{where}: {e}") from None
    base = HealthRules()
    hyst = dict(DEFAULT_HYSTERESIS)
    for name, spec in f.rules.items():
        if name not in RULES:
            raise HealthRulesError(f"{where}: rules.{name}: unknown rule; known: {', '.join(RULES)}")
        given = {k: v for k, v in msgspec.structs.asdict(spec).items() if v is not None}
        hyst[name] = replace(hyst[name], **given)
    try:
        return HealthRules(
            fatal_xids=frozenset(f.fatal_xids) if f.fatal_xids is not None else base.fatal_xids,
            degrading_xids=frozenset(f.degrading_xids) if f.degrading_xids is not None else base.degrading_xids,
            nvlink_errors_per_min=f.nvlink_errors_per_min
            if f.nvlink_errors_per_min is not None
            else base.nvlink_errors_per_min,
            temperature_c=f.temperature_c if f.temperature_c is not None else base.temperature_c,
            throttle_reasons=frozenset(f.throttle_reasons) if f.throttle_reasons is not None else base.throttle_reasons,
            hysteresis=hyst,
        )
    except ValueError as e:
        raise HealthRulesError(f"{where}: {e}") from None
