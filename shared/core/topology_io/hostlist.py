"""Slurm hostlist expressions: ``node[01-04,07],gpu9`` <-> ``["node01", ..., "node07", "gpu9"]``.

Rules follow Slurm's: commas separate terms at the top level; inside brackets they separate ranges
``lo-hi`` or single numbers; a range is zero-padded to the width of its ``lo`` (``[08-10]`` gives
08, 09, 10); a term may hold several bracket groups, expanded outermost first (``r[1-2]n[1-2]`` gives
r1n1, r1n2, r2n1, r2n2).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product
from math import prod

# Anything that expands past this is a typo (``node[1-100000000]``), not a cluster; stop before the RAM goes.
MAX_HOSTS = 1 << 20

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_BRACKET = re.compile(r"(\[[^\[\]]*\])")
# Host names split at their last run of digits: prefix (never ending in a digit), number, suffix.
_NUMBERED = re.compile(r"(.*?)([0-9]+)([^0-9]*)")
_FORBIDDEN = frozenset("[],")


class HostlistError(ValueError):
    """A hostlist expression or host name that can't be parsed; the message quotes it."""


# -- expand ------------------------------------------------------------------------------------------
def expand(expr: str) -> list[str]:
    """Host names of a hostlist expression, in the order written. A blank expression is empty."""
    if not isinstance(expr, str):
        raise HostlistError(f"a hostlist must be a string, got {type(expr).__name__} {expr!r}")
    names: list[str] = []
    for term in _top_level_terms(expr):
        names.extend(_expand_term(term, expr))
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"hostlist {expr!r} expands to more than {MAX_HOSTS} names")
    return names


def _top_level_terms(expr: str) -> list[str]:
    """Split at commas outside brackets, checking the brackets pair up and don't nest."""
    if not expr.strip():
        return []
    terms: list[str] = []
    start, depth = 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostlistError(f"hostlist {expr!r}: nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(f"hostlist {expr!r}: ']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            terms.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(f"hostlist {expr!r}: '[' is never closed")
    terms.append(expr[start:])
    stripped = [t.strip() for t in terms]
    if not all(stripped):
        raise HostlistError(f"hostlist {expr!r} has an empty name between commas")
    return stripped


def _expand_term(term: str, expr: str) -> list[str]:
    if any(ch.isspace() for ch in term):
        raise HostlistError(f"hostlist {expr!r}: name {term!r} contains whitespace")
    pieces = [p for p in _BRACKET.split(term) if p]
    choices = [_expand_ranges(p[1:-1], expr) if p.startswith("[") else [p] for p in pieces]
    if prod(len(c) for c in choices) > MAX_HOSTS:
        raise HostlistError(f"hostlist {expr!r} expands to more than {MAX_HOSTS} names")
    # product() varies the last group fastest: the first bracket group is the outermost loop
    return ["".join(parts) for parts in product(*choices)]


def _expand_ranges(inner: str, expr: str) -> list[str]:
    if not inner:
        raise HostlistError(f"hostlist {expr!r}: empty brackets")
    out: list[str] = []
    for part in inner.split(","):
        m = _RANGE.fullmatch(part)
        if m is None:
            raise HostlistError(f"hostlist {expr!r}: {part!r} is not a number or a range lo-hi")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise HostlistError(f"hostlist {expr!r}: range {part!r} runs backwards")
        if hi - lo >= MAX_HOSTS:
            raise HostlistError(f"hostlist {expr!r}: range {part!r} is longer than {MAX_HOSTS} names")
        width = len(lo_text)
        out.extend(f"{v:0{width}d}" for v in range(lo, hi + 1))
    return out


# -- compress ----------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Run:
    """Consecutive numbers printed at one width: ``lo`` as written, ``hi`` as a value."""

    lo: str
    hi: int

    def extends_to(self, digits: str) -> bool:
        value = int(digits)
        return value == self.hi + 1 and f"{value:0{len(self.lo)}d}" == digits

    def text(self) -> str:
        if int(self.lo) == self.hi:
            return self.lo
        return f"{self.lo}-{self.hi:0{len(self.lo)}d}"


@dataclass(slots=True)
class _Term:
    prefix: str
    suffix: str | None  # None: a name without digits, written as is
    runs: list[_Run]

    def text(self) -> str:
        if self.suffix is None:
            return self.prefix
        body = ",".join(r.text() for r in self.runs)
        if len(self.runs) == 1 and int(self.runs[0].lo) == self.runs[0].hi:
            return f"{self.prefix}{body}{self.suffix}"
        return f"{self.prefix}[{body}]{self.suffix}"

    def add(self, digits: str) -> None:
        if self.runs and self.runs[-1].extends_to(digits):
            self.runs[-1].hi = int(digits)
        else:
            self.runs.append(_Run(digits, int(digits)))


def compress(names: Iterable[str], *, sort: bool = True) -> str:
    """The shortest usual hostlist for ``names``: ``node01,node02,node04`` -> ``node[01-02,04]``.

    With ``sort`` (the default) names are deduplicated and grouped by prefix/suffix in order of first
    appearance, numbers ascending: ``expand`` gives back the same set. With ``sort=False`` only
    neighbours merge, so ``expand(compress(names, sort=False)) == list(names)`` exactly, order and
    duplicates included (what a file that fixes node order needs).
    """
    split = [_split_name(n) for n in names]
    terms = _sorted_terms(split) if sort else _ordered_terms(split)
    return ",".join(t.text() for t in terms)


def _split_name(name: str) -> tuple[str, str | None, str]:
    """(prefix, suffix or None without digits, digits) of a host name; rejects what a hostlist can't hold."""
    if not isinstance(name, str) or not name:
        raise HostlistError(f"host name {name!r} is empty or not a string")
    if any(ch in _FORBIDDEN or ch.isspace() for ch in name):
        raise HostlistError(f"host name {name!r} contains whitespace or one of '[', ']', ','")
    m = _NUMBERED.fullmatch(name)
    if m is None:
        return name, None, ""
    return m.group(1), m.group(3), m.group(2)


def _sorted_terms(split: list[tuple[str, str | None, str]]) -> list[_Term]:
    groups: dict[tuple[str, str | None], set[str]] = {}
    for prefix, suffix, digits in split:
        groups.setdefault((prefix, suffix), set()).add(digits)
    terms: list[_Term] = []
    for (prefix, suffix), numbers in groups.items():
        term = _Term(prefix, suffix, [])
        if suffix is not None:
            # value first, then width: "9" then "10" merge into [9-10]; "01" and "1" both stay
            for digits in sorted(numbers, key=lambda d: (int(d), len(d))):
                term.add(digits)
        terms.append(term)
    return terms


def _ordered_terms(split: list[tuple[str, str | None, str]]) -> list[_Term]:
    terms: list[_Term] = []
    for prefix, suffix, digits in split:
        last = terms[-1] if terms else None
        if suffix is not None and last is not None and (last.prefix, last.suffix) == (prefix, suffix):
            last.add(digits)
            continue
        term = _Term(prefix, suffix, [])
        if suffix is not None:
            term.add(digits)
        terms.append(term)
    return terms


# -- ordering ----------------------------------------------------------------------------------------
def natural_key(name: str) -> tuple[tuple[str | int, ...], str]:
    """Sort key putting ``node2`` before ``node10``; the raw name breaks ties (``n01`` vs ``n1``)."""
    parts = re.split(r"([0-9]+)", name)
    # re.split alternates text, digits, text...: the same type meets the same type at each position
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name
