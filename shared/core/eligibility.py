"""Which waiting jobs a scheduling cycle may consider: dependencies, singletons and array task limits. Pure.

The rules, Slurm's (`--dependency`, `--array=...%N`):

- `afterok:ID` waits until ID succeeded; it can never be met once ID failed or was cancelled.
- `afternotok:ID` waits until ID ended without succeeding; it can never be met once ID succeeded.
- `afterany:ID` waits until ID ended, however.
- An ID that names an array means all of its tasks: met once every task ended (afterok: every one succeeded;
  afternotok: not every one succeeded); afterok can never be met once one task failed or was cancelled,
  afternotok once every task succeeded. Conditions joined by `,` must all hold.
- `singleton`: at most one job of a name and tenant runs at a time, in submit order — the job waits while
  another of its name and tenant runs (or is starting) or waits submitted before it.
- `%N` on an array: at most N of its tasks run at once; the free slots go to its waiting tasks by index.

A job held here never reaches the cycle (`shared/core/cycle.py`): it takes no reservation and holds back no job
behind it, however long it waits. Its reason says what it waits for; a job whose dependency can never be met is
`doomed` (the queue cancels it, with that reason). The caller tells what it knows of the jobs waited for
(`states`): a job's end counts once it is in the log, so nothing can start before the end it waited for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from shared.core.dependencies import Condition

# What is known of a job waited for. "waiting": not ended (pending or running); "unknown": no such job (its
# dependency can never be met). A job missing from `states` isn't known yet: its dependants wait.
Status = Literal["waiting", "succeeded", "failed", "cancelled", "unknown"]
ENDED: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
NAMED_MAX = 3  # jobs a reason names before "and N more"


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pending job with no order out: what the rules need of it."""

    id: str
    tenant: str
    name: str
    order: float  # its submit time (an array's tasks apart by index): singletons and task slots go by it, then id
    conditions: tuple[Condition, ...] = ()
    array_id: str = ""  # a task's array
    limit: int | None = None  # the array's `%N`


@dataclass(frozen=True, slots=True)
class Busy:
    """A job that runs or is about to (holding GPUs, or an order out for it): what singletons and caps count."""

    id: str
    tenant: str
    name: str
    array_id: str = ""


@dataclass(slots=True)
class Sifted:
    eligible: list[str] = field(default_factory=list)  # in the order given
    held: dict[str, str] = field(default_factory=dict)  # job id → what it waits for, in a user's words
    doomed: dict[str, str] = field(default_factory=dict)  # job id → why it can never start


def named_jobs(waiting: Iterable[Waiting]) -> set[str]:
    """The ids the waiting jobs' dependencies name (a job's or an array's): what the caller must look up."""
    return {j for w in waiting for c in w.conditions for j in c.job_ids}


def sift(
    waiting: Sequence[Waiting],
    busy: Iterable[Busy],
    states: Mapping[str, Status],
    arrays: Mapping[str, Sequence[str]] | None = None,
    aside: Sequence[Waiting] = (),
) -> Sifted:
    """Sort the waiting jobs into eligible, held (with the reason) and doomed (with why).

    `busy`: the jobs running or starting; `states`: what is known of each job a dependency names (and of each task
    of an array one names); `arrays`: the task ids of each array a dependency names; `aside`: pending jobs not
    sifted now (an order just taken back, decided next time) that keep their place in a singleton's line and
    their array's slots."""
    arrays = arrays or {}
    busy = list(busy)
    out = Sifted()
    # dependencies first: a job that waits for one takes no singleton turn and no task slot
    free: list[Waiting] = []
    for w in waiting:
        verdicts = [_judge(c, states, arrays) for c in w.conditions if c.kind != "singleton"]
        never = [text for verdict, text in verdicts if verdict == "never"]
        if never:
            out.doomed[w.id] = "dependency can never be met: " + "; ".join(never)
        elif wait := [text for verdict, text in verdicts if verdict == "wait"]:
            out.held[w.id] = "waits for " + "; ".join(wait)
        else:
            free.append(w)
    free = _singletons(free, busy, [*waiting, *aside], out)
    free = _task_slots(free, busy, aside, out)
    chosen = {w.id for w in free}
    out.eligible = [w.id for w in waiting if w.id in chosen]
    return out


