"""Job dependencies, in Slurm's syntax: `afterok:ID[:ID...]`, `afterany:…`, `afternotok:…`, `singleton`,
joined by `,` (all must hold). An ID may name an array: the condition then holds for every one of its tasks.

Slurm's `?` (any one of) and its other kinds (`after`, `aftercorr`, `afterburstbuffer`) are refused by name
rather than read as something else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["afterok", "afterany", "afternotok", "singleton"]
KINDS: tuple[Kind, ...] = ("afterok", "afterany", "afternotok", "singleton")
DEPENDS_MAX = 64  # job ids one job may wait for

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class DependencySyntaxError(ValueError):
    """What is wrong with a `dependency` value, in words a user can act on."""


@dataclass(frozen=True, slots=True)
class Condition:
    kind: Kind
    job_ids: tuple[str, ...] = ()  # empty for singleton


def parse_dependency(text: str) -> tuple[Condition, ...]:
    """`afterok:a:b,singleton` → (Condition(afterok, (a, b)), Condition(singleton)). "" → ()."""
    text = text.strip()
    if not text:
        return ()
    if "?" in text:
        raise DependencySyntaxError("'?' (any one of) is not supported: join conditions with ',' (all of them)")
    out: list[Condition] = []
    count = 0
    for piece in text.split(","):
        kind, *ids = piece.strip().split(":")
        if kind not in KINDS:
            raise DependencySyntaxError(f"'{kind}' is not a dependency kind ({', '.join(KINDS)})")
        if kind == "singleton":
            if ids:
                raise DependencySyntaxError("singleton takes no job ids")
        else:
            if not ids:
                raise DependencySyntaxError(f"{kind} names no job: write {kind}:JOB_ID[:JOB_ID...]")
            for job_id in ids:
                if not _JOB_ID.match(job_id) or len(job_id) > 128:
                    raise DependencySyntaxError(f"'{job_id}' is not a job id")
            count += len(ids)
            if count > DEPENDS_MAX:
                raise DependencySyntaxError(f"waits for more than {DEPENDS_MAX} jobs")
        out.append(Condition(kind=kind, job_ids=tuple(ids)))  # type: ignore[arg-type]
    return tuple(out)


def format_dependency(conditions: tuple[Condition, ...]) -> str:
    return ",".join(c.kind if c.kind == "singleton" else ":".join((c.kind, *c.job_ids)) for c in conditions)
