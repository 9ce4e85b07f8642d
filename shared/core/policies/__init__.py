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


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = ["POLICIES", "Context", "Placement", "Policy", "get_policy"]
