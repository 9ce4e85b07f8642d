"""Values as Slurm writes them: times (`--time`), counts and node ranges (`--nodes`), GPU requests (`--gres`).

Each parser raises ValueError with words a user can act on; the sbatch reader adds the line.
"""

from __future__ import annotations

import re

UNLIMITED = frozenset({"unlimited", "infinite"})

_TIME = re.compile(
    r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"  # D-H, D-H:M, D-H:M:S
    r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$"  # M, M:S, H:M:S
)
TIME_FORMATS = "M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED"


def parse_time(text: str) -> float | None:
    """Slurm's time formats in seconds; None for no limit (UNLIMITED, INFINITE, or 0, as Slurm reads them).

    `30` is 30 minutes, `30:00` 30 minutes, `1:30:00` an hour and a half, `2-0` two days, `1-12:00:00` 36 hours.
    Unlike Slurm (whole minutes) the seconds are kept.
    """
    value = text.strip()
    if value.lower() in UNLIMITED:
        return None
    m = _TIME.match(value)
    if m is None:
        raise ValueError(f"'{text}' is not a time ({TIME_FORMATS})")
    if m["days"] is not None:
        seconds = int(m["days"]) * 86400 + int(m["dh"]) * 3600 + int(m["dm"] or 0) * 60 + int(m["ds"] or 0)
    elif m["c"] is not None:
        seconds = int(m["a"]) * 3600 + int(m["b"]) * 60 + int(m["c"])
    elif m["b"] is not None:
        seconds = int(m["a"]) * 60 + int(m["b"])
    else:
        seconds = int(m["a"]) * 60
    return float(seconds) if seconds else None


def parse_count(text: str, what: str = "a whole number") -> int:
    """A whole number ≥ 1."""
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"'{text}' is not {what} (1 or more)")
    return int(value)


def parse_int(text: str) -> int:
    """A whole number, maybe negative."""
    value = text.strip()
    if not re.fullmatch(r"[-+]?\d+", value):
        raise ValueError(f"'{text}' is not a whole number")
    return int(value)


def parse_node_range(text: str) -> tuple[int, int]:
    """`4` → (4, 4); `2-8` → (2, 8): Slurm's --nodes=MIN-MAX."""
    low, sep, high = text.strip().partition("-")
    if not sep:
        n = parse_count(low, "a node count")
        return n, n
    lo, hi = parse_count(low, "a node count"), parse_count(high, "a node count")
    if hi < lo:
        raise ValueError(f"'{text}' runs backwards (MIN-MAX)")
    return lo, hi


def parse_gpu_count(text: str, option: str) -> int:
    """`4` for --gpus-per-node and --gpus. A GPU type (`h100:4`) is refused: the fleet is one kind of GPU."""
    value = text.strip()
    if ":" in value:
        kind = value.rpartition(":")[0]
        raise ValueError(
            f"{option}={value} names a GPU type ({kind}): Rackscale's GPUs are all of one kind; "
            f"write {option}={value.rpartition(':')[2]}"
        )
    return parse_count(value, "a GPU count")


def parse_gres(text: str) -> int:
    """Slurm's --gres: GPUs on each node from `gpu:N` (or `gpu`: one). Refused: a GPU type (`gpu:h100:4`) and any
    other resource (Rackscale schedules GPUs only)."""
    count: int | None = None
    for item in text.split(","):
        name, _, rest = item.strip().partition(":")
        if name != "gpu":
            raise ValueError(f"'{item}' is not a GPU: Rackscale schedules GPUs only (write gpu:N)")
        if count is not None:
            raise ValueError("names gpu twice")
        if not rest:
            count = 1
        elif ":" in rest:
            kind, _, n = rest.rpartition(":")
            raise ValueError(
                f"gpu:{rest} names a GPU type ({kind}): Rackscale's GPUs are all of one kind; write gpu:{n}"
            )
        else:
            count = parse_count(rest, "a GPU count")
    if count is None:
        raise ValueError("names no GPU (write gpu:N)")
    return count


def parse_segments(text: str) -> int | list[int]:
    """`16` → 16; `16,8` → [16, 8] (Rackscale's flexible segments, preferred first)."""
    sizes = [parse_count(part, "a segment size (nodes)") for part in text.split(",")]
    return sizes[0] if len(sizes) == 1 else sizes
