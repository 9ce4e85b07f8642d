"""Reports: report.json (the summary as is), report.md (side-by-side table) and PNG plots.

Plots (matplotlib, headless Agg backend):
- ``occupancy.png``: allocated / healthy GPUs over the metric window per policy (mean over seeds);
- ``wait_cdf.png``: CDF of job waits per policy (all seeds pooled), log time axis;
- ``free_runs.png``: time share of domains by free whole-node run length (0..18) per policy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.sim.experiment import RunOut
from shared.sim.metrics import HEADLINE, LOWER_IS_BETTER

# how each metric is shown in the table: (label, unit kind)
LABELS: dict[str, tuple[str, str]] = {
    "occupancy": ("occupancy", "pct"),
    "goodput": ("goodput", "pct"),
    "locality": ("locality (NVLink-sensitive GPU-h)", "pct"),
    "wait_p50": ("wait p50", "time"),
    "wait_p95": ("wait p95", "time"),
    "wait_p99": ("wait p99", "time"),
    "jct_mean": ("mean JCT", "time"),
    "slowdown_mean": ("mean bounded slowdown", "x"),
    "makespan": ("makespan", "time"),
    "work_jct_mean": ("completion time, work-weighted", "time"),
    "unstarted_gpu_h": ("GPU-h unstarted at the window's end", "num"),
    "after_window_share": ("useful work done after the window", "pct"),
    "fragmentation": ("fragmentation (free GPUs head can't use)", "pct"),
    "large_avail_gpus": ("large-job availability (GPUs)", "num"),
    "large_avail_share": ("large-job availability / free GPUs", "pct"),
    "large_wait_p95": ("large-job (>=16 nodes) wait p95", "time"),
    "preemptions": ("preemptions", "num"),
    "migrations": ("migrations", "num"),
    "reservations": ("reservations", "num"),
    "reservation_hits": ("reservation hits", "num"),
    "reservation_hit_rate": ("reservation hit rate", "pct"),
    "failure_kills": ("jobs killed by node failures", "num"),
    "lost_gpu_h": ("GPU-h lost to kills", "num"),
    "slowdown_gpu_h": ("GPU-h lost to cross-domain slowdown", "num"),
    "unfinished": ("unfinished jobs", "num"),
    "smaller_layout_share": ("flexible jobs' GPU-h on a smaller segment", "pct"),
    "shrinks": ("elastic jobs shrunk (instead of preempted)", "num"),
    "grows": ("elastic jobs grown into idle room", "num"),
    "moves_per_day": ("moves per day", "num"),
    "defrag_moves": ("defragmentation moves", "num"),
    "consolidations": ("moves onto a flexible job's preferred segments", "num"),
    "evac_moves": ("evacuation moves (off failed nodes)", "num"),
    "evac_in_place": ("of those, in place on a spare", "num"),
    "move_pause_gpu_h": ("GPU-h paused by moves", "num"),
    "move_gain_gpu_h": ("GPU-h of waiting the plans saved (est.)", "num"),
}
MIGRATION_ROWS = (
    "moves_per_day",
    "defrag_moves",
    "consolidations",
    "evac_moves",
    "evac_in_place",
    "move_pause_gpu_h",
    "move_gain_gpu_h",
)


def fmt_value(v: float | None, kind: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if kind == "pct":
        return f"{100 * v:.2f}%"
    if kind == "time":
        return fmt_time(v)
    if kind == "x":
        return f"{v:.3f}x"
    return f"{v:,.1f}" if abs(v) < 100 and v != int(v) else f"{v:,.0f}"


def fmt_time(s: float) -> str:
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def fmt_spread(std: float | None, kind: str) -> str:
    if std is None:
        return ""
    if kind == "pct":
        return f" ± {100 * std:.2f}"
    if kind == "time":
        return f" ± {fmt_time(std)}"
    if kind == "x":
        return f" ± {std:.3f}"
    return f" ± {std:,.1f}"


def fmt_ci(ci: dict[str, Any], kind: str) -> str:
    """A mean_ci as `mean ± half-width` ("n/a" without a mean)."""
    mean, half = ci.get("mean"), ci.get("ci95")
    if mean is None:
        return "n/a"
    return fmt_value(mean, kind) + ("" if half is None else fmt_spread(half, kind))


def markdown(summary: dict[str, Any], title: str = "Simulation report") -> str:
    pols = list(summary["policies"])
    params = summary["parameters"]
    seeds = summary["seeds"]
    lines = [f"# {title}", ""]
    traces = ", ".join(
        t["path"] + (f" (days {t['window_days'][0]:g}-{t['window_days'][1]:g})" if t.get("window_days") else "")
        for t in params["traces"]
    )
    fleet = params["fleet"]
    lines.append(
        f"Trace: {traces}; {params['jobs']:,} jobs over {params['span_days']:.2f} days of submits. Fleet: "
        f"{fleet['domains']} domains x {fleet['nodes_per_domain']} nodes x {fleet['gpus_per_node']} GPUs "
        f"({params['fleet_gpus']:,} GPUs). Load: {params['load'] if params['load'] is not None else 'as recorded'}"
        f" (offered {params['offered_load']:.3f}). Failures: "
        + (
            f"on (MTBF {params['failures']['mtbf_days']:g} d/node, repair {params['failures']['repair_hours']:g} h)"
            if params["failures"]["enabled"]
            else "off"
        )
        + (". Migration: on" if params.get("migration") else "")
        + f". Seeds: {', '.join(str(s) for s in params['seeds'])}"
        + (" (mean ± sample std)." if seeds > 1 else ".")
    )
    lines += ["", "| metric | " + " | ".join(pols) + " |", "| --- |" + " ---: |" * len(pols)]
    with_moves = params.get("migration") or any("moves_per_day" in summary["policies"][p] for p in pols)
    mig = MIGRATION_ROWS if with_moves else ()
    shaped = ("smaller_layout_share", "shrinks", "grows")
    flexible = tuple(k for k in shaped if any(summary["policies"][p].get(k) for p in pols))
    for key in (*HEADLINE, "failure_kills", "lost_gpu_h", "slowdown_gpu_h", "unfinished", *flexible, *mig):
        label, kind = LABELS.get(key, (key, "num"))
        vals = [summary["policies"][p].get(key) for p in pols]
        present = [v for v in vals if v is not None]
        best = None
        if len(present) > 1 and len(set(present)) > 1:
            best = min(present) if key in LOWER_IS_BETTER else max(present)
        cells = []
        for p, v in zip(pols, vals, strict=True):
            std = summary["spread"][p].get(key, {}).get("std") if seeds > 1 else None
            cell = fmt_value(v, kind) + (fmt_spread(std, kind) if v is not None else "")
            cells.append(f"**{cell}**" if best is not None and v == best else cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    head = summary.get("headroom") or {}
    if head:
        rows = (("captured", "goodput headroom captured, block → ceiling"), ("ratio_to_block", "goodput / block's"))
        for key, label in rows:
            cells = []
            for p in pols:
                ci = head.get(p, {}).get(key, {})
                cells.append(fmt_ci(ci, "pct" if key == "captured" else "x"))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "Bold: best of the row. Definitions: docs/evaluation.md and shared/sim/metrics.py."]
    if head:
        lines.append("Headroom and ratio: mean over seeds, paired, ± the half-width of a 95% confidence interval.")
    tenants = tenant_table(summary)
    if tenants:
        lines += ["", tenants.rstrip("\n")]
    skipped = {k: v for lt in summary.get("loaded", []) for k, v in lt["skipped"].items()}
    if skipped or summary.get("mapping_skipped"):
        lines += [
            "",
            "Rows not used: " + ", ".join(f"{v:,} {k}" for k, v in {**skipped, **summary["mapping_skipped"]}.items()),
        ]
    unfinished = {p: u for p, u in summary.get("unfinished", {}).items() if u}
    if unfinished:
        lines += [
            "",
            "Unfinished jobs (all seeds): "
            + "; ".join(f"{p}: " + ", ".join(f"{n} {why}" for why, n in u.items()) for p, u in unfinished.items()),
        ]
    return "\n".join(lines) + "\n"


TENANT_ROWS = 12  # tenants shown in the report's per-tenant table (most GPU-hours first)


def tenant_table(summary: dict[str, Any], top: int = TENANT_ROWS) -> str:
    """Per-tenant wait, mean / p95, a column per policy label (the half-life's effect: `--half-life 0,7d,6h`);
    tenants with the most GPU-hours first. Empty for a single tenant."""
    per = summary.get("tenants") or {}
    pols = [p for p in summary["policies"] if p in per]
    if not pols:
        return ""
    first = per[pols[0]]
    if len(first) < 2:
        return ""
    ranked = sorted(first, key=lambda t: (-(first[t].get("gpu_h") or 0.0), t))
    total = sum(v.get("gpu_h") or 0.0 for v in first.values()) or 1.0
    lines = [
        f"Per-tenant wait, mean / p95 ({min(top, len(ranked))} of {len(ranked)} tenants, most GPU-hours first; jobs "
        f"and GPU-hour share from {pols[0]}):",
        "",
        "| tenant | jobs | GPU-h share | " + " | ".join(pols) + " |",
        "| --- | ---: | ---: |" + " ---: |" * len(pols),
    ]
    for t in ranked[:top]:
        cells = []
        for p in pols:
            row = per[p].get(t, {})
            mean, p95 = row.get("wait_mean"), row.get("wait_p95")
            cells.append(f"{fmt_value(mean, 'time')} / {fmt_value(p95, 'time')}")
        share = (first[t].get("gpu_h") or 0.0) / total
        lines.append(f"| {t} | {first[t]['jobs']:,.0f} | {100 * share:.1f}% | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write(
    out_dir: str | Path,
    summary: dict[str, Any],
    outs: Sequence[RunOut],
    title: str = "Simulation report",
    plots: bool = True,
) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json", out / "report.md"]
    (out / "report.json").write_text(json.dumps(summary, indent=1, sort_keys=False, default=_json_default) + "\n")
    (out / "report.md").write_text(markdown(summary, title))
    if plots:
        written += plot(out, list(summary["policies"]), outs)
    return written


def _json_default(o: object) -> object:
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def plot(out: Path, policies: Sequence[str], outs: Sequence[RunOut]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    unit = 86400.0
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for p in policies:
        runs = [o for o in outs if o.policy == p and o.samples]
        if not runs:
            continue
        n = min(len(o.samples) for o in runs)
        t0 = runs[0].samples[0][0]
        unit = 86400.0 if runs[0].samples[n - 1][0] - t0 > 2 * 86400 else 3600.0
        xs = [(runs[0].samples[i][0] - t0) / unit for i in range(n)]
        ys = [sum(o.samples[i][1] / max(o.samples[i][2], 1) for o in runs) / len(runs) for i in range(n)]
        ax.plot(xs, ys, label=p, linewidth=1.2)
    ax.set_xlabel(f"{'days' if unit == 86400.0 else 'hours'} since first submit")
    ax.set_ylabel("allocated / healthy GPUs")
    ax.set_ylim(0, 1.02)
    ax.set_title("Occupancy over time (mean over seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / "occupancy.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for p in policies:
        ws = sorted(w for o in outs if o.policy == p for w in o.waits)
        if not ws:
            continue
        n = len(ws)
        step = max(1, n // 2000)
        xs = [max(w, 1.0) for w in ws[::step]] + [max(ws[-1], 1.0)]
        ys = [i / n for i in range(0, n, step)] + [1.0]
        ax.step(xs, ys, where="post", label=p)
    ax.set_xscale("log")
    ax.set_xlabel("wait (s, waits under 1 s drawn at 1 s)")
    ax.set_ylabel("share of jobs")
    ax.set_title("Wait-time CDF (all seeds)")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out / "wait_cdf.png"))

    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(policies), 1)
    size = 1
    for i, p in enumerate(policies):
        runs = [o for o in outs if o.policy == p and o.free_runs]
        if not runs:
            continue
        size = len(runs[0].free_runs)
        tot = [sum(o.free_runs[k] for o in runs) for k in range(size)]
        s = sum(tot) or 1
        ax.bar([k + (i - (len(policies) - 1) / 2) * width for k in range(size)], [v / s for v in tot], width, label=p)
    ax.set_xticks(range(0, size if policies else 1, 2))
    ax.set_xlabel("free whole nodes in a domain (run length)")
    ax.set_ylabel("share of domain-time")
    ax.set_title("Free-run histogram (sampled over the window, all seeds)")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    paths.append(_save(fig, out / "free_runs.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


SHORT = {
    "locality": "locality",
    "fragmentation": "fragmentation",
    "large_avail_gpus": "large-job avail. GPUs",
    "large_wait_p95": "large-job wait p95",
    "reservation_hit_rate": "resv. hit rate",
    "jct_mean": "mean JCT",
    "wait_p95": "wait p95",
}
KEY_METRICS = (
    "occupancy",
    "goodput",
    "locality",
    "wait_p95",
    "jct_mean",
    "fragmentation",
    "large_avail_gpus",
    "large_wait_p95",
    "reservation_hit_rate",
)


def key_table(summary: dict[str, Any], metrics: Sequence[str] = KEY_METRICS) -> str:
    """Policies as rows, the key metrics as columns (mean ± std): the compact table of docs/evaluation.md."""
    seeds = summary["seeds"]
    head = "| policy | " + " | ".join(SHORT.get(m, m) for m in metrics) + " |"
    lines = [head, "| --- |" + " ---: |" * len(metrics)]
    for p, vals in summary["policies"].items():
        cells = []
        for m in metrics:
            kind = LABELS.get(m, (m, "num"))[1]
            v = vals.get(m)
            std = summary["spread"][p].get(m, {}).get("std") if seeds > 1 else None
            cells.append(fmt_value(v, kind) + (fmt_spread(std, kind) if v is not None else ""))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
