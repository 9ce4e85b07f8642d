"""Job shapes and their validation against a topology.

A `JobSpec` is what a user asks for; `request()` checks it against the topology and turns it into a
`Request`: node count, GPUs per node, the level indices and the slice layout the policies work on.
Impossible shapes raise `ShapeError` naming the field, so the gateway and the simulator report the
same words.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from shared.core.topology import Topology, TopologyError


class Need(StrEnum):
    REQUIRED = "required"  # every slice inside one group of the level, or wait
    PREFERRED = "preferred"  # one group if possible, else the fewest groups
    NONE = "none"  # anywhere


class ShapeError(ValueError):
    """A job shape that can never be placed on this topology; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Slice:
    """One layer of a multi-layer slice: every `nodes` nodes of the job sit inside one group of `level`."""

    level: str
    nodes: int


@dataclass(frozen=True, slots=True)
class JobSpec:
    id: str
    gpus: int
    gpus_per_node: int | None = None  # None: whole nodes (or all of a small job on one node)
    nvlink: Need = Need.REQUIRED
    level: str = "domain"  # the level `nvlink` applies to
    segment: int | None = None  # Slurm --segment: groups of this many nodes, each inside one domain
    # flexible segments: smaller segment sizes the job also accepts, in preference order (`segment` is the
    # preferred one); the cycle weighs a smaller layout now against the wait for the preferred one
    fallback_segments: tuple[int, ...] = ()
    # elastic: (least, most) GPUs it runs with, in whole units (a segment, or a node); `gpus` is the size it
    # has or asks for now. It must be checkpointable: a resize is a checkpoint and a restart (torchrun
    # --nnodes=MIN:MAX). None: rigid
    elastic: tuple[int, int] | None = None
    slices: tuple[Slice, ...] = ()  # multi-layer, outermost first, e.g. (leaf 48, domain 16)
    exclusive: bool = False  # no other job on the job's nodes
    priority: int = 0
    tenant: str = "default"
    checkpointable: bool = False
    expected_runtime_s: float | None = None
    submit_time: float = 0.0


@dataclass(frozen=True, slots=True)
class Request:
    """A validated job shape in the policies' terms."""

    job: JobSpec
    nodes: int
    per_node: int  # GPUs used per node
    k: int  # free GPUs a node must have to take part
    exclusive: bool
    need: Need
    level: int  # level index the need applies to
    # (level index, nodes per group), outermost first; empty when the job may spill
    slices: tuple[tuple[int, int], ...]
    # a flexible job's other layouts, one rigid request per fallback segment, in preference order
    fallbacks: tuple[Request, ...] = ()
    # an elastic job asking for its most: each smaller size it runs with, largest first
    sizes: tuple[Request, ...] = ()

    @property
    def unit(self) -> int:
        """Nodes an elastic job grows or shrinks by: its innermost slice (a segment), else one node."""
        return self.slices[-1][1] if self.slices and self.job.segment is not None else 1

    @property
    def gpus(self) -> int:
        return self.job.gpus

    @property
    def shape_key(self) -> tuple[object, ...]:
        """Jobs with the same key fit or fail together in a given state."""
        return (self.need, self.level, self.k, self.exclusive, self.nodes, self.per_node, self.slices)


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ShapeError(field, f"must be a whole number of at least 1, got {value!r}")
    return value


def level_label(topo: Topology, level: int) -> str:
    name = topo.levels[level]
    return "NVLink domain" if name == topo.domain_level else name


