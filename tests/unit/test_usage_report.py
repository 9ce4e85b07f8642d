"""Several cells' usage answers summed into one (the router's GET /v1/usage), and the CSV form."""

from __future__ import annotations

from shared.api import UsageRow, UsageView
from shared.usage_report import merge_usage, usage_csv, wants_csv


def _view(as_of: float, *rows: tuple[str, str, float, int]) -> UsageView:
    return UsageView(
        tenant=None,
        by="day",
        start=0.0,
        end=172800.0,
        as_of=as_of,
        rows=[
            UsageRow(tenant=t, period=p, start=0.0 if p == "1970-01-01" else 86400.0, gpu_hours=h, jobs=j)
            for t, p, h, j in rows
        ],
    )


def test_cells_are_summed_by_tenant_and_period() -> None:
    a = _view(10.0, ("alice", "1970-01-01", 1.5, 2), ("bob", "1970-01-02", 4.0, 1))
    b = _view(7.0, ("alice", "1970-01-01", 0.5, 1), ("alice", "1970-01-02", 2.0, 3))
    merged = merge_usage([a, b])
    got = [(r.period, r.tenant, r.gpu_hours, r.jobs) for r in merged.rows]
    assert got == [("1970-01-01", "alice", 2.0, 3), ("1970-01-02", "alice", 2.0, 3), ("1970-01-02", "bob", 4.0, 1)]
    assert merged.as_of == 7.0  # the oldest reading: open runs are counted up to it at least
    assert merge_usage([a]).rows == a.rows


def test_csv_and_when_it_is_asked_for() -> None:
    text = usage_csv(_view(1.0, ("alice", "1970-01-01", 1.5, 2)))
    assert text == "tenant,period,start,gpu_hours,jobs\nalice,1970-01-01,0,1.500000,2\n"
    assert wants_csv("csv", "") and wants_csv(None, "text/csv; q=1") and not wants_csv("json", "text/csv")
    assert not wants_csv(None, "application/json")
