"""A Jepsen-style history of a test run and the checker that proves it sound (issue 21).

A `History` is what a fault test recorded: every HTTP request the client made (when, what, the answer), the
job event log (JobEvent from the EVENTS stream, in stream order, with the stream's timestamps), the agents'
`RankStarted`/`RankExited` (and the `StartRank` commands, for the GPUs each rank ran on), and the fault
windows the test opened. `check(history)` is pure: it returns every violation, each naming the job, GPU or
attempt and the times involved, prefixed with the property it breaks:

  (a) every job that got a 202 (or a 200 for an idempotent resubmit) is readable to the end (never a 404
      once it was read, a 200 at the final read), is in the event log, ends terminal or is legitimately
      pending or running: `running` only while a rank of its current attempt is alive, `placed`,
      `migrating` or `preempted` only for `TRANSITION_S` before the end of the history;
  (b) no job runs on two allocations at once: no two attempts' ranks alive together (more than the
      tolerance), no rank started twice, no rank alive at the end of a job that ended or went back to pending;
  (c) no GPU in two live allocations: not in the log (replayed in stream order, exactly: a job holds its
      GPUs from its `placed` event to its next event that is not placed/running/migrating), and not on
      the nodes (two jobs' ranks on one GPU at once, more than the tolerance);
  (d) no 5xx (nor a request that got no answer) outside the fault windows, each stretched by its
      `recovery_s`.

Times are wall-clock seconds (`time.time()` in the test, the services and the agents; the NATS server's
timestamps for the log): one machine, one clock. A rank's interval runs from `RankStarted.at` to the exit
its agent saw (`RankStarted.at + RankExited.ran_s`); a rank with no exit report is alive until a fault
that killed ranks on its node (`Fault.kills_ranks`), else to the end of the history.

The tolerance (`History.tolerance_s`, default `OVERLAP_TOLERANCE_S`): a cancel or a preemption frees a
job's GPUs at once while its ranks get SIGTERM (README, "cancel: GPUs free at once"), so the next job's rank
may start on a GPU a moment before the old rank's exit is seen. The agent orders a node's commands (the stop
before the start) and stops a simulated rank at once, so the overlap is milliseconds (0.000 s in the service
kill tests, `summary()`); the tolerance allows half a second for a command's SIGTERM on a loaded machine. The
log check (c) has no tolerance: the log is ordered.

`Recorder` (below the checks) makes the HTTP requests of a test and records them, opens fault windows, and
at the end reads every accepted job once more and the streams, giving the `History`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from nats.aio.client import Client as NatsClient

from shared.core.arrays import parse_array, task_id
from shared.names import Names
from shared.schemas import (
    AGENT_COMMANDS,
    EVENTS,
    HOLDING,
    TERMINAL,
    JobEvent,
    JobState,
    RankExited,
    RankStarted,
    StartRank,
)
from tests import streams

OVERLAP_TOLERANCE_S = 0.5  # stop/start overlap allowed on one GPU, or between two attempts of a job
TRANSITION_S = 10.0  # placed/migrating/preempted at the end: legitimate if its last event is this recent
RECOVERY_S = 5.0  # default: 5xx allowed this long after a fault window closes
ALL_NODES: frozenset[str] = frozenset({"*"})  # Fault.kills_ranks: the ranks of every node died
IN_TRANSIT = frozenset({JobState.PLACED, JobState.MIGRATING, JobState.PREEMPTED})
_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)

# -- what is recorded ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One HTTP request of the client. `status` 0: no answer (connection refused or reset, timeout)."""

    start: float
    end: float
    method: str
    path: str
    status: int
    job_id: str = ""  # a submit's accepted job (202, or 200 for a resubmit); a job read's job
    state: str = ""  # a job read answered 200: the job's state
    # a job read (or a submit whose dependency names a job) answered 503 "not recorded yet" (Retry-After): the
    # queue had submits still to handle; the answer a client is told to retry, not a failure (no fault window
    # needed for it)
    not_yet: bool = False

    @property
    def accepted(self) -> bool:
        return self.method == "POST" and self.path == "/v1/jobs" and self.status in (200, 202) and bool(self.job_id)

    @property
    def is_read(self) -> bool:
        return self.method == "GET" and bool(self.job_id)


@dataclass(frozen=True)
class Logged:
    """A JobEvent as the EVENTS stream holds it: its stream sequence and the server's timestamp."""

    seq: int
    at: float
    event: JobEvent


