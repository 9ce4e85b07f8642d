"""How a trace job becomes an NVL72 job, and how a trace is scaled, windowed and mixed.

Shape (defaults; every number is a `MappingConfig` field and a CLI flag):

- Nodes of `gpus_per_node` (4 on GB200) GPUs. A job of fewer GPUs than a node takes that many GPUs of
  one node; a larger one takes whole nodes: ``nodes = ceil(gpus / 4)`` (GPUs rounded up to whole nodes,
  e.g. Philly's 12-GPU jobs are 3 nodes; counted in the notes when it rounds). A trace that names
  ``gpus_per_node`` (canonical CSV) keeps it.
- NVLink-sensitive: every job of at least `nvlink_min_gpus` (8) GPUs, i.e. every multi-node job, needs its
  ranks inside one NVLink domain (``nvlink=required``); single-node jobs need nothing of the fabric
  (``none``): their NVLink is inside the node, any placement is local.
- Segment size per job size, after Slurm's guidance for NVL72 (segment 16 for the largest jobs, 4 for
  32-64 GPUs, single-node jobs need no segment): rules ``(min_gpus, segment)`` (default ``32:4, 65:16``),
  the last rule the job reaches wins; jobs below the first rule (8-31 GPUs, 2-7 nodes) go in one domain
  whole. When the segment doesn't divide the node count (e.g. 126 nodes and 16), the job is padded to
  whole segments, as users do (126 -> 128 nodes), and runs that many more data-parallel ranks: the same
  work over more GPUs, so its runtime (and estimate) shrink by nodes / padded nodes (`pad_segments`;
  off: the largest divisor of the node count not above it, 126 -> segments of 14, as the earlier rounds
  had it). Counted in the notes either way. A trace's own segment wins.
- Flexible segments (issue "Past the rigid ceiling", part 5): of the jobs over `large_nodes` (16) nodes
  whose segment came from the rules, a share `flexible_share` (default 0: rigid, as the earlier rounds)
  also accepts the segments `flexible_fallbacks` (default 8) that divide it: ``segment: [16, 8]``, the
  tensor/expert-parallel groups of a real LLM job fitting a smaller island. Which jobs: one uniform draw
  per such job from its own seeded stream (``{seed}:shapes``), flexible when below the share, so the other
  draws (estimates, checkpoints) stay the same whatever the share and a job flexible at 25% is flexible
  at 50% too.
- Elastic gangs (part 4): of the same jobs, those whose draw is at or above ``1 - elastic_share`` (default
  0) and aren't flexible run with any whole number of their segments from half their nodes (at least one
  segment) to all of them, data parallel: the same work spread over the GPUs they have (the simulator's
  rate is nodes / all nodes). They are checkpointable (jobs over 16 nodes always are).
- Runtime estimate the scheduler sees: ``duration x F``, ``F = exp(mu + sigma x N(0,1))`` with median
  ``estimate_median`` (1.5: users overestimate, as Slurm studies find) and ``estimate_sigma`` (0.5), seeded
  per job; ``exact_estimates`` uses the true duration instead.
- Checkpointable: jobs above `always_ckpt_nodes` (16) nodes always (nobody runs hundreds of nodes for days
  without checkpoints); others with probability `ckpt_share` (0.5), seeded; a trace's own flag wins.
  Checkpoint/restore cost ``ckpt_base_s + ckpt_per_gpu_s x gpus`` (30 s + 0.5 s/GPU: 542 s at 1,024
  GPUs), paid on every restart from a checkpoint.

Load: `scale_to_load` multiplies the submit times by one factor so that the trace offers ``load`` times
the fleet's GPU capacity over its submit span: offered = sum over jobs of ``gpus x min(duration, span end -
submit)`` / (span x capacity), i.e. the mean demand during the span if every job started on arrival
(found by bisection; the capacity is the nominal one, failures not deducted).
Mix: `mix` scales each trace's submit times onto the longest span among them (both cover the same
period) and merges them; job ids are already unique per trace (``philly-12``, ``kalos-3``).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from shared.core import JobSpec, Need, ShapeError, Topology, request
from shared.sim.traces import TraceJob


@dataclass(frozen=True, slots=True)
class MappingConfig:
    gpus_per_node: int = 4
    nvlink_min_gpus: int = 8
    segments: tuple[tuple[int, int], ...] = ((32, 4), (65, 16))  # (from this many GPUs, segment nodes)
    large_nodes: int = 16  # "large job": at least this many nodes
    estimate_median: float = 1.5
    estimate_sigma: float = 0.5
    exact_estimates: bool = False
    ckpt_share: float = 0.5
    always_ckpt_nodes: int = 16
    pad_segments: bool = True  # pad a node count the segment doesn't divide to whole segments (see above)
    flexible_share: float = 0.0  # of the jobs over `large_nodes` nodes: accept `flexible_fallbacks` too
    flexible_fallbacks: tuple[int, ...] = (8,)  # smaller segments a flexible job accepts, in preference order
    elastic_share: float = 0.0  # of the jobs over `large_nodes` nodes: run with half to all of their nodes
    ckpt_base_s: float = 30.0
    ckpt_per_gpu_s: float = 0.5


@dataclass(frozen=True, slots=True)
class SimJob:
    """A trace job in the fleet's terms: the spec the scheduler sees plus what only the simulator knows."""

    spec: JobSpec  # expected_runtime_s is the noisy estimate
    duration_s: float  # true runtime, on a local placement
    nodes: int
    unit_nodes: int  # nodes that must share a domain (a segment, or the whole job); 1: no NVLink need
    sensitive: bool  # NVLink-sensitive: a split unit slows it down
    ckpt_cost_s: float
    large: bool
    source: str = ""  # trace name, for mixes

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def submit_s(self) -> float:
        return self.spec.submit_time


