"""Schemathesis hooks for the conformance fuzz (loaded through SCHEMATHESIS_HOOKS).

Generated jobs run on the simulated agents, and a job's `command` is a real process there: every command
becomes `true` repeated (as many items, so a case stays as valid or invalid as it was), so the fuzz never runs
what it made up. A YAML body is a dict like a JSON one; an sbatch script (`text/x-shellscript`) keeps its leading
comment block (its #SBATCH lines, what is validated) and runs `true` instead of the rest.
"""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    body = case.body
    if isinstance(body, dict) and isinstance(body.get("command"), list):
        command = body["command"]
        if all(isinstance(c, str) for c in command):
            case.body = {**body, "command": ["true"] * len(command)}
    elif isinstance(body, str) and "shellscript" in str(getattr(case, "media_type", "") or ""):
        case.body = inert_script(body)
    return case


def inert_script(text: str) -> str:
    """The script's leading comment block (as sbatch reads it), then `true`."""
    kept: list[str] = []
    for line in text.split("\n"):
        if line.strip() and not line.strip().startswith("#"):
            break
        kept.append(line)
    return "\n".join([*kept, "true", ""])
