"""An experiment: one workload (trace, or a mix), several policies x seeds, metrics with mean and spread.

The workload is prepared once (load, window, mix, scale to the load); each (policy, seed) run maps it
with the seed (estimates, checkpointable draws), simulates it with that seed's failures and computes the
metrics. Runs are independent, so they go to a process pool; a seed gives identical numbers whatever
the pool size. Progress is reported through a callback with the overall fraction done.

A policy's label may carry a half-life for fair share with memory (`rackscale hl=7d`: `with_half_life`), so
one report sets the same policy side by side under several half-lives (`rackscale sim --half-life 0,7d,6h`);
every run also reports each tenant's waits (`summarise`: `tenants`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from shared.sim.engine import SimConfig, SimResult, simulate
from shared.sim.fleet import DAY
from shared.sim.mapping import MappingConfig, map_jobs, mix, offered_load, scale_to_load, span, window
from shared.sim.metrics import aggregate, compute, headroom, percentile, tenant_figures, unfinished_reasons
from shared.sim.traces import LoadedTrace, TraceJob, load_trace


@dataclass(frozen=True, slots=True)
class TraceSpec:
    path: str
    fmt: str | None = None
    window_days: tuple[float, float] | None = None  # submit-time window of this trace, in trace days
    limit: int | None = None  # first N usable jobs (by submit time)


ROOT = Path(__file__).resolve().parents[2]  # a trace path not found from here is looked up from the repository

# The standard workloads (docs/evaluation.md), by name: `rackscale sim --workload NAME`.
# - light: Kalos's LLM jobs with Philly days 50-57 as background (the mix of the earlier rounds);
# - heavy: the same Kalos jobs with Philly days 14-104 as background, as dense as a real shared cluster;
# - philly: Philly alone, days 88-108.
WORKLOADS: dict[str, tuple[TraceSpec, ...]] = {
    "light": (
        TraceSpec("data/traces/kalos", window_days=(0, 91)),
        TraceSpec("data/traces/philly", window_days=(50, 57)),
    ),
    "heavy": (
        TraceSpec("data/traces/kalos", window_days=(0, 91)),
        TraceSpec("data/traces/philly", window_days=(14, 104)),
    ),
    "philly": (TraceSpec("data/traces/philly", window_days=(88, 108)),),
}


@dataclass(frozen=True, slots=True)
class Experiment:
    traces: tuple[TraceSpec, ...]
    policies: tuple[str, ...] = ("flat", "tree", "block", "rackscale")
    seeds: tuple[int, ...] = (1,)
    load: float | None = None  # None: submit times as recorded
    sim: SimConfig = field(default_factory=SimConfig)
    mapping: MappingConfig = field(default_factory=MappingConfig)
    workers: int = 1


@dataclass(slots=True)
class Workload:
    jobs: list[TraceJob]
    loaded: list[LoadedTrace]
    factor: float  # submit-time stretch applied for the load (1: as recorded)
    offered: float  # offered load after scaling (see mapping.offered_load)


@dataclass(slots=True)
class RunOut:
    policy: str
    seed: int
    metrics: dict[str, Any]
    unfinished: dict[str, int]
    mapping_skipped: dict[str, int]
    mapping_notes: dict[str, int]
    wall_s: float
    samples: list[tuple[float, int, int]]
    free_runs: list[int]
    waits: list[float]
    tenant_waits: dict[str, list[float]] = field(default_factory=dict)  # tenant -> its jobs' waits
    tenant_gpu_h: dict[str, float] = field(default_factory=dict)  # tenant -> GPU-hours its attempts held


def prepare(exp: Experiment) -> Workload:
    loaded: list[LoadedTrace] = []
    parts: list[list[TraceJob]] = []
    for ts in exp.traces:
        path = ts.path if Path(ts.path).exists() or Path(ts.path).is_absolute() else str(ROOT / ts.path)
        lt = load_trace(path, ts.fmt)
        jobs = lt.jobs
        if ts.window_days is not None:
            a, b = ts.window_days
            jobs = window(jobs, a * DAY, b * DAY)
        if ts.limit is not None:
            jobs = jobs[: ts.limit]
        loaded.append(lt)
        parts.append(jobs)
    jobs = parts[0] if len(parts) == 1 else mix(parts)
    capacity = exp.sim.fleet.gpus
    factor = 1.0
    if exp.load is not None:
        jobs, factor = scale_to_load(jobs, capacity, exp.load)
    offered = offered_load(jobs, capacity) if span(jobs) > 0 else 0.0
    return Workload(jobs, loaded, factor, offered)


_WORK: tuple[Experiment, Workload] | None = None  # set in the parent before forking workers
_PROGRESS: Any = None  # shared array of per-run progress fractions


MIGRATION = "migration"  # `rackscale+migration`: that policy with the migration planner (the others without)


def split_policy(label: str) -> tuple[str, str]:
    """`rackscale+migration` -> ("rackscale", "migration"); `block` -> ("block", "")."""
    name, _, variant = label.partition("+")
    return name, variant


HALF_LIFE = " hl="  # `rackscale hl=7d`: that policy with fair share's usage decayed with a 7-day half-life
_UNITS = (("w", 7 * DAY), ("d", DAY), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def duration(text: str) -> float:
    """`7d`, `6h`, `90m`, `3600` or `3600s` -> seconds; `0` or `off` -> 0. ValueError naming what is wrong."""
    raw = text.strip().lower()
    if raw == "off":
        return 0.0
    scale = 1.0
    for suffix, unit in _UNITS:
        if raw.endswith(suffix):
            raw, scale = raw[: -len(suffix)], unit
            break
    try:
        value = float(raw) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a duration (e.g. 7d, 6h, 90m, 3600 seconds; 0 or off)") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r}: a duration is 0 or more, and finite")
    return value


def fmt_duration(seconds: float) -> str:
    """The shortest of `duration`'s forms that reads back the same (0: `off`)."""
    if seconds <= 0:
        return "off"
    for suffix, unit in _UNITS[1:]:  # days, not weeks: half-lives read as Slurm's (7-0, 7 days)
        if seconds >= unit and seconds % unit == 0:
            return f"{seconds / unit:g}{suffix}"
    return f"{seconds:g}s"


