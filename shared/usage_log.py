"""The usage view's fold of the job log, and its reading into periods. Pure: events in, writes and rows out.

The job log (JobEvents on `events.job.<id>`, EVENTS stream) is the source of truth. A *run* is one job attempt
holding GPUs: it opens at the attempt's first event in a holding state (`placed`, `running`, `migrating`:
normally `placed`, which the queue logs before the job's ranks start; `running` when the placed event never
reached the log) and closes at the job's next event that shows it past that attempt — another state
(`succeeded`, `failed`, `cancelled`, `preempted`, `pending` after a requeue or a move's checkpoint) or a later
attempt. The tenant is charged the run's GPUs (its event's allocation) times its length, at the events' own
times: GPU-hours held, as Slurm charges an allocation, a move's checkpoint included (the GPUs are the job's until
every rank acknowledged it). An event of an attempt at or below the job's last closed one is a late repeat.

`fold` turns a stretch of the log into one `UsageBatch`: the runs opened and closed, the GPU-seconds per tenant
and UTC hour (a run is cut at whole hours, so a day's figure counts what was used that day), the jobs seen per
day, and the same as holding changes (`changes`) for the leader's decayed usage (shared/core/usage.py). The
queue's leader writes a batch in one step with the log position it reaches (services/queue/usage.py), so the
view is always the fold of the log up to its recorded position: a rebuild is the same fold from the start.

`usage_rows` reads the view back into the API's rows: per tenant and day (or ISO week, from Monday), GPU-hours
and the distinct jobs that held GPUs in it; a run still open counts up to `now`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from shared.schemas import HOLDING, JobEvent, UsageRun

HOUR = 3600
DAY = 86400
WEEK = 7 * DAY
_MONDAY = 3  # 1970-01-01 (day 0) was a Thursday: day d's weekday (Monday 0) is (d + 3) % 7
Period = Literal["day", "week"]
SEP = "/"  # tenant names never hold it (schemas.Name); job ids neither


@dataclass(frozen=True, slots=True)
class ClosedRun:
    job_id: str
    tenant: str
    gpus: int
    start: float
    end: float


def fold_event(run: UsageRun | None, floor: int, ev: JobEvent) -> tuple[UsageRun | None, int, ClosedRun | None]:
    """One job's event against its open run (or None) and its last closed attempt: (the open run after it, the
    last closed attempt after it, the run it closed or None)."""
    closed: ClosedRun | None = None
    if run is not None:
        if ev.attempt < run.attempt or (ev.attempt == run.attempt and ev.state in HOLDING):
            return run, floor, None  # still holding (placed → running → migrating), or a late earlier attempt's
        closed = ClosedRun(ev.job_id, run.tenant, run.gpus, run.since, max(ev.at, run.since))
        floor, run = max(floor, run.attempt), None
    if ev.state in HOLDING and ev.attempt > floor:
        gpus = sum(len(ng.gpus) for ng in ev.nodes)
        if gpus:
            run = UsageRun(attempt=ev.attempt, tenant=ev.tenant or "-", gpus=gpus, since=ev.at)
    return run, floor, closed


def hour_pieces(start: float, end: float) -> list[tuple[int, float]]:
    """[start, end) cut at whole UTC hours: (the hour's start, seconds of it inside)."""
    out: list[tuple[int, float]] = []
    t = start
    while t < end:
        hour = int(t // HOUR) * HOUR
        stop = min(end, hour + HOUR)
        out.append((hour, stop - t))
        t = stop
    return out


def day_of(t: float) -> int:
    return int(t // DAY) * DAY


def hour_field(tenant: str, hour: int) -> str:
    """The field of `usage:day:<day>` for a tenant's hour (00-23 of that day)."""
    return f"{tenant}{SEP}{(hour % DAY) // HOUR:02d}"


def job_member(tenant: str, job_id: str) -> str:
    return f"{tenant}{SEP}{job_id}"


@dataclass(slots=True)
class UsageBatch:
    """What a stretch of the log adds to the view, written in one step (`UsageStore.apply`)."""

    open: dict[str, UsageRun] = field(default_factory=dict)  # job → its open run now (written)
    gone: set[str] = field(default_factory=set)  # jobs whose run closed with none open now (deleted)
    floors: dict[str, int] = field(default_factory=dict)  # job → its last closed attempt
    gpu_s: dict[int, dict[str, float]] = field(default_factory=dict)  # day start → hour field → GPU-seconds added
    jobs: dict[int, set[str]] = field(default_factory=dict)  # day start → job members seen
    closed: list[ClosedRun] = field(default_factory=list)
    # (tenant, change in GPUs held, at) in log order: the runs opened and closed, for a decayed ledger
    changes: list[tuple[str, float, float]] = field(default_factory=list)

    def charge(self, run: ClosedRun) -> None:
        self.closed.append(run)
        for hour, seconds in hour_pieces(run.start, run.end):
            day = day_of(hour)
            fields = self.gpu_s.setdefault(day, {})
            key = hour_field(run.tenant, hour)
            fields[key] = fields.get(key, 0.0) + run.gpus * seconds
            self.jobs.setdefault(day, set()).add(job_member(run.tenant, run.job_id))


def fold(open_runs: Mapping[str, UsageRun], floors: Mapping[str, int], events: Iterable[JobEvent]) -> UsageBatch:
    """The batch a stretch of job events (in log order) makes, from the jobs' open runs and last closed attempts
    before it (a job in neither: none open, nothing closed)."""
    batch = UsageBatch()
    runs: dict[str, UsageRun | None] = {}
    last: dict[str, int] = {}
    for ev in events:
        job = ev.job_id
        run = runs[job] if job in runs else open_runs.get(job)
        floor = last[job] if job in last else floors.get(job, 0)
        new, new_floor, closed = fold_event(run, floor, ev)
        if closed is not None:
            batch.charge(closed)
            batch.changes.append((closed.tenant, -closed.gpus, closed.end))
        if new is not None and new is not run:
            batch.changes.append((new.tenant, new.gpus, new.since))
        runs[job], last[job] = new, new_floor
    for job, run in runs.items():
        if run is not None and run != open_runs.get(job):
            batch.open[job] = run
        elif run is None and job in open_runs:
            batch.gone.add(job)
        if last[job] != floors.get(job, 0):
            batch.floors[job] = last[job]
    return batch


# -- reading: periods ----------------------------------------------------------------------------------------
def period_start(t: float, by: Period) -> int:
    """The start of the UTC day, or of the ISO week (Monday 00:00 UTC), holding `t`."""
    day = int(t // DAY)
    if by == "day":
        return day * DAY
    return (day - (day + _MONDAY) % 7) * DAY


def period_end(t: float, by: Period) -> int:
    """The first period start at or after `t` (t itself when it is one)."""
    start = period_start(t, by)
    return start if start >= t else start + (DAY if by == "day" else WEEK)


@dataclass(frozen=True, slots=True)
class UsageFigure:
    tenant: str
    start: int  # the period's start (Unix seconds, UTC)
    gpu_s: float
    jobs: int


def usage_rows(
    hours: Mapping[int, Mapping[str, float]],
    day_jobs: Mapping[int, Iterable[str]],
    open_runs: Mapping[str, UsageRun],
    *,
    start: int,
    end: int,
    by: Period,
    now: float,
    tenant: str | None = None,
) -> list[UsageFigure]:
    """Per tenant (only `tenant`'s when given) and period in [start, end) — both period starts — its GPU-seconds
    and distinct jobs: the view's closed hours (`hours`: day start → hour field → GPU-seconds; `day_jobs`: day
    start → job members) and the runs still open, counted up to `now`. Sorted by period, then tenant; periods a
    tenant used nothing in are left out."""
    gpu_s: dict[tuple[str, int], float] = {}
    jobs: dict[tuple[str, int], set[str]] = {}

    def add(who: str, t: float, amount: float, job: str) -> None:
        key = (who, period_start(t, by))
        gpu_s[key] = gpu_s.get(key, 0.0) + amount
        jobs.setdefault(key, set()).add(job)

    for day, fields in hours.items():
        if not start <= day < end:
            continue
        for name, amount in fields.items():
            who, _, _ = name.rpartition(SEP)
            if tenant is None or who == tenant:
                key = (who, period_start(day, by))
                gpu_s[key] = gpu_s.get(key, 0.0) + amount
    for day, members in day_jobs.items():
        if not start <= day < end:
            continue
        for member in members:
            who, _, job = member.partition(SEP)
            if tenant is None or who == tenant:
                jobs.setdefault((who, period_start(day, by)), set()).add(job)
    for job, run in open_runs.items():
        if tenant is not None and run.tenant != tenant:
            continue
        for hour, seconds in hour_pieces(max(run.since, start), min(now, end)):
            add(run.tenant, hour, run.gpus * seconds, job)
    return [
        UsageFigure(who, at, gpu_s.get((who, at), 0.0), len(jobs.get((who, at), ())))
        for who, at in sorted(set(gpu_s) | set(jobs), key=lambda k: (k[1], k[0]))
    ]
