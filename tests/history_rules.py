"""The history checker's properties for arrays and dependencies (issue 25), on the job log in stream order.

Like `tests/history.py`'s (c), these replay the JobEvents exactly as the EVENTS stream holds them: a job runs
(holds GPUs) from its `placed` event to its next event that is not placed/running/migrating. The log is ordered,
so there is no tolerance:

  (e) an array never has more than its `%N` tasks running at once;
  (f) a dependant never starts before its dependency holds (every job it waits for logged as ended as the
      condition asks), and one cancelled because its dependency can never be met was so by what the log held;
  (g) singletons: no job of a name and tenant starts while another of them runs if either is a singleton, and
      a singleton starts only once every one of its name submitted before it has ended (submit order).

Each function is pure and returns its violations, each naming the jobs and the events' stream sequences.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from shared.core.arrays import split_task_id
from shared.core.dependencies import parse_dependency
from shared.schemas import HOLDING, TERMINAL, JobEvent, JobState
from tests.history import Logged

DOOMED = "dependency can never be met"


def _logged(events: Iterable[Logged | JobEvent]) -> list[Logged]:
    return [e if isinstance(e, Logged) else Logged(i, 0.0, e) for i, e in enumerate(events)]


def most_running(events: Iterable[Logged | JobEvent], group_of: Mapping[str, str]) -> dict[str, tuple[int, int]]:
    """Group → (the most of its jobs running at once, the stream sequence where that was first reached)."""
    running: dict[str, set[str]] = defaultdict(set)
    most: dict[str, tuple[int, int]] = {}
    for le in _logged(events):
        ev = le.event
        group = group_of.get(ev.job_id)
        if group is None:
            continue
        members = running[group]
        if ev.state in HOLDING:
            members.add(ev.job_id)
        else:
            members.discard(ev.job_id)
        if len(members) > most.get(group, (0, 0))[0]:
            most[group] = (len(members), le.seq)
    return most


def array_caps(events: Iterable[Logged | JobEvent], caps: Mapping[str, int]) -> list[str]:
    """(e): arrays (id → `%N`) whose tasks ran more than N at once; the tasks are the ids `<array>_<index>`."""
    logged = _logged(events)
    group_of = {
        ev.job_id: array
        for le in logged
        if (split := split_task_id((ev := le.event).job_id)) is not None and (array := split[0]) in caps
    }
    return [
        f"array {array}: {n} tasks running at once at event #{seq}, more than its %{caps[array]}"
        for array, (n, seq) in most_running(logged, group_of).items()
        if n > caps[array]
    ]


def _ends_before(logged: Sequence[Logged], upto: int) -> dict[str, JobState]:
    """Each job's last logged state before position `upto` of the log."""
    last: dict[str, JobState] = {}
    for le in logged[:upto]:
        last[le.event.job_id] = le.event.state
    return last


def _holds(kind: str, named: str, tasks: Sequence[str] | None, last: Mapping[str, JobState]) -> tuple[bool, bool]:
    """(met, never) of one named job (or array: `tasks`) of a condition, given the states logged so far."""
    members = list(tasks) if tasks is not None else [named]
    states = [last.get(m) for m in members]
    ended = [s for s in states if s in TERMINAL]
    failed = any(s is not JobState.SUCCEEDED for s in ended)
    if kind == "afterok":
        return len(ended) == len(members) and not failed, failed
    if kind == "afterany":
        return len(ended) == len(members), False
    every_ok = len(ended) == len(members) and not failed  # afternotok
    return len(ended) == len(members) and failed, every_ok


def dependencies(
    events: Iterable[Logged | JobEvent],
    depends: Mapping[str, str],
    arrays: Mapping[str, Sequence[str]] | None = None,
    singletons: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """(f) and (g). `depends`: job → its dependency as submitted (an array's tasks each under their own id);
    `arrays`: array id → its task ids (a condition on it is on all of them); `singletons`: (tenant/name) → the
    ids of that name in submit order (every job of the name, with the flag or not)."""
    logged = _logged(events)
    arrays = arrays or {}
    out: list[str] = []
    first_placed: dict[str, int] = {}
    cancelled_doomed: dict[str, int] = {}
    for i, le in enumerate(logged):
        ev = le.event
        if ev.state is JobState.PLACED:
            first_placed.setdefault(ev.job_id, i)
        elif ev.state is JobState.CANCELLED and ev.reason.startswith(DOOMED):
            cancelled_doomed.setdefault(ev.job_id, i)
    for job, text in depends.items():
        conds = [c for c in parse_dependency(text) if c.kind != "singleton"]
        if job in first_placed:
            i = first_placed[job]
            last = _ends_before(logged, i)
            for c in conds:
                for named in c.job_ids:
                    met, _ = _holds(c.kind, named, arrays.get(named), last)
                    if not met:
                        out.append(
                            f"(f) {job} placed at event #{logged[i].seq} before {c.kind}:{named} held "
                            f"(logged so far: {_states(named, arrays.get(named), last)})"
                        )
        if job in cancelled_doomed:
            i = cancelled_doomed[job]
            last = _ends_before(logged, i)
            never = [f"{c.kind}:{n}" for c in conds for n in c.job_ids if _holds(c.kind, n, arrays.get(n), last)[1]]
            if not never:
                out.append(
                    f"(f) {job} cancelled at event #{logged[i].seq} as never to be met ({logged[i].event.reason!r}) "
                    "while the log held nothing that makes it so"
                )
    for group, ids in (singletons or {}).items():
        flagged = {j for j in ids if any(c.kind == "singleton" for c in parse_dependency(depends.get(j, "")))}
        members, running = set(ids), set()
        for le in logged:
            ev = le.event
            if ev.job_id not in members:
                continue
            if ev.state in HOLDING:
                others = running - {ev.job_id}
                if ev.state is JobState.PLACED and others and (ev.job_id in flagged or others & flagged):
                    out.append(f"(g) {ev.job_id} placed at event #{le.seq} while {', '.join(sorted(others))} ran")
                running.add(ev.job_id)
            else:
                running.discard(ev.job_id)
        for k, job in enumerate(ids):
            if job not in flagged or job not in first_placed:
                continue
            last = _ends_before(logged, first_placed[job])
            early = [j for j in ids[:k] if last.get(j) not in TERMINAL]
            if early:
                out.append(
                    f"(g) {job} placed at event #{logged[first_placed[job]].seq} while {', '.join(early)} of {group}, "
                    "submitted before it, had not ended"
                )
    return out


def _states(named: str, tasks: Sequence[str] | None, last: Mapping[str, JobState]) -> str:
    members = list(tasks) if tasks is not None else [named]
    return ", ".join(f"{m} {last[m].value if m in last else 'nothing'}" for m in members[:5]) + (
        f", … ({len(members)} tasks)" if len(members) > 5 else ""
    )
