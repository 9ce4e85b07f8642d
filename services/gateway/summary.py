"""GET /v1/cluster/summary: one cell's capacity in a few figures (`shared.api.CellSummary`), from what the gateway
already keeps for /v1/cluster (node records per topology generation, allocations from placement's events) and
the size of the active-jobs set. No GPU view is built: a router over several cells asks every cell for it before
it places a job, at most once a second."""

from __future__ import annotations

from collections.abc import Iterable

from shared.api import CellSummary
from shared.schemas import AllocationRecord, NodeRecord


def cell_summary(
    cell: str, nodes: Iterable[NodeRecord], allocations: Iterable[AllocationRecord], generation: int, active: int
) -> CellSummary:
    """`active`: the cell's jobs not ended. Healthy and busy count as `views.ClusterViews` counts them (a GPU is
    healthy when neither it nor its node is down); a free GPU is healthy, held by no job, on a node up."""
    owned: dict[str, set[int]] = {}
    running = 0
    for a in allocations:
        running += 1
        for ng in a.nodes:
            owned.setdefault(ng.node, set()).update(ng.gpus)
    gpus = healthy = busy = free = count = up = 0
    for n in nodes:
        count += 1
        usable = n.state == "up" and not n.drained
        up += usable
        held = owned.get(n.name, set())
        for i in range(n.gpus):
            ok = n.state != "down" and n.gpu_health.get(str(i)) != "down"
            gpus += 1
            healthy += ok
            busy += i in held
            free += ok and usable and i not in held
    return CellSummary(
        cell=cell,
        generation=generation,
        gpus=gpus,
        healthy=healthy,
        busy=busy,
        free=free,
        nodes=count,
        nodes_up=up,
        jobs_pending=max(0, active - running),
        jobs_running=running,
    )