@dataclass(slots=True)
class Mapped:
    jobs: list[SimJob]
    skipped: Counter[str]
    notes: Counter[str]


def _largest_divisor_upto(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def segment_for(gpus: int, cfg: MappingConfig) -> int | None:
    """The segment rule a job of this many GPUs reaches (the last one wins), or None."""
    seg: int | None = None
    for min_gpus, s in cfg.segments:
        if gpus >= min_gpus:
            seg = s
    return seg


def map_job(
    tj: TraceJob, cfg: MappingConfig, rng: random.Random, notes: Counter[str], shapes: random.Random | None = None
) -> SimJob:
    """One trace job in the fleet's terms; `shapes` draws which large jobs are flexible (see the module doc)."""
    g = cfg.gpus_per_node
    gpus = tj.gpus
    per_node = tj.gpus_per_node
    if per_node is None:
        per_node = gpus if gpus < g else g
        if gpus > g and gpus % g:
            gpus = math.ceil(gpus / g) * g
            notes[f"GPUs rounded up to whole {g}-GPU nodes"] += 1
    nodes = math.ceil(gpus / per_node)
    if tj.nvlink is not None:
        need = Need(tj.nvlink)
    else:
        need = Need.REQUIRED if gpus >= cfg.nvlink_min_gpus and nodes > 1 else Need.NONE
    segment = tj.segment
    work_share = 1.0  # of the trace's runtime: less when padding spreads the same work over more nodes
    if segment is None and need is not Need.NONE and nodes > 1:
        want = segment_for(gpus, cfg)
        if want is not None and want < nodes:
            if nodes % want and cfg.pad_segments:
                padded = -(-nodes // want) * want
                work_share = nodes / padded
                nodes, gpus, segment = padded, padded * per_node, want
                notes[f"padded to whole segments of {want} nodes"] += 1
            else:
                segment = _largest_divisor_upto(nodes, want)
                if segment != want:
                    notes[f"segment {want} doesn't divide the node count: largest divisor used"] += 1
    fallbacks: tuple[int, ...] = ()
    # one draw per eligible job whatever the share (see the module doc)
    eligible = segment is not None and tj.segment is None and nodes > cfg.large_nodes and shapes is not None
    draw = shapes.random() if eligible and shapes is not None else 1.0
    elastic: tuple[int, int] | None = None
    if draw < cfg.flexible_share and segment is not None:
        fallbacks = tuple(s for s in cfg.flexible_fallbacks if s < segment and nodes % s == 0)
        if fallbacks:
            notes["flexible segments"] += 1
    elif eligible and draw >= 1.0 - cfg.elastic_share and segment is not None and tj.checkpointable is not False:
        least = max(segment, nodes // 2 // segment * segment)
        if least < nodes:
            elastic = (least * per_node, gpus)
            notes["elastic"] += 1
    unit = 1 if need is Need.NONE or nodes == 1 else (segment or nodes)
    # draws in a fixed order per job so a seed gives the same estimates whatever else changes
    noise = math.exp(math.log(cfg.estimate_median) + cfg.estimate_sigma * rng.gauss(0.0, 1.0))
    ckpt_draw = rng.random()
    duration = tj.duration_s * work_share
    estimate = duration if cfg.exact_estimates else duration * noise
    if tj.checkpointable is not None:
        ckpt = tj.checkpointable
    else:
        ckpt = nodes > cfg.always_ckpt_nodes or ckpt_draw < cfg.ckpt_share or elastic is not None
    spec = JobSpec(
        id=tj.job_id,
        gpus=gpus,
        gpus_per_node=tj.gpus_per_node,  # None: the core's default (whole nodes, or one node for a small job)
        nvlink=need,
        segment=segment,
        fallback_segments=fallbacks,
        elastic=elastic,
        priority=tj.priority,
        tenant=tj.tenant,
        checkpointable=ckpt,
        expected_runtime_s=estimate,
        submit_time=tj.submit_s,
    )
    return SimJob(
        spec=spec,
        duration_s=duration,
        nodes=nodes,
        unit_nodes=unit,
        sensitive=need is not Need.NONE and unit > 1,
        ckpt_cost_s=cfg.ckpt_base_s + cfg.ckpt_per_gpu_s * gpus,
        large=nodes >= cfg.large_nodes,
        source=tj.job_id.split("-", 1)[0],
    )


def map_jobs(trace: Sequence[TraceJob], cfg: MappingConfig, topo: Topology, seed: int) -> Mapped:
    """Map every trace job; jobs the fleet can never hold are skipped with the core's reason."""
    rng = random.Random(f"{seed}:mapping")
    shapes = random.Random(f"{seed}:shapes")
    out = Mapped([], Counter(), Counter())
    for tj in trace:
        job = map_job(tj, cfg, rng, out.notes, shapes)
        try:
            request(job.spec, topo)
        except ShapeError as e:
            out.skipped[f"can't be placed on this fleet ({e.field}: {_generic(e.message)})"] += 1
            continue
        out.jobs.append(job)
    return out


def _generic(message: str) -> str:
    """Drop the numbers so one reason counts many jobs."""
    return " ".join("N" if any(c.isdigit() for c in w) else w for w in message.split())


# -- time transforms ----------------------------------------------------------------------------------
def span(jobs: Sequence[TraceJob]) -> float:
    if not jobs:
        return 0.0
    return max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)


def offered_load(jobs: Sequence[TraceJob], capacity_gpus: int, factor: float = 1.0) -> float:
    """Mean GPU demand over the submit span, over capacity, with submits stretched by `factor`.

    Demand counts each job from its submit for its duration, cut at the end of the span: what the trace
    asks of the fleet *during* its span if every job started on arrival. (Counting whole durations
    instead would call a trace whose month-long jobs mostly run after the last arrival "fully loaded".)
    """
    if not jobs:
        return 0.0
    t0 = min(j.submit_s for j in jobs)
    s = span(jobs) * factor
    if s <= 0:
        return math.inf
    demand = 0.0
    for j in jobs:
        demand += j.gpus * min(j.duration_s, s - (j.submit_s - t0) * factor)
    return demand / (s * capacity_gpus)


def scale_to_load(jobs: Sequence[TraceJob], capacity_gpus: int, load: float) -> tuple[list[TraceJob], float]:
    """Stretch submit times by a factor so the trace offers `load` x capacity over its span (see
    `offered_load`); returns (jobs, factor). The offered load falls as the factor grows, so bisect on it.

    Every trace has a ceiling (all jobs submitted at once still only fill part of the span); a load above
    it raises ValueError naming the ceiling.
    """
    if load <= 0:
        raise ValueError(f"load must be positive, got {load}")
    if len(jobs) < 2 or span(jobs) == 0:
        return list(jobs), 1.0
    lo, hi = 1e-9, 1.0
    ceiling = offered_load(jobs, capacity_gpus, lo)
    if load >= ceiling:
        raise ValueError(f"this trace can offer at most {ceiling:.2f}x the fleet's capacity; asked for {load}")
    while offered_load(jobs, capacity_gpus, hi) > load:
        hi *= 2.0
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if offered_load(jobs, capacity_gpus, mid) > load:
            lo = mid
        else:
            hi = mid
    factor = hi
    t0 = min(j.submit_s for j in jobs)
    return [replace(j, submit_s=(j.submit_s - t0) * factor) for j in jobs], factor


def window(jobs: Sequence[TraceJob], start_s: float, end_s: float) -> list[TraceJob]:
    """Jobs submitted in [start_s, end_s), rebased to start at 0."""
    return [replace(j, submit_s=j.submit_s - start_s) for j in jobs if start_s <= j.submit_s < end_s]


def mix(traces: Sequence[Sequence[TraceJob]]) -> list[TraceJob]:
    """Stretch each trace's submits onto the longest span among them, then merge by submit time."""
    target = max((span(t) for t in traces), default=0.0)
    merged: list[TraceJob] = []
    for t in traces:
        s = span(t)
        if not t:
            continue
        t0 = min(j.submit_s for j in t)
        f = target / s if s > 0 else 1.0
        merged += [replace(j, submit_s=(j.submit_s - t0) * f) for j in t]
    merged.sort(key=lambda j: (j.submit_s, j.job_id))
    return merged
