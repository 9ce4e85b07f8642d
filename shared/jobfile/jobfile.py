"""A job file read: the job body (the JSON-able dict POST /v1/jobs takes) and where in the file each field came from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.jobfile.errors import COMMAND_LINE, where

_INDEX = re.compile(r"\[(?:\d+|\.\.\.)\]$")  # a list's item, or (msgspec's word for) a map's value


@dataclass(frozen=True, slots=True)
class JobFile:
    """`body`: the fields the file gives (the rest take the body's defaults); `lines`: a field's dotted path
    (`gpus`, `topology.segment`, `env.OMP_NUM_THREADS`, `command[2]`) → the line that set it (COMMAND_LINE for an
    option given on the command line). The body is not validated here: it is decoded as a JSON submit is."""

    body: dict[str, Any]
    lines: Mapping[str, int] = field(default_factory=dict)

    def line_of(self, path: str | None) -> int | None:
        """The line behind a field path as the gateway names it, or behind its nearest parent; None if none is."""
        while path:
            if path in self.lines:
                return self.lines[path]
            trimmed = _INDEX.sub("", path)
            path = trimmed if trimmed != path else path.rpartition(".")[0]
        return None

    def located(self, message: str, path: str | None) -> str:
        """`message` about the field at `path`, prefixed with its line when the file set it."""
        return where(self.line_of(path)) + message

    def with_overrides(self, overrides: Mapping[str, Any]) -> JobFile:
        """The body with `overrides` (given on the command line) over it: objects (topology, env) merge key by key,
        anything else is replaced."""
        body = _merge(self.body, overrides)
        lines = {p: n for p, n in self.lines.items() if not _overridden(p, overrides)}
        lines.update(dict.fromkeys(_paths(overrides), COMMAND_LINE))
        return JobFile(body=body, lines=lines)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        out[key] = _merge(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


def _paths(doc: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in doc.items():
        path = f"{prefix}{key}"
        out.append(path)
        if isinstance(value, dict):
            out += _paths(value, path + ".")
    return out


def _overridden(path: str, overrides: Mapping[str, Any]) -> bool:
    """Whether an override replaces the field at `path` (or the whole of a non-object above it)."""
    node: Any = overrides
    for part in re.split(r"\.|(?=\[)", path):
        if part.startswith("["):
            return True  # an item of a list an override replaced
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if not isinstance(node, dict):
            return True
    return False
