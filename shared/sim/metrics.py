"""Metrics of one simulated run, and their mean and spread over seeds.

The *window* is the span over which the trace offers its load: first to last submit (or the run's
``window``). Time integrals are taken over it, so a policy is not rewarded or punished for the tail of
a few very long jobs after the last arrival. Definitions (GPU-seconds unless said otherwise):

- ``occupancy``: allocated / healthy GPU-time in the window (healthy: GPUs on nodes that are up).
- ``goodput``: useful / healthy GPU-time in the window. Useful = the work that counted towards a job's
  completion, at the ideal (local) speed: an attempt's kept work is the part after its restore time,
  slowed by its slowdown, and only the part of it inside the window counts. Lost work (killed before a
  checkpoint), restore time and the cross-domain slowdown are allocated but not useful.
- ``locality``: of the GPU-time held by NVLink-sensitive jobs (whole run), the share whose every unit
  (segment, or whole job) sat inside one domain. ``null`` when the trace has no such jobs.
- ``wait_p50/p95/p99`` (s): first start - submit, over jobs that started (linear-interpolated percentiles).
- ``jct_mean`` (s): completion - submit over finished jobs; ``slowdown_mean``: JCT / max(duration, 10 s)
  (bounded slowdown), over finished jobs.
- ``makespan`` (s): last completion (or the run's end) - first submit. Runs always go on until every job
  has finished (or nothing more can run), so these are run-to-completion figures beside the in-window ones:
  ``work_jct_mean`` (s), completion - submit weighted by each finished job's work (GPUs x runtime), so
  finishing small jobs fast while large ones wait doesn't flatter it; ``unstarted_gpu_h``, the work
  (GPU-hours) of jobs submitted in the window that hadn't started by its end; ``after_window_share``, the
  share of all useful work done after the window (the tail in-window goodput doesn't see).
- ``headroom`` (report.json, with `block` and `ceiling` in the run): per seed (policy - block) /
  (ceiling - block) of goodput, the share of what placement could win that the policy won; its mean with a
  95% paired confidence interval over the seeds (Student's t), as for the per-seed goodput ratio to block.
- ``fragmentation``: time-averaged share of healthy GPUs that were free while the queue head (the first
  job in the cycle's order that didn't start) waited although the free GPUs could hold it in number:
  capacity its shape can't use. ``fragmentation_gpus`` is the same as a GPU count.
- ``large_avail_gpus``: time-averaged GPUs that 16-node single-domain jobs could get right now
  (``sum over domains of floor(free whole nodes / 16) x 16 x 4``); ``large_avail_share``: that over the
  free GPUs (how much of the idle capacity is in a shape a large job can use).
- ``large_wait_p95`` (s): wait p95 of jobs of 16 nodes or more (``null`` when there are none).
- ``preemptions``: attempts ended by `Preempt`; ``migrations``: running jobs moved by the core's
  migration planner (0 with migration off); ``reservations``: jobs that got a
  reservation before starting; ``reservation_hits``: of those, started no later than first promised;
  ``reservation_hit_rate`` = hits / reservations.
- ``failures``, ``failure_kills``: node failures and the job attempts they killed;
  ``lost_gpu_h``: GPU-hours of work lost to kills; ``slowdown_gpu_h``: GPU-hours lost to cross-domain
  slowdown (a flexible job's smaller layout included); ``overhead_gpu_h``: restore time (and the pauses of
  moved jobs).
- ``smaller_layout_share``: of the GPU-hours flexible jobs (several segment sizes) held, the share on a
  smaller segment than their first (``null`` without flexible jobs); ``shrinks`` / ``grows``: elastic jobs
  the cycle shrank (instead of preempting them) and the planner grew into idle room.
- With migration on (``--migration on``) also: ``migrations`` (every move of the run), ``moves_per_day``
  (moves inside the window per window day), ``defrag_plans`` / ``defrag_moves`` / ``staged_plans``,
  ``consolidations`` (flexible jobs moved onto their preferred segments, `shared/core/consolidation.py`),
  ``evac_moves`` (jobs moved off a failed node instead of requeued; ``evac_in_place``: only the failed
  node's ranks moved, to a spare in the same domain), ``evac_requeued``, ``move_pause_gpu_h`` (GPU-hours
  the moved jobs stood still: checkpoint + restore for defragmentation, restore for evacuation; counted in
  ``overhead_gpu_h`` and not useful, so goodput is net of it), ``move_gain_gpu_h`` (the planner's
  estimate of the waiting it saved: beneficiary GPUs x estimated wait, complete plans only),
  ``beneficiaries_started``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared.sim.engine import DONE, SimResult

# metrics where lower is better (for the report's "best" marks)
LOWER_IS_BETTER = frozenset(
    {
        "wait_p50",
        "wait_p95",
        "wait_p99",
        "jct_mean",
        "slowdown_mean",
        "makespan",
        "work_jct_mean",
        "unstarted_gpu_h",
        "after_window_share",
        "fragmentation",
        "fragmentation_gpus",
        "large_wait_p95",
        "preemptions",
        "migrations",
        "lost_gpu_h",
        "slowdown_gpu_h",
        "overhead_gpu_h",
        "unfinished",
    }
)
HEADLINE = (
    "occupancy",
    "goodput",
    "locality",
    "wait_p50",
    "wait_p95",
    "wait_p99",
    "jct_mean",
    "slowdown_mean",
    "makespan",
    "work_jct_mean",
    "unstarted_gpu_h",
    "after_window_share",
    "fragmentation",
    "large_avail_gpus",
    "large_avail_share",
    "large_wait_p95",
    "preemptions",
    "migrations",
    "reservations",
    "reservation_hits",
    "reservation_hit_rate",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def waits(res: SimResult, large_only: bool = False) -> list[float]:
    return [
        r.first_start - r.job.submit_s
        for r in res.jobs
        if r.first_start is not None and (r.job.large or not large_only)
    ]


def compute(res: SimResult) -> dict[str, float | int | None]:
    w0, w1 = res.window
    useful_w = useful_all = useful_after = 0.0
    sens_total = sens_local = 0.0
    lost = slow_loss = overhead = 0.0
    flex_total = flex_smaller = 0.0
    for a in res.attempts:
        job = res.jobs[a.job].job
        held = a.gpus * (a.end - a.start)
        if job.spec.fallback_segments:
            flex_total += held
            if a.segment != job.spec.segment:
                flex_smaller += held
        if job.sensitive:
            sens_total += held
            if a.cross == 0.0:
                sens_local += held
        p0 = a.start + a.overhead
        # an elastic attempt works at `rate` of its full size: its kept work took kept x pace of wall time
        useful_w += a.gpus * _overlap(p0, p0 + a.kept * a.pace, w0, w1) / a.slowdown
        useful_all += a.gpus * a.kept / a.rate
        useful_after += a.gpus * _overlap(p0, p0 + a.kept * a.pace, w1, math.inf) / a.slowdown
        lost += a.gpus * (a.done - a.kept) * a.pace
        slow_loss += a.gpus * a.kept / a.rate * (a.slowdown - 1.0)
        overhead += a.gpus * a.overhead
    finished = [r for r in res.jobs if r.end is not None]
    jct = [r.end - r.job.submit_s for r in finished if r.end is not None]
    bsld = [(r.end - r.job.submit_s) / max(r.job.duration_s, 10.0) for r in finished if r.end is not None]
    all_waits = waits(res)
    large = waits(res, large_only=True)
    first = min((r.job.submit_s for r in res.jobs), default=0.0)
    last_end = max((r.end for r in finished if r.end is not None), default=res.end_time)
    if len(finished) < len(res.jobs):
        last_end = max(last_end, res.end_time)
    span = max(w1 - w0, 1e-9)
    healthy = res.healthy_gpu_s
    # run to completion: each finished job's completion time weighted by its work (GPU-s), so a policy can't
    # look good by finishing many small jobs while the large ones wait past the window
    done_work = sum(r.job.gpus * r.job.duration_s for r in finished)
    work_jct = sum(r.job.gpus * r.job.duration_s * (r.end - r.job.submit_s) for r in finished if r.end is not None)
    unstarted = sum(
        r.job.gpus * r.job.duration_s
        for r in res.jobs
        if r.job.submit_s <= w1 and (r.first_start is None or r.first_start > w1)
    )
    return {
        "occupancy": res.alloc_gpu_s / healthy if healthy else None,
        "goodput": useful_w / healthy if healthy else None,
        "locality": sens_local / sens_total if sens_total else None,
        "wait_p50": percentile(all_waits, 50),
        "wait_p95": percentile(all_waits, 95),
        "wait_p99": percentile(all_waits, 99),
        "jct_mean": statistics.fmean(jct) if jct else None,
        "slowdown_mean": statistics.fmean(bsld) if bsld else None,
        "makespan": last_end - first,
        "work_jct_mean": work_jct / done_work if done_work else None,
        "unstarted_gpu_h": unstarted / 3600.0,
        "after_window_share": useful_after / useful_all if useful_all else None,
        "fragmentation": res.frag_gpu_s / healthy if healthy else None,
        "fragmentation_gpus": res.frag_gpu_s / span,
        "large_avail_gpus": res.large_avail_gpu_s / span,
        "large_avail_share": res.large_avail_gpu_s / res.free_gpu_s if res.free_gpu_s else None,
        "large_wait_p95": percentile(large, 95),
        "large_jobs": sum(1 for r in res.jobs if r.job.large),
        "preemptions": res.preemptions,
        "migrations": 0,
        "reservations": res.reservations,
        "reservation_hits": res.reservation_hits,
        "reservation_hit_rate": res.reservation_hits / res.reservations if res.reservations else None,
        "failures": res.failures,
        "failure_kills": res.failure_kills,
        "jobs": len(res.jobs),
        "finished": len(finished),
        "unfinished": len(res.jobs) - len(finished),
        "useful_gpu_h": useful_w / 3600.0,
        "healthy_gpu_h": healthy / 3600.0,
        "lost_gpu_h": lost / 3600.0,
        "slowdown_gpu_h": slow_loss / 3600.0,
        # of the GPU-h flexible jobs held, the share on a smaller segment than their first (null: none flexible)
        "smaller_layout_share": flex_smaller / flex_total if flex_total else None,
        "shrinks": res.shrinks,  # elastic jobs the cycle shrank instead of preempting
        "grows": res.grows,  # elastic jobs grown into idle room (migration on)
        "overhead_gpu_h": overhead / 3600.0,
        "events": res.events,
        "cycles": res.cycles,
        **_migration(res),
    }


def _migration(res: SimResult) -> dict[str, float | int]:
    """Migration figures, only for runs with migration on (so migration-off reports stay as they were)."""
    mig = res.migration
    if mig is None:
        return {}
    moves = mig.defrag_moves + mig.evac_moves + mig.consolidations
    w0, w1 = res.window
    in_window = sum(1 for t in mig.move_times if w0 <= t < w1)
    return {
        "migrations": moves,
        "moves_per_day": in_window / (max(w1 - w0, 1.0) / 86400.0),
        "defrag_plans": mig.defrag_plans,
        "defrag_moves": mig.defrag_moves,
        "staged_plans": mig.staged_plans,
        "evac_moves": mig.evac_moves,
        "evac_in_place": mig.evac_in_place,
        "evac_requeued": mig.evac_requeued,
        "consolidations": mig.consolidations,
        "move_pause_gpu_h": mig.pause_gpu_s / 3600.0,
        "move_gain_gpu_h": mig.gain_gpu_s / 3600.0,
        "beneficiaries_started": mig.beneficiaries_started,
        "plan_calls": mig.plan_calls,
    }


def tenant_figures(res: SimResult) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per tenant: its started jobs' waits (first start - submit) and the GPU-hours its attempts held (whole run):
    what `rackscale sim` reports to show fair share's effect (docs/evaluation.md, fair share with memory)."""
    waits_by: dict[str, list[float]] = {}
    for r in res.jobs:
        if r.first_start is not None:
            waits_by.setdefault(r.job.spec.tenant, []).append(r.first_start - r.job.submit_s)
    gpu_h: dict[str, float] = {}
    for a in res.attempts:
        tenant = res.jobs[a.job].job.spec.tenant
        gpu_h[tenant] = gpu_h.get(tenant, 0.0) + a.gpus * (a.end - a.start) / 3600.0
    return waits_by, gpu_h


