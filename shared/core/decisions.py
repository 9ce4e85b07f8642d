"""What a scheduling cycle decides, as plain values. The services turn them into commits and commands;
the simulator applies them to its state."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shared.core.state import mask_indices
from shared.core.topology import Topology


class PendingCode(StrEnum):
    NO_FIT = "no_fit"  # doesn't fit now; no reservation (beyond the reservation depth)
    RESERVED = "reserved"  # doesn't fit now; holds a reservation
    NEVER_FITS = "never_fits"  # wouldn't fit even with every running job ended (health, drains)
    QUOTA = "quota"  # the tenant's GPU quota is used up
    INVALID = "invalid"  # the shape can't be placed on this topology at all
    BLOCKED = "blocked"  # backfill off: waits behind a higher-priority job
    NOT_TESTED = "not_tested"  # beyond this cycle's test limit


@dataclass(frozen=True, slots=True)
class Allocate:
    job_id: str
    nodes: tuple[int, ...]
    masks: tuple[int, ...]
    expected_end: float
    backfilled: bool = False  # started ahead of a higher-priority job that holds a reservation
    segment: int | None = None  # the layout's segment (a flexible job's may be smaller than its first)

    def gpus_by_node(self, topo: Topology) -> dict[str, tuple[int, ...]]:
        return {topo.node_names[n]: mask_indices(m) for n, m in zip(self.nodes, self.masks, strict=True)}

    def groups(self, topo: Topology, level: int | None = None) -> tuple[str, ...]:
        """Names of the groups (default: NVLink domains) the job landed in, in first-use order."""
        li = topo.domain if level is None else level
        seen: dict[str, None] = {}
        for n in self.nodes:
            seen.setdefault(topo.group_names[li][topo.node_group[li][n]])
        return tuple(seen)


@dataclass(frozen=True, slots=True)
class Resize:
    """A running elastic job restarts from a checkpoint on `nodes` (a shrink keeps a prefix of its nodes, whole
    units: its segments stay whole) so that `for_job` fits; it keeps running at the new size."""

    job_id: str
    nodes: tuple[int, ...]
    masks: tuple[int, ...]
    expected_end: float
    for_job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: str  # the victim
    for_job: str  # the higher-priority job it makes room for
    checkpoint: bool  # checkpointable victims are checkpointed and requeued, others requeued from scratch


@dataclass(frozen=True, slots=True)
class Reserve:
    job_id: str
    start: float  # earliest expected start, from the running jobs' expected ends
    nodes: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Pending:
    job_id: str
    code: PendingCode
    reason: str


Decision = Allocate | Preempt | Resize | Reserve | Pending