def with_half_life(label: str, half_life_s: float) -> str:
    return f"{label}{HALF_LIFE}{fmt_duration(half_life_s)}"


def split_half_life(label: str) -> tuple[str, float | None]:
    """`rackscale hl=7d` -> ("rackscale", 604800.0); a label without one -> (label, None)."""
    base, sep, value = label.partition(HALF_LIFE)
    return (base, duration(value)) if sep else (label, None)


def run_one(
    exp: Experiment, work: Workload, policy: str, seed: int, progress: Callable[[float], None] | None = None
) -> RunOut:
    base, half_life = split_half_life(policy)
    name, variant = split_policy(base)
    cfg = replace(exp.sim, policy=name, seed=seed, migration=exp.sim.migration or variant == MIGRATION)
    if half_life is not None:
        cfg = replace(cfg, usage_half_life_s=half_life)
    topo = cfg.fleet.topology()
    mapped = map_jobs(work.jobs, replace(exp.mapping, gpus_per_node=cfg.fleet.gpus_per_node), topo, seed)
    t0 = time.perf_counter()
    res: SimResult = simulate(mapped.jobs, cfg, progress)
    wall = time.perf_counter() - t0
    metrics = compute(res)
    waits = [r.first_start - r.job.submit_s for r in res.jobs if r.first_start is not None]
    tenant_waits, tenant_gpu_h = tenant_figures(res)
    return RunOut(
        policy,
        seed,
        metrics,
        unfinished_reasons(res),
        dict(mapped.skipped),
        dict(mapped.notes),
        wall,
        res.samples,
        res.free_runs,
        waits,
        tenant_waits,
        tenant_gpu_h,
    )


def _worker(task: tuple[int, str, int]) -> RunOut:
    idx, policy, seed = task
    assert _WORK is not None
    exp, work = _WORK

    def report(f: float) -> None:
        if _PROGRESS is not None:
            _PROGRESS[idx] = f

    return run_one(exp, work, policy, seed, report)


def run(exp: Experiment, progress: Callable[[float], None] | None = None) -> tuple[Workload, list[RunOut]]:
    """Every (policy, seed) run; results in (policy, seed) order whatever the completion order."""
    global _WORK, _PROGRESS
    work = prepare(exp)
    tasks = [(i, p, s) for i, (p, s) in enumerate((p, s) for p in exp.policies for s in exp.seeds)]
    n = len(tasks)
    workers = max(1, min(exp.workers, n))
    if workers == 1:
        outs = []
        for i, p, s in tasks:

            def report(f: float, i: int = i) -> None:
                if progress is not None:
                    progress((i + f) / n)

            outs.append(run_one(exp, work, p, s, report))
        return work, outs
    ctx = mp.get_context("fork")
    _WORK = (exp, work)
    _PROGRESS = ctx.Array("d", n, lock=False)
    try:
        with ctx.Pool(workers) as pool:
            pending = pool.map_async(_worker, tasks, chunksize=1)
            while not pending.ready():
                pending.wait(0.5)
                if progress is not None:
                    progress(sum(_PROGRESS) / n)
            outs = pending.get()
    finally:
        _WORK = None
        _PROGRESS = None
    return work, outs