def unfinished_reasons(res: SimResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in res.jobs:
        if r.end is None:
            out[r.unfinished or "unknown"] = out.get(r.unfinished or "unknown", 0) + 1
    return out


def aggregate(runs: Iterable[Mapping[str, float | int | None]]) -> tuple[dict[str, float | None], dict[str, dict]]:
    """Mean per metric, and the spread (std, min, max, n) over the runs that have a value."""
    rows = list(runs)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    means: dict[str, float | None] = {}
    spread: dict[str, dict] = {}
    for k in keys:
        vals = [float(v) for r in rows if (v := r.get(k)) is not None]
        if not vals:
            means[k] = None
            spread[k] = {"std": None, "min": None, "max": None, "n": 0}
            continue
        means[k] = statistics.fmean(vals)
        spread[k] = {
            "std": statistics.stdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals),
            "max": max(vals),
            "n": len(vals),
        }
    return means, spread


def gpu_seconds_balance(res: SimResult) -> dict[str, float]:
    """Allocated GPU-time split into useful work, lost work, restore overhead and slowdown (whole run).

    ``allocated - (useful + lost + overhead + slowdown)`` is 0 up to rounding: the conservation check.
    """
    alloc = useful = lost = over = slow = 0.0
    for a in res.attempts:
        alloc += a.gpus * (a.end - a.start)
        useful += a.gpus * a.kept / a.rate
        lost += a.gpus * (a.done - a.kept) * a.pace
        over += a.gpus * a.overhead
        slow += a.gpus * a.kept / a.rate * (a.slowdown - 1.0)
    return {"allocated": alloc, "useful": useful, "lost": lost, "overhead": over, "slowdown": slow}


