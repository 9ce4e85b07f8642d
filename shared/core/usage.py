"""Decayed usage: what each tenant has used lately, for fair share with memory. Pure.

A tenant's usage is the GPU-seconds its jobs held, each decayed by its age with a half-life h (Slurm's
PriorityDecayHalfLife; 7 days by default): a GPU-second used t seconds ago counts 2^(−t/h). Per tenant it is a
`TenantUsage` — the decayed GPU-seconds as of `at`, and the GPUs held from `at` on — moved only by `held` (the
tenant's holdings change by Δ GPUs at time t), so it is incremental and exact:

    value(t) = value(t0)·2^(−(t−t0)/h) + ∫ GPUs held(u)·2^(−(t−u)/h) du over [t0, t]

A change dated before `at` (a log folded a little late) adds its contribution up to `at`: the changes may come
in any order and give the same value. `charged` adds a run known only as an amount over a span (an hour bucket
of the usage view) as holdings spread evenly over it. The simulator calls `held` as attempts start and end, the
queue's leader as its fold of the job log sees runs open and close (services/queue/usage.py); both ask
`UsageLedger.shares` each cycle: one function, so the simulator measures what the queue does.

Units. `shared.core.cycle.order_jobs` orders tenants by (GPUs held now + usage) / weight, so usage goes in as
GPUs: the decayed GPU-seconds divided by τ = h / ln 2, the integral of the decay (∫ 2^(−s/h) ds over s ≥ 0).
That is the exponential moving average of the GPUs the tenant held, with time constant τ: a tenant that has
held G GPUs for much longer than τ has usage G (steady use counts twice, held now and held lately, so it yields
to a tenant that only holds G now); one that held G for a while d ≪ τ has about G·d/τ, halving every h after.
With h = 7 days (τ ≈ 10.1 days), 1,000 GPUs all night (8 h) weigh as ~33 GPUs held now, and the tenant ranks
after one that ran nothing while both hold as much; with h = 6 h, as ~600. A shorter half-life forgets sooner
and weighs a recent burst more. h = 0 turns usage off (the ledger keeps nothing; no usage goes to the cycle).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LN2 = math.log(2.0)
DEFAULT_HALF_LIFE_S = 7 * 86400.0  # Slurm's PriorityDecayHalfLife default


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """One tenant's decayed usage: `gpu_s` decayed GPU-seconds as of `at`, and `gpus` held from `at` on (they
    accrue as time passes, decayed the same way)."""

    gpu_s: float = 0.0
    gpus: float = 0.0
    at: float = 0.0


NO_USAGE = TenantUsage()


def tau(half_life_s: float) -> float:
    """h / ln 2: the decay's integral, what turns decayed GPU-seconds into GPUs (the moving average's time
    constant)."""
    return half_life_s / LN2


def _decay(dt: float, half_life_s: float) -> float:
    return 2.0 ** (-dt / half_life_s)


def held(u: TenantUsage, delta_gpus: float, t: float, half_life_s: float) -> TenantUsage:
    """The tenant's holdings change by `delta_gpus` at time `t` (a run starts: +GPUs; it ends: −GPUs)."""
    if t >= u.at:
        d = _decay(t - u.at, half_life_s)
        return TenantUsage(u.gpu_s * d + u.gpus * tau(half_life_s) * (1.0 - d), u.gpus + delta_gpus, t)
    # dated before `at`: the change, held from t to `at`, as of `at`; from `at` on it is in `gpus`
    backdated = delta_gpus * tau(half_life_s) * (1.0 - _decay(u.at - t, half_life_s))
    return TenantUsage(u.gpu_s + backdated, u.gpus + delta_gpus, u.at)


def charged(u: TenantUsage, gpu_s: float, start: float, end: float, half_life_s: float) -> TenantUsage:
    """`gpu_s` GPU-seconds used evenly over [start, end] (over at `end`: nothing of it accrues later)."""
    if end > u.at:
        u = held(u, 0.0, end, half_life_s)  # move `at` to the span's end first
    if end <= start:
        return TenantUsage(u.gpu_s + gpu_s * _decay(u.at - end, half_life_s), u.gpus, u.at)
    g = gpu_s / (end - start)
    part = g * tau(half_life_s) * (_decay(u.at - end, half_life_s) - _decay(u.at - start, half_life_s))
    return TenantUsage(u.gpu_s + part, u.gpus, u.at)


def decayed_gpu_s(u: TenantUsage, now: float, half_life_s: float) -> float:
    """The tenant's decayed GPU-seconds as of `now` (a `now` before `at`: as of `at`)."""
    if now <= u.at:
        return u.gpu_s
    d = _decay(now - u.at, half_life_s)
    return u.gpu_s * d + u.gpus * tau(half_life_s) * (1.0 - d)


def usage_gpus(u: TenantUsage, now: float, half_life_s: float) -> float:
    """The decayed usage in GPUs (the moving average of the GPUs held: see the module doc), as `order_jobs`
    takes it."""
    return decayed_gpu_s(u, now, half_life_s) / tau(half_life_s)


@dataclass(slots=True)
class UsageLedger:
    """Every tenant's `TenantUsage` under one half-life: what the simulator and the queue's leader keep."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    tenants: dict[str, TenantUsage] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.half_life_s > 0 or not math.isfinite(self.half_life_s):
            raise ValueError(
                f"half_life_s: must be a number > 0 (0 turns usage off: keep no ledger), got {self.half_life_s}"
            )

    def hold(self, tenant: str, delta_gpus: float, t: float) -> None:
        self.tenants[tenant] = held(self.tenants.get(tenant, NO_USAGE), delta_gpus, t, self.half_life_s)

    def charge(self, tenant: str, gpu_s: float, start: float, end: float) -> None:
        self.tenants[tenant] = charged(self.tenants.get(tenant, NO_USAGE), gpu_s, start, end, self.half_life_s)

    def shares(self, now: float, tenants: Iterable[str] | None = None) -> dict[str, float]:
        """The `usage` mapping `Scheduler.cycle` takes: GPUs per tenant (of `tenants`, default all) as of `now`."""
        h, known = self.half_life_s, self.tenants
        names = known if tenants is None else [t for t in tenants if t in known]
        return {t: usage_gpus(known[t], now, h) for t in names}

    def gpu_s(self, now: float) -> Mapping[str, float]:
        """Decayed GPU-seconds per tenant as of `now`."""
        return {t: decayed_gpu_s(u, now, self.half_life_s) for t, u in self.tenants.items()}
