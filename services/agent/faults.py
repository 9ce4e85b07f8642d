"""Fault plans for simulated agents: scripted faults (`shared.schemas.Fault`) from RACKSCALE_FAULT_PLAN.

A plan is a YAML or JSON list; `at` is seconds after the agent starts, on the agent's (injected) clock:

    - {at: 30, node: d02-n07, gpu: 3, xid: 79}          # GPU 3 falls off the bus at t=30 s
    - {at: 10, node: d05-n11, silent: true}             # the node stops heartbeating
    - {at: 0, domain: d01, hot_c: 12}                   # the whole domain runs 12 C hot
    - {at: 5, node: d00-n02, gpu: 1, temp_c: 93, flap: 1}   # a sensor flapping around the threshold
    - {at: 20, node: d00-n03, gpu: 0, nvlink_down: 2, for_s: 60}

`SimBackend` applies a node's entries (`SimBackend.schedule`); a running fleet takes one at once with
`AgentFleet.inject(Fault(...))`. Effects show in the agents' telemetry (and `silent` in every report);
the inventory's health rules turn them into GPU health.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import msgspec
import yaml

from shared.schemas import Fault

THROTTLE_REASONS = frozenset({"hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake", "sw_power_cap"})


class FaultPlanError(ValueError):
    """A plan that can't be used; the message names the file, the entry and the field."""


def check_fault(f: Fault, where: str = "fault") -> Fault:
    """A fault names exactly one target and at least one effect; returns it."""
    if (f.node is None) == (f.domain is None):
        raise FaultPlanError(f"{where}.node: name exactly one of node and domain")
    effects = (
        f.xid is not None,
        f.lost,
        f.silent,
        f.hot_c != 0.0,
        f.temp_c is not None,
        f.nvlink_down > 0,
        f.nvlink_errors_per_s > 0,
        f.ecc_uncorrected > 0,
        bool(f.throttle),
    )
    if not any(effects):
        raise FaultPlanError(
            f"{where}: no effect (xid, lost, silent, hot_c, temp_c, nvlink_down, nvlink_errors_per_s, "
            "ecc_uncorrected or throttle)"
        )
    unknown = sorted(set(f.throttle) - THROTTLE_REASONS)
    if unknown:
        raise FaultPlanError(f"{where}.throttle: unknown reason(s) {unknown}; known: {sorted(THROTTLE_REASONS)}")
    if f.silent and f.gpu is not None:
        raise FaultPlanError(f"{where}.gpu: silent is a whole node's fault")
    return f


def parse_plan(doc: object, where: str = "fault plan") -> list[Fault]:
    """Faults from a parsed YAML/JSON list; raises FaultPlanError naming the entry and the field."""
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise FaultPlanError(f"{where}: expected a list of faults")
    out = []
    for i, entry in enumerate(doc):
        try:
            fault = msgspec.convert(entry, Fault)
        except msgspec.ValidationError as e:
            raise FaultPlanError(f"{where}[{i}]: {e}") from None
        out.append(check_fault(fault, f"{where}[{i}]"))
    return out


def load_plan(path: str | Path | None) -> list[Fault]:
    """The plan of RACKSCALE_FAULT_PLAN (YAML or JSON); none when unset."""
    if path is None:
        return []
    try:
        text = Path(path).read_text()
        doc = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise FaultPlanError(f"{path}: {e}") from None
    return parse_plan(doc, str(path))


def faults_for(node: str, domain: str, plan: Iterable[Fault]) -> list[Fault]:
    """The entries of a plan that hit this node (by name or by its domain)."""
    return [f for f in plan if f.node == node or (f.node is None and f.domain == domain)]
