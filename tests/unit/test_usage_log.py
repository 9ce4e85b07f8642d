"""The usage view's fold of the job log and its reading into periods (shared/usage_log.py), and the /v1/usage
query (services/gateway/usage.py): table-driven, pure."""

from __future__ import annotations

import pytest

from services.gateway.usage import MAX_SPAN_DAYS, usage_query, usage_view
from services.gateway.validation import ApiError
from shared.schemas import JobEvent, JobState, NodeGpus, UsageRun
from shared.usage_log import DAY, fold, fold_event, hour_pieces, period_end, period_start, usage_rows
from shared.usage_report import usage_csv
from shared.usage_store import UsageSnapshot, UsageStatus

T0 = 1_704_067_200  # Monday 2024-01-01 00:00 UTC
FOUR = [NodeGpus("n0", [0, 1, 2, 3])]
P, R, M = JobState.PLACED, JobState.RUNNING, JobState.MIGRATING


def ev(state: JobState, at: float, attempt: int, nodes: list[NodeGpus] | None = None, job: str = "j") -> JobEvent:
    return JobEvent(job_id=job, state=state, reason="", at=at, attempt=attempt, tenant="t", nodes=nodes or [])


RUN1 = UsageRun(attempt=1, tenant="t", gpus=4, since=10.0)

# (open run, last closed attempt, event) → (open run after, last closed after, the closed run's (start, end))
FOLD_CASES = [
    pytest.param(None, 0, ev(JobState.PENDING, 5.0, 0), (None, 0, None), id="pending-holds-nothing"),
    pytest.param(None, 0, ev(P, 10.0, 1, FOUR), (RUN1, 0, None), id="placed-opens"),
    pytest.param(None, 0, ev(R, 10.0, 1, FOUR), (RUN1, 0, None), id="running-opens-when-placed-never-logged"),
    pytest.param(RUN1, 0, ev(R, 12.0, 1, FOUR), (RUN1, 0, None), id="running-keeps-the-run"),
    pytest.param(RUN1, 0, ev(M, 12.0, 1, FOUR), (RUN1, 0, None), id="migrating-keeps-it-checkpointing-holds"),
    pytest.param(RUN1, 0, ev(JobState.SUCCEEDED, 70.0, 1), (None, 1, (10.0, 70.0)), id="an-end-closes"),
    pytest.param(RUN1, 0, ev(JobState.PREEMPTED, 30.0, 1), (None, 1, (10.0, 30.0)), id="preempted-closes"),
    pytest.param(RUN1, 0, ev(JobState.PENDING, 30.0, 2), (None, 1, (10.0, 30.0)), id="requeued-closes"),
    pytest.param(
        RUN1,
        0,
        ev(P, 40.0, 2, FOUR),
        (UsageRun(attempt=2, tenant="t", gpus=4, since=40.0), 1, (10.0, 40.0)),
        id="a-later-attempt-closes-and-opens",
    ),
    pytest.param(None, 1, ev(P, 10.0, 1, FOUR), (None, 1, None), id="a-late-repeat-of-a-closed-attempt"),
    pytest.param(RUN1, 0, ev(P, 5.0, 0, FOUR), (RUN1, 0, None), id="an-earlier-attempts-late-event"),
    pytest.param(RUN1, 0, ev(JobState.CANCELLED, 5.0, 1), (None, 1, (10.0, 10.0)), id="an-end-stamped-early-is-empty"),
    pytest.param(None, 0, ev(P, 10.0, 1, []), (None, 0, None), id="no-gpus-no-run"),
]


@pytest.mark.parametrize(("run", "floor", "event", "expected"), FOLD_CASES)
def test_fold_event(run, floor, event, expected) -> None:
    new, new_floor, closed = fold_event(run, floor, event)
    want_run, want_floor, want_span = expected
    assert (new, new_floor) == (want_run, want_floor)
    assert (None if closed is None else (closed.start, closed.end)) == want_span
    if closed is not None:
        assert (closed.tenant, closed.gpus, closed.job_id) == ("t", 4, "j")


def test_hour_pieces_cut_at_whole_hours() -> None:
    assert hour_pieces(T0 + 1800, T0 + 9000) == [(T0, 1800.0), (T0 + 3600, 3600.0), (T0 + 7200, 1800.0)]
    assert hour_pieces(T0, T0 + 3600) == [(T0, 3600.0)]
    assert hour_pieces(T0, T0) == []


def test_a_batch_charges_each_hour_and_day_once_and_says_what_changed() -> None:
    events = [
        ev(P, T0 + DAY - 1800, 1, FOUR),
        ev(R, T0 + DAY - 1790, 1, FOUR),
        ev(JobState.SUCCEEDED, T0 + DAY + 1800, 1),
        ev(P, T0 + 10, 1, FOUR, job="k"),
    ]
    batch = fold({}, {}, events)
    assert batch.gpu_s == {T0: {"t/23": 4 * 1800.0}, T0 + DAY: {"t/00": 4 * 1800.0}}
    assert batch.jobs == {T0: {"t/j"}, T0 + DAY: {"t/j"}}
    assert batch.open == {"k": UsageRun(attempt=1, tenant="t", gpus=4, since=T0 + 10)}
    assert batch.floors == {"j": 1} and not batch.gone
    assert batch.changes == [("t", 4, T0 + DAY - 1800), ("t", -4, T0 + DAY + 1800), ("t", 4, T0 + 10)]
    # the open run closes in a later stretch: gone from the open runs
    later = fold(batch.open, batch.floors, [ev(JobState.FAILED, T0 + 20, 1, job="k")])
    assert later.gone == {"k"} and later.floors == {"k": 1} and later.gpu_s == {T0: {"t/00": 40.0}}


