"""Slurm's quality of service (`--qos`) as Rackscale reads it: a name for a priority, defined here once.

Rackscale's priority (-1000..1000, 0 by default) orders the queue and decides preemption (docs/architecture.md); a
QOS name is only a name for one of its values. A deployment that wants other names changes this table: the CLI and
the gateway read scripts with the same one.
"""

from __future__ import annotations

QOS: dict[str, int] = {
    "low": -100,
    "normal": 0,
    "high": 100,
}


def qos_priority(name: str) -> int:
    """The priority a QOS name stands for; ValueError naming the known ones otherwise."""
    try:
        return QOS[name.strip().lower()]
    except KeyError:
        known = ", ".join(f"{k} ({v:+d})" if v else f"{k} (0)" for k, v in QOS.items())
        raise ValueError(f"'{name}' is not a QOS Rackscale knows: {known}") from None
