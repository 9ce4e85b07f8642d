"""Argument types shared by the `rackscale` subcommands: a bad value gets argparse's usage error naming it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _number(raw: str, parse: Callable[[str], N], what: str) -> N:
    try:
        return parse(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not {what}") from None


def positive_int(raw: str) -> int:
    value = _number(raw, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def segment_sizes(raw: str) -> int | list[int]:
    """`16` (one segment size) or `16,8` (a flexible job's sizes, preferred first; the gateway checks the order)."""
    sizes = [positive_int(part.strip()) for part in raw.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes


def non_negative_int(raw: str) -> int:
    value = _number(raw, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def port(raw: str) -> int:
    value = _number(raw, int, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0-65535, 0 picks a free one)")
    return value


def seconds(raw: str) -> float:
    value = _number(raw, float, "a number of seconds")
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {raw}")
    return value


def env_pair(raw: str) -> tuple[str, str]:
    """`NAME=VALUE` (the value may hold `=`; the gateway checks the name against the launch contract)."""
    name, sep, value = raw.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{raw!r} is not NAME=VALUE")
    return name, value
