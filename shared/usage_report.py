"""GET /v1/usage's answer beyond its JSON: the CSV form, and the merge of several cells' answers (the router's).
Pure: views in, a view or text out."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from shared import api

CSV_TYPE = "text/csv"
CSV_HEADER = ("tenant", "period", "start", "gpu_hours", "jobs")


def wants_csv(fmt: str | None, accept: str) -> bool:
    """`format=csv`, or no format and an Accept naming text/csv."""
    return fmt == "csv" or (fmt is None and CSV_TYPE in accept.lower())


def usage_csv(view: api.UsageView) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_HEADER)
    for r in view.rows:
        w.writerow((r.tenant, r.period, f"{r.start:.0f}", f"{r.gpu_hours:.6f}", r.jobs))
    return out.getvalue()


def merge_usage(views: Sequence[api.UsageView]) -> api.UsageView:
    """Several cells' answers to one query as one: a tenant's GPU-hours and jobs of a period summed over the cells
    (a job lives in one cell, so its jobs don't repeat); `as_of` the oldest of theirs."""
    first = views[0]
    rows: dict[tuple[str, str], api.UsageRow] = {}
    for view in views:
        for r in view.rows:
            key = (r.period, r.tenant)
            had = rows.get(key)
            rows[key] = (
                r
                if had is None
                else api.UsageRow(
                    tenant=r.tenant,
                    period=r.period,
                    start=r.start,
                    gpu_hours=had.gpu_hours + r.gpu_hours,
                    jobs=had.jobs + r.jobs,
                )
            )
    return api.UsageView(
        tenant=first.tenant,
        by=first.by,
        start=first.start,
        end=first.end,
        as_of=min(v.as_of for v in views),
        rows=[rows[k] for k in sorted(rows)],
    )
