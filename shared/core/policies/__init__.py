"""Placement policies, chosen by name. Same interface: `Policy.place(state, request, context)`."""

from __future__ import annotations

from shared.core.policies.base import Context, Placement, Policy
from shared.core.policies.block import BlockPolicy
from shared.core.policies.ceiling import CeilingPolicy
from shared.core.policies.flat import FlatPolicy
from shared.core.policies.rackscale import RackscalePolicy
from shared.core.policies.tree import TreePolicy

POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (FlatPolicy, TreePolicy, BlockPolicy, RackscalePolicy, CeilingPolicy)
}

# what a running system may use: the yardstick (`ceiling`) is for the simulator
RUNNABLE: tuple[str, ...] = tuple(sorted(p for p, cls in POLICIES.items() if not cls.yardstick))


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = ["POLICIES", "RUNNABLE", "Context", "Placement", "Policy", "get_policy"]
