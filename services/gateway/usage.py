"""GET /v1/usage: GPU-hours per tenant and day or ISO week, read from the usage view (services/queue/usage.py).

    /v1/usage?tenant=alice&from=2025-01-01&to=2025-02-01&by=week&format=csv

`from` and `to` are ISO dates or times (UTC unless they say otherwise) or Unix seconds; `from` is rounded down
and `to` up to a period's start, so the answer covers whole periods [from, to). Defaults: the last 7 days up
to now, by day. CSV (`Accept: text/csv` or `format=csv`): `tenant,period,start,gpu_hours,jobs`. A user token's
answer is of its own tenant (asking for another's gives no rows, as a listing does). A bad parameter is a 422
naming it. The figures are the job log folded (runs of GPUs held, shared/usage_log.py), plus the runs still
holding GPUs up to now; while the view is rebuilt from the log the answer is a 503 with Retry-After.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from services.gateway.validation import ApiError
from shared import api
from shared.usage_log import DAY, Period, period_end, period_start, usage_rows
from shared.usage_report import wants_csv
from shared.usage_store import UsageSnapshot, UsageStatus

DEFAULT_SPAN_S = 7 * DAY
MAX_SPAN_DAYS = 731  # two years of days (or 104 weeks) a request at most
PERIODS: tuple[Period, ...] = ("day", "week")
NOTHING = UsageSnapshot(UsageStatus(0, "ready", 0.0), {}, {}, {})  # what a caller may not see reads as


@dataclass(frozen=True, slots=True)
class UsageQuery:
    tenant: str | None
    start: int  # a period start
    end: int  # a period start after `start`
    by: Period
    csv: bool


def _when(raw: str, name: str) -> float | ApiError:
    """Unix seconds, or an ISO date or time (UTC unless it names its offset)."""
    try:
        value = float(raw)
    except ValueError:
        try:
            t = datetime.fromisoformat(raw)
        except ValueError:
            return ApiError(
                422, f"{name}: must be an ISO date (2025-01-06), an ISO time or Unix seconds, got {raw!r}", name
            )
        value = (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(value) or not 0 <= value < 1e11:
        return ApiError(422, f"{name}: must be a time from 1970 on, got {raw!r}", name)
    return value


def usage_query(q: Mapping[str, str], accept: str, now: float) -> UsageQuery | ApiError:
    """The request's query, or the 422 naming the bad parameter."""
    by = q.get("by", "day")
    if by not in PERIODS:
        return ApiError(422, f"by: must be day or week, got {by!r}", "by")
    fmt = q.get("format")
    if fmt not in (None, "json", "csv"):
        return ApiError(422, f"format: must be json or csv, got {fmt!r}", "format")
    # blank is unset, as for `tenant` (a form's empty field)
    to = _when(q["to"], "to") if q.get("to") else now
    if isinstance(to, ApiError):
        return to
    start = _when(q["from"], "from") if q.get("from") else to - DEFAULT_SPAN_S
    if isinstance(start, ApiError):
        return start
    if start >= to:
        return ApiError(422, "to: must be after from", "to")
    lo, hi = period_start(start, by), period_end(to, by)
    if hi - lo > MAX_SPAN_DAYS * DAY:
        return ApiError(422, f"from: at most {MAX_SPAN_DAYS} days before to", "from")
    tenant = q.get("tenant") or None
    return UsageQuery(tenant, lo, hi, by, wants_csv(fmt, accept))  # type: ignore[arg-type]


def iso_day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).date().isoformat()


def usage_view(query: UsageQuery, snap: UsageSnapshot, now: float) -> api.UsageView:
    figures = usage_rows(
        snap.hours,
        snap.day_jobs,
        snap.open_runs,
        start=query.start,
        end=query.end,
        by=query.by,
        now=now,
        tenant=query.tenant,
    )
    rows = [
        api.UsageRow(tenant=f.tenant, period=iso_day(f.start), start=f.start, gpu_hours=f.gpu_s / 3600.0, jobs=f.jobs)
        for f in figures
    ]
    return api.UsageView(tenant=query.tenant, by=query.by, start=query.start, end=query.end, as_of=now, rows=rows)
