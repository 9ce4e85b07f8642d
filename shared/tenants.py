"""Per-tenant quotas, fair-share weights and home cells from RACKSCALE_TENANTS_FILE.

    tenants:
      alice: {quota_gpus: 144, weight: 2}
      bob: {quota_gpus: 72, cell: c1}

The queue hands quotas and weights to the scheduling cycle (`CycleConfig.tenants`, as the core's
`TenantPolicy`), which enforces them: a job that would take its tenant past its quota waits with the numbers in
its pending reason. `cell` is the tenant's home cell: the router (services/router) sends every job of the tenant
there; a tenant without one goes to the cell where its job fits best. A quota holds within each cell.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from shared.core import TenantPolicy
from shared.names import CELL_NAME
from shared.settings import Settings

FIELDS = ("quota_gpus", "weight", "cell")


class TenantsError(ValueError):
    """The tenants file can't be used; the message names the file and the tenant."""


def _entries(path: str | Path) -> dict[str, dict[str, Any]]:
    """The file's tenants, each checked: a mapping of FIELDS with valid values."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TenantsError(f"{path}: {e}") from None
    tenants = doc.get("tenants") if isinstance(doc, dict) else None
    if not isinstance(tenants, dict):
        raise TenantsError(f"{path}: expected a mapping under 'tenants'")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in tenants.items():
        where = f"{path}: tenants.{name}"
        if not isinstance(spec, dict) or set(spec) - set(FIELDS):
            raise TenantsError(f"{where}: expected a mapping of {', '.join(FIELDS)}")
        quota, weight, cell = spec.get("quota_gpus"), spec.get("weight", 1.0), spec.get("cell")
        if quota is not None and (not isinstance(quota, int) or isinstance(quota, bool) or quota < 0):
            raise TenantsError(f"{where}.quota_gpus: must be a whole number >= 0, got {quota!r}")
        if not isinstance(weight, int | float) or isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0:
            raise TenantsError(f"{where}.weight: must be a number > 0, got {weight!r}")
        if cell is not None and not (isinstance(cell, str) and CELL_NAME.fullmatch(cell)):
            raise TenantsError(f"{where}.cell: must be a cell name (1-64 of A-Z a-z 0-9 _ -), got {cell!r}")
        out[str(name)] = spec
    return out


def load_tenants(path: str | Path) -> dict[str, TenantPolicy]:
    """Each tenant's quota and weight (what the queue schedules by)."""
    return {
        name: TenantPolicy(weight=float(spec.get("weight", 1.0)), quota_gpus=spec.get("quota_gpus"))
        for name, spec in _entries(path).items()
    }


def load_home_cells(path: str | Path) -> dict[str, str]:
    """Tenant → home cell, for the tenants that have one (what the router routes by)."""
    return {name: spec["cell"] for name, spec in _entries(path).items() if spec.get("cell") is not None}


def tenants_from_settings(settings: Settings) -> dict[str, TenantPolicy]:
    """The configured tenants; none (no quotas, equal weights) when RACKSCALE_TENANTS_FILE is unset."""
    return load_tenants(settings.tenants_file) if settings.tenants_file else {}