def request(job: JobSpec, topo: Topology) -> Request:
    """Validate a job against a topology; raise ShapeError naming the field at fault."""
    if not job.id:
        raise ShapeError("id", "must not be empty")
    gpus = _positive_int("gpus", job.gpus)
    node_max = topo.max_node_gpus
    if job.gpus_per_node is None:
        per_node = node_max if gpus >= node_max else gpus
    else:
        per_node = _positive_int("gpus_per_node", job.gpus_per_node)
        if per_node > node_max:
            raise ShapeError("gpus_per_node", f"{per_node} is more than any node has (largest: {node_max} GPUs)")
    if gpus % per_node:
        raise ShapeError("gpus", f"{gpus} is not a multiple of gpus_per_node {per_node}")
    nodes = gpus // per_node
    total_nodes = len(topo)
    if nodes > total_nodes:
        raise ShapeError("gpus", f"{gpus} GPUs need {nodes} nodes; the cluster has {total_nodes}")
    try:
        need = Need(job.nvlink)
    except ValueError:
        raise ShapeError("topology.nvlink", f"must be required, preferred or none, got {job.nvlink!r}") from None
    try:
        level = topo.level(job.level)
    except TopologyError as e:
        raise ShapeError("topology.level", str(e)) from None
    if job.expected_runtime_s is not None and job.expected_runtime_s < 0:
        raise ShapeError("expected_runtime_s", f"must not be negative, got {job.expected_runtime_s}")
    if isinstance(job.priority, bool) or not isinstance(job.priority, int):
        raise ShapeError("priority", f"must be a whole number, got {job.priority!r}")

    layers: list[tuple[int, int]] = []
    if job.segment is not None and job.slices:
        raise ShapeError("segment", "give segment or slices, not both")
    if job.segment is not None:
        seg = _positive_int("segment", job.segment)
        if need is Need.NONE:
            raise ShapeError("segment", "a segmented job needs topology nvlink required or preferred")
        layers.append((level, seg))
    if job.slices and need is Need.NONE:
        raise ShapeError("slices", "a sliced job needs topology nvlink required or preferred")
    for i, sl in enumerate(job.slices):
        try:
            sl_level = topo.level(sl.level)
        except TopologyError as e:
            raise ShapeError(f"slices[{i}].level", str(e)) from None
        layers.append((sl_level, _positive_int(f"slices[{i}].nodes", sl.nodes)))

    where = "segment" if job.segment is not None else "slices"
    outer_level, outer_size = 0, nodes
    for i, (sl_level, size) in enumerate(layers):
        field = where if job.segment is not None else f"slices[{i}].nodes"
        if sl_level <= outer_level and i > 0:
            raise ShapeError(f"slices[{i}].level", "slices must go from outer levels to inner ones")
        if outer_size % size:
            raise ShapeError(field, f"{outer_size} nodes is not a multiple of {where} {size}")
        largest = topo.max_group_nodes(sl_level)
        if size > largest:
            raise ShapeError(
                field,
                f"{size} nodes is larger than any {level_label(topo, sl_level)} (largest: {largest} nodes)",
            )
        outer_level, outer_size = sl_level, size

    if not layers and need is Need.REQUIRED:
        largest = topo.max_group_nodes(level)
        if nodes > largest:
            raise ShapeError(
                "gpus",
                f"{gpus} GPUs ({nodes} nodes) can't fit in one {level_label(topo, level)} "
                f"(largest: {largest} nodes); set a segment",
            )
        layers.append((level, nodes))

    check_segment_order(job)
    fallbacks = [request(with_segment(job, s), topo) for s in job.fallback_segments]
    sizes: list[Request] = []
    if job.elastic is not None:
        least, most = _elastic(job, nodes, per_node, topo)
        if gpus == most:
            unit = job.segment or 1
            sizes = [request(with_size(job, n * per_node), topo) for n in range(nodes - unit, least - 1, -unit)]

    exclusive = bool(job.exclusive)
    k = node_max if exclusive else per_node
    return Request(job, nodes, per_node, k, exclusive, need, level, tuple(layers), tuple(fallbacks), tuple(sizes))


def _elastic(job: JobSpec, nodes: int, per_node: int, topo: Topology) -> tuple[int, int]:
    """An elastic job's (least nodes, most GPUs); raises ShapeError naming what is wrong."""
    check_elastic(job, per_node)
    assert job.elastic is not None
    least_gpus, most = job.elastic
    least = least_gpus // per_node
    if (nodes - least) % (job.segment or 1):
        raise ShapeError("min_gpus", f"gpus {job.gpus} and min_gpus {least_gpus} differ by no whole number of units")
    return least, most


def check_elastic(job: JobSpec, per_node: int | None) -> None:
    """The rules of an elastic range that hold on any topology (`per_node` None: not known yet)."""
    if job.elastic is None:
        return
    least_gpus, most = job.elastic
    _positive_int("min_gpus", least_gpus)
    if not job.checkpointable:
        raise ShapeError("min_gpus", "an elastic job must be checkpointable: a resize is a checkpoint and restart")
    if job.fallback_segments:
        raise ShapeError("min_gpus", "an elastic job lists one segment size")
    if least_gpus > most:
        raise ShapeError("min_gpus", f"{least_gpus} is more than gpus {most}")
    if not least_gpus <= job.gpus <= most:
        raise ShapeError("gpus", f"{job.gpus} is outside the elastic range {least_gpus}-{most}")
    unit = job.segment or 1
    if per_node is not None and least_gpus % (per_node * unit):
        what = f"segments of {unit} nodes" if job.segment else "nodes"
        raise ShapeError("min_gpus", f"{least_gpus} GPUs is not a whole number of {what} ({per_node * unit} GPUs each)")


def check_segment_order(job: JobSpec) -> None:
    """A flexible job lists its segment sizes largest (preferred) first, each once; raises ShapeError."""
    if not job.fallback_segments:
        return
    if job.segment is None:
        raise ShapeError("segment", "list fallback segments only after a preferred segment")
    before = job.segment
    for s in job.fallback_segments:
        if _positive_int("segment", s) >= before:
            raise ShapeError("segment", f"list segment sizes largest (preferred) first, each once: {s} after {before}")
        before = s


def segments(job: JobSpec) -> tuple[int, ...]:
    """Every segment size the job accepts, preferred first (empty: no segments)."""
    return () if job.segment is None else (job.segment, *job.fallback_segments)


def with_size(job: JobSpec, gpus: int) -> JobSpec:
    """An elastic job at another size of its range (still elastic)."""
    return job if gpus == job.gpus else replace(job, gpus=gpus, expected_runtime_s=_scaled(job, gpus))


def _scaled(job: JobSpec, gpus: int) -> float | None:
    """Work spreads over the GPUs it has (data parallel): the estimate scales by size."""
    return None if job.expected_runtime_s is None else job.expected_runtime_s * job.gpus / gpus


def with_segment(job: JobSpec, segment: int | None) -> JobSpec:
    """The job as a rigid one laid out with this segment (one of `segments(job)`)."""
    if segment is None or (segment == job.segment and not job.fallback_segments):
        return job
    return replace(job, segment=segment, fallback_segments=())