@dataclass(frozen=True)
class Fault:
    """A fault window: from `start` (the fault began) to `end` (the test restored what it broke).

    `recovery_s`: 5xx are allowed this long after `end` (a restarted process imports and connects first).
    `kills_ranks`: the nodes whose running ranks died at `start` with no exit report (an agent SIGKILLed);
    `ALL_NODES` for every node."""

    kind: str
    start: float
    end: float
    recovery_s: float = RECOVERY_S
    kills_ranks: frozenset[str] = frozenset()

    def kills(self, node: str) -> bool:
        return node in self.kills_ranks or self.kills_ranks == ALL_NODES

    def __str__(self) -> str:
        return f"{self.kind} {_t(self.start)}-{_t(self.end)} (+{self.recovery_s:g}s)"


@dataclass
class History:
    requests: list[Request]
    job_events: list[Logged]
    rank_events: list[RankStarted | RankExited]
    faults: list[Fault]
    end: float  # when the history was taken: ranks with no exit are alive until here
    starts: list[StartRank] = field(default_factory=list)  # the commands sent (for the GPUs of each rank)
    tolerance_s: float = OVERLAP_TOLERANCE_S


def _t(at: float | None) -> str:
    """A timestamp as time of day with milliseconds (UTC), short enough for a violation message."""
    if at is None:
        return "never"
    return time.strftime("%H:%M:%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}"


# -- the checker --------------------------------------------------------------------------------------------


def check(history: History) -> list[str]:
    """Every violation of (a)-(d) in the history; empty when it is sound."""
    ranks = rank_intervals(history)
    return [
        *[f"(a) {v}" for v in accepted_jobs(history, ranks)],
        *[f"(b) {v}" for v in runs_twice(history, ranks)],
        *[f"(c) {v}" for v in log_double_bookings(history.job_events)],
        *[f"(c) {v}" for v in gpu_overlaps(history, ranks)],
        *[f"(d) {v}" for v in errors_outside_faults(history)],
    ]


@dataclass(frozen=True)
class RankRun:
    """One rank's life on a node: `end` None while alive at the end of the history."""

    job_id: str
    attempt: int
    rank: int
    node: str
    start: float
    end: float | None
    how: str  # "exited 0 (reason)", "died with <fault>", "alive"

    def overlap(self, other: RankRun, horizon: float) -> float:
        lo = max(self.start, other.start)
        hi = min(self.end if self.end is not None else horizon, other.end if other.end is not None else horizon)
        return hi - lo

    def __str__(self) -> str:
        where = f"{self.job_id} attempt {self.attempt} rank {self.rank} on {self.node}"
        return f"{where} [{_t(self.start)}, {_t(self.end)}]"


def rank_intervals(history: History) -> tuple[list[RankRun], list[str]]:
    """Each started rank's interval, and the ranks started twice (as violations of (b))."""
    started: dict[tuple[str, int, int], RankStarted] = {}
    twice: list[str] = []
    exits: dict[tuple[str, int, int], RankExited] = {}
    for ev in history.rank_events:
        key = (ev.job_id, ev.attempt, ev.rank)
        if isinstance(ev, RankStarted):
            first = started.setdefault(key, ev)
            if first is not ev and (first.node, first.pid) != (ev.node, ev.pid):
                twice.append(
                    f"{ev.job_id} attempt {ev.attempt} rank {ev.rank} started twice: on {first.node} "
                    f"(pid {first.pid}) at {_t(first.at)} and on {ev.node} (pid {ev.pid}) at {_t(ev.at)}"
                )
        else:
            exits.setdefault(key, ev)
    runs = []
    for key, s in started.items():
        x = exits.get(key)
        if x is not None:
            end = s.at + x.ran_s if x.ran_s > 0 else max(s.at, x.at)
            how = f"exited {x.exit_code}" + (
                f" ({x.reason})" if x.reason and x.reason != f"exited {x.exit_code}" else ""
            )
        else:
            killer = next((f for f in history.faults if f.kills(s.node) and f.start >= s.at), None)
            end = killer.start if killer else None
            how = f"died with {killer.kind}" if killer else "alive"
        runs.append(RankRun(s.job_id, s.attempt, s.rank, s.node, s.at, end, how))
    return runs, twice


def _last_events(events: Sequence[Logged]) -> dict[str, Logged]:
    last: dict[str, Logged] = {}
    for ev in events:
        last[ev.event.job_id] = ev
    return last


def accepted_jobs(history: History, ranks: tuple[list[RankRun], list[str]] | None = None) -> list[str]:
    """(a): every accepted job readable to the end, in the log, terminal or legitimately pending/running."""
    runs, _ = ranks if ranks is not None else rank_intervals(history)
    accepted: dict[str, float] = {}
    reads: dict[str, list[Request]] = defaultdict(list)
    for r in sorted(history.requests, key=lambda r: r.start):
        if r.accepted:
            accepted.setdefault(r.job_id, r.end)
        elif r.is_read:
            reads[r.job_id].append(r)
    last = _last_events(history.job_events)
    alive: dict[tuple[str, int], list[RankRun]] = defaultdict(list)
    for run in runs:
        if run.end is None:
            alive[(run.job_id, run.attempt)].append(run)
    out = []
    for job, at in accepted.items():
        seen = reads.get(job, [])
        ok = next((r for r in seen if r.status == 200), None)
        gone = next((r for r in seen if r.status == 404 and ok is not None and r.start > ok.end), None)
        if gone is not None and ok is not None:
            out.append(f"job {job} (accepted {_t(at)}) read 200 at {_t(ok.start)}, then 404 at {_t(gone.start)}")
        if not seen:
            out.append(f"job {job} (accepted {_t(at)}) was never read back")
        elif seen[-1].status != 200:
            answer = f"HTTP {seen[-1].status}" if seen[-1].status else "no answer"
            out.append(f"job {job} (accepted {_t(at)}) reads {answer} at the end ({_t(seen[-1].start)})")
        logged = last.get(job)
        if logged is None:
            out.append(f"job {job} (accepted {_t(at)}) has no event in the job log")
            continue
        ev = logged.event
        read = seen[-1] if seen and seen[-1].status == 200 else None
        if read is not None and read.state != ev.state.value and _TERMINAL_NAMES & {read.state, ev.state.value}:
            out.append(
                f"job {job} reads {read.state} at {_t(read.start)} but its last logged event is {ev.state.value} "
                f"(attempt {ev.attempt}, {_t(logged.at)})"
            )
        if ev.state is JobState.SUCCEEDED:
            out += _succeeded_ranks(job, ev.attempt, logged.at, history, runs)
        if ev.state is JobState.RUNNING and not alive.get((job, ev.attempt)):
            dead = [r for r in runs if r.job_id == job and r.attempt == ev.attempt]
            fate = "; ".join(f"rank {r.rank} on {r.node} {r.how}" for r in dead) or "no rank of it ever started"
            out.append(
                f"job {job} is running (attempt {ev.attempt}, since {_t(logged.at)}) with no rank of the attempt "
                f"alive at the end ({_t(history.end)}): {fate}"
            )
        elif ev.state in IN_TRANSIT and history.end - logged.at > TRANSITION_S:
            out.append(
                f"job {job} stuck {ev.state.value} (attempt {ev.attempt}) since {_t(logged.at)}, "
                f"{history.end - logged.at:.1f}s before the end"
            )
    return out


def _succeeded_ranks(job: str, attempt: int, at: float, history: History, runs: list[RankRun]) -> list[str]:
    """A job the log says succeeded ran every rank of its last attempt to exit 0 (one rank per node)."""
    nodes = next(
        (
            e.nodes
            for le in reversed(history.job_events)
            if (e := le.event).job_id == job and e.attempt == attempt and e.nodes
        ),
        [],
    )
    exits = {
        ev.rank: ev.exit_code
        for ev in history.rank_events
        if isinstance(ev, RankExited) and ev.job_id == job and ev.attempt == attempt
    }
    started = {r.rank for r in runs if r.job_id == job and r.attempt == attempt}
    out = []
    for rank in range(len(nodes)):
        fate = (
            "never started"
            if rank not in started
            else "never exited"
            if rank not in exits
            else f"exited {exits[rank]}"
            if exits[rank] != 0
            else ""
        )
        if fate:
            out.append(f"job {job} succeeded (attempt {attempt}, {_t(at)}) but its rank {rank} {fate}")
    return out


def runs_twice(history: History, ranks: tuple[list[RankRun], list[str]] | None = None) -> list[str]:
    """(b): per job, no two attempts' ranks alive together; no rank started twice; none alive past its job."""
    runs, twice = ranks if ranks is not None else rank_intervals(history)
    tol, horizon = history.tolerance_s, history.end
    out = list(twice)
    by_job: dict[str, list[RankRun]] = defaultdict(list)
    for run in runs:
        by_job[run.job_id].append(run)
    for job_runs in by_job.values():
        job_runs.sort(key=lambda r: r.start)
        for a, b in itertools.combinations(job_runs, 2):
            if a.attempt != b.attempt and (lap := a.overlap(b, horizon)) > tol:
                out.append(f"{a} and {b} alive together for {lap:.2f}s (tolerance {tol:g}s)")
    last = _last_events(history.job_events)
    for run in runs:
        if run.end is not None:
            continue
        logged = last.get(run.job_id)
        if logged is None:
            continue
        ev = logged.event
        over = ev.state in TERMINAL or ev.state is JobState.PENDING or ev.attempt > run.attempt
        if over and horizon - logged.at > tol:
            out.append(
                f"{run} still alive at the end ({_t(horizon)}) although the job is {ev.state.value} "
                f"(attempt {ev.attempt}) since {_t(logged.at)}"
            )
    return out


def log_double_bookings(events: Iterable[Logged | JobEvent]) -> list[str]:
    """(c) in the log: replay JobEvents in stream order; a job holds its `nodes` GPUs from its `placed` event
    until its next event whose state is not placed/running/migrating. Every moment a (node, GPU) is given to
    a job while another holds it, a holding event that contradicts the job's current holding, and a
    `running` event while the job holds nothing (before any `placed` one, or after one that let go)."""
    logged = [e if isinstance(e, Logged) else Logged(i, 0.0, e) for i, e in enumerate(events)]
    owner: dict[tuple[str, int], tuple[str, int, float]] = {}  # (node, gpu) → (job, attempt, since)
    holds: dict[str, list[Any]] = {}
    problems: list[str] = []
    last: dict[str, tuple[str, int, int]] = {}  # job → its previous event: (state, attempt, seq)
    for i, le in enumerate(logged):
        ev, at = le.event, (f" at {_t(le.at)}" if le.at else "")
        where = f"event #{le.seq}{at}"
        prior_state = last.get(ev.job_id)
        last[ev.job_id] = (ev.state.value, ev.attempt, le.seq)
        if ev.state in HOLDING:
            if ev.job_id in holds:
                if holds[ev.job_id] != ev.nodes:
                    problems.append(
                        f"{where}: {ev.job_id} {ev.state.value} (attempt {ev.attempt}) on {_gpus(ev.nodes)} "
                        f"while holding {_gpus(holds[ev.job_id])}"
                    )
                continue
            if ev.state is JobState.RUNNING:
                later = any(e.event.job_id == ev.job_id and e.event.state is JobState.PLACED for e in logged[i:])
                after = " (its placed event comes later)" if later else " (no placed event after it)"
                problems.append(
                    f"{where}: {ev.job_id} running (attempt {ev.attempt}) "
                    + (
                        f"while holding nothing: its last event was {prior_state[0]} (attempt {prior_state[1]}) "
                        f"at #{prior_state[2]}"
                        if prior_state
                        else "before any placed event"
                    )
                    + after
                )
            holds[ev.job_id] = list(ev.nodes)
            for ng in ev.nodes:
                for g in ng.gpus:
                    other = owner.get((ng.node, g))
                    if other is not None and other[0] != ev.job_id:
                        problems.append(
                            f"{where}: {ng.node} GPU {g} given to {ev.job_id} (attempt {ev.attempt}) while "
                            f"{other[0]} (attempt {other[1]}) holds it since {_t(other[2]) if other[2] else '?'}"
                        )
                    owner[(ng.node, g)] = (ev.job_id, ev.attempt, le.at)
        else:
            for ng in holds.pop(ev.job_id, []):
                for g in ng.gpus:
                    if owner.get((ng.node, g), ("",))[0] == ev.job_id:
                        del owner[(ng.node, g)]
    return problems


def _gpus(nodes: Iterable[Any]) -> str:
    return ", ".join(f"{ng.node}:{ng.gpus}" for ng in nodes) or "nothing"


def rank_gpus(history: History) -> dict[tuple[str, int, str], list[int]]:
    """(job, attempt, node) → the GPUs its rank ran on: from the StartRank commands, else the log's allocation."""
    gpus: dict[tuple[str, int, str], list[int]] = {}
    for le in history.job_events:
        ev = le.event
        for ng in ev.nodes:
            gpus.setdefault((ev.job_id, ev.attempt, ng.node), list(ng.gpus))
    for cmd in history.starts:
        gpus[(cmd.job_id, cmd.attempt, cmd.node)] = list(cmd.gpus)
    return gpus


def gpu_overlaps(history: History, ranks: tuple[list[RankRun], list[str]] | None = None) -> list[str]:
    """(c) on the nodes: two jobs' ranks alive on one GPU at once for longer than the tolerance."""
    runs, _ = ranks if ranks is not None else rank_intervals(history)
    tol, horizon = history.tolerance_s, history.end
    gpus = rank_gpus(history)
    on: dict[tuple[str, int], list[RankRun]] = defaultdict(list)
    for run in runs:
        for g in gpus.get((run.job_id, run.attempt, run.node), []):
            on[(run.node, g)].append(run)
    out = []
    for (node, g), gpu_runs in sorted(on.items()):
        gpu_runs.sort(key=lambda r: r.start)
        for i, a in enumerate(gpu_runs):
            for b in gpu_runs[i + 1 :]:
                if b.start >= (a.end if a.end is not None else horizon):
                    break
                if a.job_id != b.job_id and (lap := a.overlap(b, horizon)) > tol:
                    out.append(f"{node} GPU {g}: {a} and {b} overlap by {lap:.2f}s (tolerance {tol:g}s)")
    return out


def errors_outside_faults(history: History) -> list[str]:
    """(d): every 5xx, or request with no answer, that no fault window (plus its recovery) covers."""
    out = []
    for r in history.requests:
        if (r.status and r.status < 500) or r.not_yet:
            continue
        if any(r.end >= f.start and r.start <= f.end + f.recovery_s for f in history.faults):
            continue
        what = f"HTTP {r.status}" if r.status else "no answer"
        windows = "; ".join(str(f) for f in history.faults) or "no fault window"
        out.append(f"{r.method} {r.path} → {what} at {_t(r.start)}-{_t(r.end)}, outside the fault windows ({windows})")
    return out


def summary(history: History) -> str:
    """One line of what the history holds (for a failing test's message, or a look at a passing one)."""
    runs, _ = rank_intervals(history)
    statuses: dict[int, int] = defaultdict(int)
    for r in history.requests:
        statuses[r.status] += 1
    accepted = {r.job_id for r in history.requests if r.accepted}
    gpus = rank_gpus(history)
    worst = 0.0
    on: dict[tuple[str, int], list[RankRun]] = defaultdict(list)
    for run in runs:
        for g in gpus.get((run.job_id, run.attempt, run.node), []):
            on[(run.node, g)].append(run)
    for gpu_runs in on.values():
        for a, b in itertools.combinations(gpu_runs, 2):
            if a.job_id != b.job_id:
                worst = max(worst, a.overlap(b, history.end))
    return (
        f"{len(history.requests)} requests {dict(sorted(statuses.items()))}, {len(accepted)} jobs accepted, "
        f"{len(history.job_events)} job events, {len(runs)} ranks ({sum(r.end is None for r in runs)} alive), "
        f"largest overlap of two jobs on a GPU {worst:.3f}s; faults: {'; '.join(map(str, history.faults)) or 'none'}"
    )


def reruns(history: History, jobs: Iterable[str]) -> list[str]:
    """Jobs of `jobs` whose ranks ran in more than one attempt (for faults that may not move or requeue them)."""
    attempts: dict[str, set[int]] = defaultdict(set)
    for ev in history.rank_events:
        if isinstance(ev, RankStarted):
            attempts[ev.job_id].add(ev.attempt)
    return [f"{j} ran attempts {sorted(attempts[j])}" for j in jobs if len(attempts.get(j, ())) > 1]


# -- the recorder -------------------------------------------------------------------------------------------


def array_tasks(body: Any, array_id: str) -> list[str]:
    """The task ids an accepted submit of `body` made, when it is an array's (else none)."""
    if not isinstance(body, dict) or not isinstance(body.get("array"), str):
        return []
    return [task_id(array_id, i) for i in parse_array(body["array"]).indices]


NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError)