def summarise(exp: Experiment, work: Workload, outs: Sequence[RunOut]) -> dict[str, Any]:
    """report.json's content: per policy the mean of each metric, and its spread over the seeds."""
    policies: dict[str, dict[str, Any]] = {}
    spread: dict[str, dict[str, Any]] = {}
    per_seed: dict[str, dict[str, dict[str, Any]]] = {}
    unfinished: dict[str, dict[str, int]] = {}
    timing: dict[str, dict[str, float | None]] = {}  # wall-clock: the only part a rerun changes
    for pol in exp.policies:
        runs = [o for o in outs if o.policy == pol]
        means, spr = aggregate(o.metrics for o in runs)
        policies[pol] = means
        spread[pol] = spr
        per_seed[pol] = {str(o.seed): o.metrics for o in runs}
        agg: dict[str, int] = {}
        for o in runs:
            for k, v in o.unfinished.items():
                agg[k] = agg.get(k, 0) + v
        unfinished[pol] = agg
        timing[pol] = {
            "wall_s_mean": sum(o.wall_s for o in runs) / len(runs) if runs else None,
            "events_per_s": sum(o.metrics["events"] for o in runs) / max(sum(o.wall_s for o in runs), 1e-9),
        }
    first = outs[0] if outs else None
    sim = exp.sim
    return {
        "policies": policies,
        "tenants": tenants_summary(exp.policies, outs),
        "spread": spread,
        "per_seed": per_seed,
        "headroom": headroom(per_seed),
        "unfinished": unfinished,
        "parameters": {
            "traces": [asdict(t) for t in exp.traces],
            "policies": list(exp.policies),
            "seeds": list(exp.seeds),
            "load": exp.load,
            "offered_load": work.offered,
            "submit_stretch": work.factor,
            "jobs": len(work.jobs),
            "span_days": span(work.jobs) / DAY,
            "fleet": asdict(sim.fleet),
            "fleet_gpus": sim.fleet.gpus,
            "failures": asdict(sim.failures),
            "slowdown": asdict(sim.slowdown),
            "mapping": asdict(exp.mapping),
            "reservations": sim.reservations,
            "backfill": sim.backfill,
            "preemption": sim.preemption,
            # lending reserved nodes: auto is each policy's own choice (rackscale lends), with migration on for all
            "lend_reserved": {None: "auto", True: "on", False: "off"}[sim.lend_reserved],
            "lend_min_nodes": sim.lend_min_nodes,
            "cycle_interval_s": sim.cycle_interval_s,
            "queue_depth": sim.queue_depth,
            "ckpt_interval_s": sim.ckpt_interval_s,
            "usage_half_life_s": sim.usage_half_life_s,
            "large_nodes": sim.large_nodes,
            **(
                {
                    "migration": True,
                    "migration_interval_s": sim.migration_interval_s,
                    "migration_budget": asdict(sim.migration_budget),
                }
                if sim.migration
                else {}
            ),
        },
        "loaded": [lt.summary() for lt in work.loaded],
        "mapping_skipped": first.mapping_skipped if first else {},
        "mapping_notes": first.mapping_notes if first else {},
        "seeds": len(exp.seeds),
        "spread_note": "policies[p][m] is the mean over seeds; spread[p][m] has std (sample), min, max, n",
        "timing": timing,
        "os_cpus": os.cpu_count(),
    }


def tenants_summary(labels: Sequence[str], outs: Sequence[RunOut]) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per policy label and tenant, over every seed's run: jobs started, GPU-hours held (mean per run), and the
    waits' mean, p50 and p95 (all seeds' jobs pooled)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for label in labels:
        runs = [o for o in outs if o.policy == label]
        tenants = sorted({t for o in runs for t in (*o.tenant_waits, *o.tenant_gpu_h)})
        rows: dict[str, dict[str, float | None]] = {}
        for t in tenants:
            ws = [w for o in runs for w in o.tenant_waits.get(t, ())]
            rows[t] = {
                "jobs": len(ws) / max(len(runs), 1),
                "gpu_h": sum(o.tenant_gpu_h.get(t, 0.0) for o in runs) / max(len(runs), 1),
                "wait_mean": sum(ws) / len(ws) if ws else None,
                "wait_p50": percentile(ws, 50),
                "wait_p95": percentile(ws, 95),
            }
        out[label] = rows
    return out
