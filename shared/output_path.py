"""The body's `output`: a path pattern each rank's output is also appended to, on its node (Slurm's --output).

Pure: the pattern checked (the gateway's 422 and the sbatch reader say what is wrong with it) and expanded for one
process (the agent opens the file). The codes are Slurm's, for the facts Rackscale has:

    %j the job id (an array task's own: `abc_7`)   %x the job's name      %t the process's RANK
    %N the node's name                             %A the array's id      %a the array task's index
    %% a percent sign

A job that is not an array task has `%A` = its id and `%a` = 0. As in Slurm, a number between `%` and the code
zero-pads a numeric value (`%3a` → `007`; at most 10 wide) and is ignored for the others.
"""

from __future__ import annotations

import re

from shared.core.arrays import split_task_id

CODES = {
    "j": "the job id",
    "x": "the job's name",
    "t": "the process's RANK",
    "N": "the node's name",
    "A": "the array's id",
    "a": "the array task's index",
    "%": "a percent sign",
}
NUMERIC = frozenset("ta")
PAD_MAX = 10

_CODE = re.compile(r"%(\d*)(.?)", re.DOTALL)


class OutputPatternError(ValueError):
    """What is wrong with an output pattern, in words a user can act on."""


def check_output_pattern(pattern: str) -> None:
    """Raises OutputPatternError unless `pattern` is an absolute path whose every `%` starts a known code."""
    if not pattern.startswith("/"):
        raise OutputPatternError("an absolute path pattern (or empty: only the job's log)")
    if "\0" in pattern:
        raise OutputPatternError("a path may not hold a NUL character")
    for m in _CODE.finditer(pattern):
        if m[2] not in CODES:
            shown = f"%{m[1]}{m[2]}" if m[2] else "a lone % at the end"
            codes = " ".join(f"%{c}" for c in CODES)
            raise OutputPatternError(f"{shown} is not a code Rackscale expands ({codes}; %% for a percent sign)")


def expand_output(pattern: str, *, job_id: str, name: str, rank: int, node: str) -> str:
    """The file one process appends to. The pattern was checked at submit (an unknown code stays as written)."""
    task = split_task_id(job_id)
    array_id, index = task if task is not None else (job_id, 0)
    values = {"j": job_id, "x": name, "t": rank, "N": node, "A": array_id, "a": index, "%": "%"}

    def one(m: re.Match[str]) -> str:
        width, code = m[1], m[2]
        if code not in values:
            return m[0]
        value = values[code]
        if code in NUMERIC and width:
            return str(value).zfill(min(int(width), PAD_MAX))
        return str(value)

    return _CODE.sub(one, pattern)