class Refused(AssertionError):
    """A submit answered 4xx: the client's mistake, or a wrong answer from the system (say, while it rebuilds)."""


class Recorder:
    """The test's HTTP client: every request it makes is recorded; `history()` adds the streams.

    `url`: the gateway's base URL, or a callable giving it (a restarted gateway may come back elsewhere)."""

    def __init__(self, http: aiohttp.ClientSession, url: str | Callable[[], str], *, timeout_s: float = 10.0) -> None:
        self.http = http
        self._url = url
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.requests: list[Request] = []
        self.faults: list[Fault] = []

    @property
    def url(self) -> str:
        return self._url() if callable(self._url) else self._url

    @property
    def accepted(self) -> list[str]:
        """Every job id accepted so far, once each, in order."""
        return list(dict.fromkeys(r.job_id for r in self.requests if r.accepted))

    async def call(
        self, method: str, path: str, *, json: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One request, recorded; (0, None) when no answer came."""
        start = time.time()
        status, data = 0, None
        try:
            async with self.http.request(
                method, self.url + path, json=json, headers=headers, timeout=self.timeout
            ) as r:
                status = r.status
                with contextlib.suppress(ValueError, aiohttp.ContentTypeError):
                    data = await r.json()
        except NO_ANSWER:
            pass
        job_id, state, not_yet = "", "", False
        if isinstance(data, dict):
            # a job (or a job a submit's dependency names) not recorded yet: the queue had submits to handle
            not_yet = status == 503 and "not recorded yet" in str(data.get("error", ""))
            if method == "POST" and path == "/v1/jobs" and status in (200, 202):
                job_id = str(data.get("id", ""))
            elif method == "GET" and path.startswith("/v1/jobs/"):
                job_id = path.removeprefix("/v1/jobs/")
                state = str(data.get("state", "")) if status == 200 else ""
        elif method == "GET" and path.startswith("/v1/jobs/"):
            job_id = path.removeprefix("/v1/jobs/")
        end = time.time()
        tasks = array_tasks(json, job_id) if method == "POST" and job_id else []
        for task in tasks or [job_id]:  # an array's submit: its tasks are the jobs accepted (its id names none)
            self.requests.append(Request(start, end, method, path, status, task, state, not_yet))
        return status, data

    async def submit(self, body: dict[str, Any], *, deadline_s: float = 90.0) -> str:
        """Submit with an Idempotency-Key, retrying 5xx and unanswered tries until accepted, as a client would."""
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        deadline = time.monotonic() + deadline_s
        delay = 0.1
        while True:
            status, data = await self.call("POST", "/v1/jobs", json=body, headers=headers)
            if status in (200, 202):
                return str(data["id"])
            if 400 <= status < 500:
                raise Refused(f"submit {body} → {status} {data}")
            if time.monotonic() > deadline:
                raise AssertionError(f"submit {body} not accepted in {deadline_s:g}s; last answer {status} {data}")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def read(self, job_id: str) -> tuple[int, Any]:
        return await self.call("GET", f"/v1/jobs/{job_id}")

    @contextlib.asynccontextmanager
    async def fault(
        self, kind: str, *, recovery_s: float = RECOVERY_S, kills_ranks: frozenset[str] = frozenset()
    ) -> AsyncIterator[None]:
        """A fault window: open while the body runs (break something, then restore it)."""
        start = time.time()
        try:
            yield
        finally:
            self.faults.append(Fault(kind, start, time.time(), recovery_s, kills_ranks))

    async def history(self, nc: NatsClient, names: Names, *, concurrency: int = 16) -> History:
        """Read every accepted job once more (the final reads), then the job log, agent events and commands."""
        sem = asyncio.Semaphore(concurrency)

        async def final(job_id: str) -> None:
            async with sem:
                await self.read(job_id)

        await asyncio.gather(*(final(j) for j in self.accepted))
        end = time.time()
        job_events = [
            Logged(m.seq, m.at, ev)
            for m in await streams.read_stream(nc, names, names.job_events_all)
            if isinstance(ev := EVENTS.decode(m.data), JobEvent)
        ]
        rank_events = [
            ev
            for m in await streams.read_stream(nc, names, names.agent_events)
            if isinstance(ev := EVENTS.decode(m.data), RankStarted | RankExited)
        ]
        starts = [
            c
            for m in await streams.read_stream(nc, names, names.agent_cmd_all)
            if isinstance(c := AGENT_COMMANDS.decode(m.data), StartRank)
        ]
        return History(list(self.requests), job_events, rank_events, list(self.faults), end, starts)
