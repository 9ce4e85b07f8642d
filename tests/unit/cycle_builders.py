"""Builders for the cycle tests: fleets drawn as ASCII occupancy sketches, and small helpers.

A sketch has one row per NVLink domain and one character per node (spaces are ignored):

    "AAAAAA BBBBBB ......"   d00: job A on nodes 0-5, job B on 6-11, nodes 12-17 free
    "###... ~~~~~~ ......"   d01: nodes 0-2 down, 3-5 free, 6-11 draining, 12-17 free

``.`` free, ``#`` down node, ``~`` draining node, ``!`` free node with GPU 0 down, ``?`` free node with
GPU 0 degraded; any other character is a running job of that id holding the whole node. The jobs'
attributes come from ``runs={"A": Run(end=100.0, priority=5, ...)}``; a job not named there runs with
no expected end at priority 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.core import (
    Allocation,
    ClusterState,
    CycleConfig,
    CycleResult,
    GpuState,
    Health,
    JobSpec,
    NodeState,
    Scheduler,
    Topology,
)

INF = float("inf")
FREE, DOWN, DRAINING, GPU_DOWN, GPU_DEGRADED = ".", "#", "~", "!", "?"
_MARKS = {FREE, DOWN, DRAINING, GPU_DOWN, GPU_DEGRADED}


@dataclass(frozen=True)
class Run:
    """A running job drawn in a sketch."""

    end: float = INF
    priority: int = 0
    tenant: str = "default"
    checkpointable: bool = False
    start: float = 0.0
    elastic: tuple[int, int] | None = None  # (least nodes, unit nodes): an elastic job the cycle may shrink


def fleet(rows: Sequence[str], runs: Mapping[str, Run] | None = None, gpus_per_node: int = 4) -> ClusterState:
    """A ClusterState of ``len(rows)`` domains drawn as a sketch (see the module doc)."""
    runs = runs or {}
    cells = [row.replace(" ", "") for row in rows]
    width = len(cells[0])
    if any(len(c) != width for c in cells):
        raise ValueError(f"every row needs the same number of nodes: {[len(c) for c in cells]}")
    topo = Topology.uniform(len(cells), width, gpus_per_node)
    nodes: dict[str, NodeState] = {}
    gpus: dict[tuple[str, int], GpuState] = {}
    owned: dict[str, list[int]] = {}
    for d, row in enumerate(cells):
        for n, ch in enumerate(row):
            name = f"d{d:02d}-n{n:02d}"
            if ch == DOWN:
                nodes[name] = NodeState.DOWN
            elif ch == DRAINING:
                nodes[name] = NodeState.DRAINING
            elif ch == GPU_DOWN:
                gpus[(name, 0)] = GpuState.DOWN
            elif ch == GPU_DEGRADED:
                gpus[(name, 0)] = GpuState.DEGRADED
            elif ch not in _MARKS:
                owned.setdefault(ch, []).append(topo.node_index[name])
    state = ClusterState(topo, Health(nodes, gpus))
    for job_id, idx in sorted(owned.items()):
        run = runs.get(job_id, Run())
        state.allocate(
            Allocation(
                job_id,
                tuple(idx),
                tuple(state.full[i] for i in idx),
                priority=run.priority,
                tenant=run.tenant,
                checkpointable=run.checkpointable,
                start=run.start,
                expected_end=run.end,
                elastic=run.elastic,
            )
        )
    state.check()
    return state


def nodes(topo: Topology, domain: int, indices: Iterable[int]) -> tuple[int, ...]:
    """Node indices of ``d{domain}-n{i}`` for i in indices."""
    return tuple(topo.node_index[f"d{domain:02d}-n{i:02d}"] for i in indices)


def domains_of(topo: Topology, node_ids: Iterable[int]) -> set[str]:
    dom = topo.domain
    return {topo.group_names[dom][topo.node_group[dom][n]] for n in node_ids}


def cycle(
    state: ClusterState,
    jobs: Sequence[JobSpec],
    now: float = 0.0,
    config: CycleConfig | None = None,
    usage: Mapping[str, float] | None = None,
) -> CycleResult:
    return Scheduler(config or CycleConfig()).cycle(state, jobs, now, usage)


def job(job_id: str, gpus: int, **kw: object) -> JobSpec:
    return JobSpec(job_id, gpus, **kw)  # type: ignore[arg-type]