def finished_work(res: SimResult) -> list[tuple[str, float, float]]:
    """(job id, kept work over its attempts, duration) for every finished job: the two must match."""
    kept: dict[int, float] = {}
    for a in res.attempts:
        kept[a.job] = kept.get(a.job, 0.0) + a.kept
    return [(r.job.id, kept.get(i, 0.0), r.job.duration_s) for i, r in enumerate(res.jobs) if r.end is not None]


__all__ = ["DONE", "HEADLINE", "LOWER_IS_BETTER", "aggregate", "compute", "gpu_seconds_balance", "percentile"]


# two-sided 95% Student's t quantiles by degrees of freedom (1..30); past 30 the normal's 1.96 is close enough
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def mean_ci(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and the half-width of its 95% confidence interval (None with fewer than 2 values)."""
    n = len(values)
    if not n:
        return {"mean": None, "ci95": None, "n": 0}
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": mean, "ci95": None, "n": n}
    t = _T95[n - 2] if n - 1 <= len(_T95) else 1.96
    return {"mean": mean, "ci95": t * statistics.stdev(values) / math.sqrt(n), "n": n}


def headroom(
    per_seed: Mapping[str, Mapping[str, Mapping[str, float | int | None]]], metric: str = "goodput"
) -> dict[str, dict[str, Any]]:
    """Per policy, paired over the seeds every run has: the share of the block-to-ceiling gap it captured,
    (p - block) / (ceiling - block), and its ratio to block; each per seed and as mean_ci. Empty without
    both `block` and `ceiling`."""
    if "block" not in per_seed or "ceiling" not in per_seed:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for pol, runs in per_seed.items():
        captured: dict[str, float] = {}
        ratio: dict[str, float] = {}
        for seed in runs:
            b, c, v = (per_seed[k].get(seed, {}).get(metric) for k in ("block", "ceiling", pol))
            if b is None or c is None or v is None:
                continue
            if c != b:
                captured[seed] = (float(v) - float(b)) / (float(c) - float(b))
            if b:
                ratio[seed] = float(v) / float(b)
        out[pol] = {
            "metric": metric,
            "captured": mean_ci(list(captured.values())),
            "captured_per_seed": captured,
            "ratio_to_block": mean_ci(list(ratio.values())),
        }
    return out
