"""Per-tenant quotas and fair-share weights from RACKSCALE_TENANTS_FILE, as the core's `TenantPolicy`.

    tenants:
      alice: {quota_gpus: 144, weight: 2}
      bob: {quota_gpus: 72}

The queue hands them to the scheduling cycle (`CycleConfig.tenants`), which enforces them: a job that
would take its tenant past its quota waits with the numbers in its pending reason.
"""

from __future__ import annotations

import math
from pathlib import Path

import yaml

from shared.core import TenantPolicy
from shared.settings import Settings


class TenantsError(ValueError):
    """The tenants file can't be used; the message names the file and the tenant."""


def load_tenants(path: str | Path) -> dict[str, TenantPolicy]:
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TenantsError(f"{path}: {e}") from None
    tenants = doc.get("tenants") if isinstance(doc, dict) else None
    if not isinstance(tenants, dict):
        raise TenantsError(f"{path}: expected a mapping under 'tenants'")
    out: dict[str, TenantPolicy] = {}
    for name, spec in tenants.items():
        where = f"{path}: tenants.{name}"
        if not isinstance(spec, dict) or set(spec) - {"quota_gpus", "weight"}:
            raise TenantsError(f"{where}: expected a mapping of quota_gpus and weight")
        quota, weight = spec.get("quota_gpus"), spec.get("weight", 1.0)
        if quota is not None and (not isinstance(quota, int) or isinstance(quota, bool) or quota < 0):
            raise TenantsError(f"{where}.quota_gpus: must be a whole number >= 0, got {quota!r}")
        if not isinstance(weight, int | float) or isinstance(weight, bool) or not math.isfinite(weight) or weight <= 0:
            raise TenantsError(f"{where}.weight: must be a number > 0, got {weight!r}")
        out[str(name)] = TenantPolicy(weight=float(weight), quota_gpus=quota)
    return out


def tenants_from_settings(settings: Settings) -> dict[str, TenantPolicy]:
    """The configured tenants; none (no quotas, equal weights) when RACKSCALE_TENANTS_FILE is unset."""
    return load_tenants(settings.tenants_file) if settings.tenants_file else {}