@pytest.mark.parametrize(
    ("t", "by", "start", "end"),
    [
        pytest.param(T0 + 5, "day", T0, T0 + DAY, id="day"),
        pytest.param(T0, "day", T0, T0, id="a-day-start-is-its-own-end"),
        pytest.param(T0 + 3 * DAY + 5, "week", T0, T0 + 7 * DAY, id="thursday-in-mondays-week"),
        pytest.param(T0 - 1, "week", T0 - 7 * DAY, T0, id="sunday-before"),
    ],
)
def test_periods(t: float, by: str, start: int, end: int) -> None:
    assert period_start(t, by) == start  # type: ignore[arg-type]
    assert period_end(t, by) == end  # type: ignore[arg-type]


def test_rows_add_closed_hours_and_open_runs_up_to_now_within_the_range() -> None:
    hours = {T0: {"a/01": 3600.0, "b/02": 7200.0}, T0 + DAY: {"a/00": 1800.0}, T0 + 9 * DAY: {"a/00": 1.0}}
    jobs = {T0: {"a/j1", "b/j2"}, T0 + DAY: {"a/j1"}, T0 + 9 * DAY: {"a/j9"}}
    open_runs = {"j3": UsageRun(attempt=1, tenant="a", gpus=2, since=T0 + DAY - 3600)}
    now = T0 + DAY + 3600
    rows = usage_rows(hours, jobs, open_runs, start=T0, end=T0 + 7 * DAY, by="day", now=now)
    got = [(r.tenant, r.start, r.gpu_s, r.jobs) for r in rows]
    assert got == [
        ("a", T0, 3600.0 + 2 * 3600.0, 2),
        ("b", T0, 7200.0, 1),
        ("a", T0 + DAY, 1800.0 + 2 * 3600.0, 2),
    ]
    weekly = usage_rows(hours, jobs, open_runs, start=T0, end=T0 + 7 * DAY, by="week", now=now, tenant="a")
    assert [(r.tenant, r.start, r.gpu_s, r.jobs) for r in weekly] == [("a", T0, 3600.0 + 1800.0 + 4 * 3600.0, 2)]


# -- the query ------------------------------------------------------------------------------------------------
NOW = T0 + 3 * DAY + 100.0


@pytest.mark.parametrize(
    ("query", "accept", "field"),
    [
        pytest.param({"by": "month"}, "", "by", id="by"),
        pytest.param({"format": "xml"}, "", "format", id="format"),
        pytest.param({"from": "yesterday"}, "", "from", id="from-not-a-time"),
        pytest.param({"to": "2024-13-01"}, "", "to", id="to-not-a-date"),
        pytest.param({"from": "-5"}, "", "from", id="before-1970"),
        pytest.param({"from": "nan"}, "", "from", id="not-finite"),
        pytest.param({"from": "2024-01-05", "to": "2024-01-02"}, "", "to", id="to-before-from"),
        pytest.param({"from": "2020-01-01", "to": "2024-01-01"}, "", "from", id="too-long"),
    ],
)
def test_a_bad_parameter_is_a_422_naming_it(query: dict[str, str], accept: str, field: str) -> None:
    got = usage_query(query, accept, NOW)
    assert isinstance(got, ApiError) and got.status == 422 and got.field == field, got
    assert got.error.startswith(f"{field}: ")


def test_defaults_are_the_last_seven_days_by_day_as_json() -> None:
    q = usage_query({}, "application/json", NOW)
    assert not isinstance(q, ApiError)
    assert (q.start, q.end, q.by, q.csv, q.tenant) == (T0 - 4 * DAY, T0 + 4 * DAY, "day", False, None)


def test_dates_times_and_seconds_round_to_whole_periods() -> None:
    q = usage_query({"from": "2024-01-03T12:00:00+00:00", "to": str(T0 + 9 * DAY + 1), "by": "week"}, "", NOW)
    assert not isinstance(q, ApiError) and (q.start, q.end) == (T0, T0 + 14 * DAY)
    q = usage_query({"from": "2024-01-02", "to": "2024-01-04", "tenant": "a"}, "text/csv", NOW)
    assert not isinstance(q, ApiError) and (q.start, q.end, q.csv, q.tenant) == (T0 + DAY, T0 + 3 * DAY, True, "a")
    q = usage_query({"format": "json"}, "text/csv", NOW)  # format wins over Accept
    assert not isinstance(q, ApiError) and not q.csv
    q = usage_query({"from": str(NOW - MAX_SPAN_DAYS * DAY + 2 * DAY), "to": str(NOW)}, "", NOW)
    assert not isinstance(q, ApiError)


def test_the_view_and_its_csv() -> None:
    q = usage_query({"from": "2024-01-01", "to": "2024-01-03"}, "", NOW)
    assert not isinstance(q, ApiError)
    snap = UsageSnapshot(UsageStatus(9, "ready", NOW), {T0: {"a/01": 5400.0}}, {T0: {"a/j1"}}, {})
    view = usage_view(q, snap, NOW)
    assert [(r.tenant, r.period, r.start, r.gpu_hours, r.jobs) for r in view.rows] == [("a", "2024-01-01", T0, 1.5, 1)]
    assert usage_csv(view) == f"tenant,period,start,gpu_hours,jobs\na,2024-01-01,{T0},1.500000,1\n"


def test_blank_from_and_to_are_unset() -> None:
    assert usage_query({"from": "", "to": ""}, "", NOW) == usage_query({}, "", NOW)