def _judge(cond: Condition, states: Mapping[str, Status], arrays: Mapping[str, Sequence[str]]) -> tuple[str, str]:
    """("met" | "wait" | "never", the words for it) for one afterok/afternotok/afterany condition."""
    waits: list[str] = []
    for job in cond.job_ids:
        tasks = arrays.get(job)
        if tasks is not None:
            verdict, text = _judge_array(cond.kind, job, [(t, states.get(t)) for t in tasks])
        else:
            verdict, text = _judge_one(cond.kind, job, states.get(job))
        if verdict == "never":
            return "never", text
        if verdict == "wait":
            waits.append(text)
    if not waits:
        return "met", ""
    more = f", and {len(waits) - NAMED_MAX} more" if len(waits) > NAMED_MAX else ""
    return "wait", f"{cond.kind}: " + ", ".join(waits[:NAMED_MAX]) + more


def _judge_one(kind: str, job: str, status: Status | None) -> tuple[str, str]:
    if status == "unknown":
        return "never", f"{kind}:{job} is no job"
    if status not in ENDED:
        return "wait", f"{job} ({'not known yet' if status is None else 'not ended'})"
    ok = status == "succeeded"
    if kind == "afterany" or (kind == "afterok") == ok:
        return "met", ""
    return "never", f"{kind}:{job} {status}"


def _judge_array(kind: str, array: str, tasks: Sequence[tuple[str, Status | None]]) -> tuple[str, str]:
    ended = [(t, s) for t, s in tasks if s in ENDED]
    bad = next(((t, s) for t, s in ended if s != "succeeded"), None)
    if kind == "afterok" and bad is not None:
        return "never", f"afterok:{array} (its task {bad[0]} {bad[1]})"
    if len(ended) < len(tasks) or not tasks:
        return "wait", f"{array} (array: {len(ended)} of {len(tasks)} tasks ended)"
    if kind == "afternotok" and bad is None:
        return "never", f"afternotok:{array} (every task succeeded)"
    return "met", ""


def _singletons(free: list[Waiting], busy: list[Busy], waiting: Sequence[Waiting], out: Sifted) -> list[Waiting]:
    """A singleton job waits while another job of its name and tenant runs, or waits submitted before it."""
    running: dict[tuple[str, str], list[str]] = defaultdict(list)
    for b in busy:
        running[(b.tenant, b.name)].append(b.id)
    queued: dict[tuple[str, str], list[Waiting]] = defaultdict(list)
    for w in waiting:
        queued[(w.tenant, w.name)].append(w)
    kept: list[Waiting] = []
    for w in free:
        if not any(c.kind == "singleton" for c in w.conditions):
            kept.append(w)
            continue
        key = (w.tenant, w.name)
        ahead = sorted((o.order, o.id) for o in queued[key] if (o.order, o.id) < (w.order, w.id))
        others = [f"{j} (running)" for j in sorted(running[key]) if j != w.id] + [f"{j} (pending)" for _, j in ahead]
        if others:
            more = f", and {len(others) - NAMED_MAX} more" if len(others) > NAMED_MAX else ""
            out.held[w.id] = f"singleton: waits for {', '.join(others[:NAMED_MAX])}{more} of name {w.name}"
        else:
            kept.append(w)
    return kept


def _task_slots(free: list[Waiting], busy: list[Busy], aside: Sequence[Waiting], out: Sifted) -> list[Waiting]:
    """At most `%N` tasks of an array run at once: its free slots go to its waiting tasks in index order (a task
    set aside keeps its turn: its slot stays empty until it is decided)."""
    running: dict[str, int] = defaultdict(int)
    for b in busy:
        if b.array_id:
            running[b.array_id] += 1
    by_array: dict[str, list[Waiting]] = defaultdict(list)
    for w in free:
        if w.array_id and w.limit is not None:
            by_array[w.array_id].append(w)
    for w in aside:
        if w.array_id in by_array:
            by_array[w.array_id].append(w)
    chosen = {w.id for w in free}
    capped: set[str] = set()
    for array, tasks in by_array.items():
        limit = tasks[0].limit
        assert limit is not None
        slots = max(0, limit - running[array])
        tasks.sort(key=lambda w: (w.order, w.id))
        nxt = f", {min(slots, len(tasks))} next" if slots else ""
        for w in tasks[slots:]:
            if w.id in chosen:
                capped.add(w.id)
                out.held[w.id] = f"array {array}: {running[array]} of %{limit} running{nxt}"
    return [w for w in free if w.id not in capped]
