"""Job arrays: one submission, many tasks that differ only in their index (Slurm's `--array`).

The syntax is Slurm's: comma-separated indices and ranges, a range may have a step, and a `%N` suffix caps how many
tasks run at once — `0-99%8`, `1,3,5-7`, `0-15:4`. A task's id is the array's id, `_` and its index (`abc_7`, as
Slurm's `123_7`); its index reaches the ranks as `RACKSCALE_ARRAY_TASK_ID` (and `SLURM_ARRAY_TASK_ID`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ARRAY_TASKS_MAX = 1000  # tasks one array may hold (Slurm's MaxArraySize is 1001 by default)
ARRAY_INDEX_MAX = 999_999
TASK_SEPARATOR = "_"

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


class ArraySyntaxError(ValueError):
    """What is wrong with an `array` value, in words a user can act on."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, without repeats
    limit: int | None  # at most this many tasks running at once (None: no cap)


def parse_array(text: str) -> ArraySpec:
    """`0-99%8` → indices 0..99, at most 8 at once. Raises ArraySyntaxError naming the bad piece."""
    body, _, cap = text.strip().partition("%")
    limit: int | None = None
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            raise ArraySyntaxError(f"'%{cap}' is not a task limit: write %N with N ≥ 1 (as in 0-99%8)")
        limit = int(cap)
    if not body:
        raise ArraySyntaxError("names no index: write indices and ranges such as 0-99, 1,3,5-7 or 0-15:4")
    seen: set[int] = set()
    for piece in body.split(","):
        m = _RANGE.match(piece.strip())
        if m is None:
            raise ArraySyntaxError(f"'{piece}' is not an index or range (N, N-M or N-M:STEP)")
        first = int(m[1])
        last = int(m[2]) if m[2] is not None else first
        step = int(m[3]) if m[3] is not None else 1
        if last < first:
            raise ArraySyntaxError(f"'{piece}' runs backwards")
        if step < 1:
            raise ArraySyntaxError(f"'{piece}' has a step below 1")
        if last > ARRAY_INDEX_MAX:
            raise ArraySyntaxError(f"'{piece}' goes past the largest index, {ARRAY_INDEX_MAX}")
        if (last - first) // step + 1 + len(seen) > ARRAY_TASKS_MAX:
            raise ArraySyntaxError(f"has more than {ARRAY_TASKS_MAX} tasks")
        seen.update(range(first, last + 1, step))
        if len(seen) > ARRAY_TASKS_MAX:
            raise ArraySyntaxError(f"has more than {ARRAY_TASKS_MAX} tasks")
    return ArraySpec(indices=tuple(sorted(seen)), limit=limit)


TASK_ORDER_S = 1e-6  # an array's tasks count as submitted this far apart, by index: they list and start in order


def task_order(submitted_at: float, index: int) -> float:
    """When a task counts as submitted, for ordering: its array's submit time, the tasks apart by index (ids
    alone would put `abc_10` before `abc_2`)."""
    return submitted_at + index * TASK_ORDER_S


def task_id(array_id: str, index: int) -> str:
    return f"{array_id}{TASK_SEPARATOR}{index}"


def split_task_id(job_id: str) -> tuple[str, int] | None:
    """`abc_7` → (`abc`, 7); None for an id that is not an array task's."""
    array_id, sep, index = job_id.rpartition(TASK_SEPARATOR)
    if not sep or not array_id or not index.isdigit():
        return None
    return array_id, int(index)
