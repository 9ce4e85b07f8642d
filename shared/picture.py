"""Terminal picture of a cluster: one row per NVLink domain, one cell per GPU (node by node).

    d00 │AAAA AAAA BBBB .... xxxx ....│ 12/72 free
Cells: '.' free, a letter per job (same job, same letter), 'x' down GPU or down node, 'd' draining
node's free GPU, '~' degraded free GPU. Pure: takes a ClusterState, returns text.

`gpu_cell` is the cell model itself (which kind a GPU shows, in which precedence); the gateway's cluster view
and the web dashboard use it too, so the terminal and the browser never disagree.
"""

from __future__ import annotations

import string
from enum import StrEnum

from shared.core.state import ClusterState
from shared.core.topology import Health, NodeState

_LABELS = string.ascii_uppercase + string.ascii_lowercase.replace("d", "").replace("x", "") + string.digits


class Cell(StrEnum):
    FREE = "free"
    JOB = "job"
    DOWN = "down"
    DRAINING = "draining"
    DEGRADED = "degraded"


SYMBOLS = {Cell.FREE: ".", Cell.DOWN: "x", Cell.DRAINING: "d", Cell.DEGRADED: "~"}  # Cell.JOB: the job's letter


def gpu_cell(*, owned: bool, gpu_down: bool, node_usable: bool, node_down: bool, degraded: bool) -> Cell:
    """One GPU's cell. A held GPU shows its job whatever its health (the job is what an operator looks for);
    then a down GPU, a node out of service (down, else draining), a degraded GPU, free."""
    if owned:
        return Cell.JOB
    if gpu_down:
        return Cell.DOWN
    if not node_usable:
        return Cell.DOWN if node_down else Cell.DRAINING
    return Cell.DEGRADED if degraded else Cell.FREE


def job_letters(state: ClusterState) -> dict[str, str]:
    """A stable letter per running job (by job id order), cycling when there are more jobs than letters."""
    jobs = sorted(j for j, a in state.allocs.items() if not a.hold)
    return {j: _LABELS[i % len(_LABELS)] for i, j in enumerate(jobs)}


def render(state: ClusterState, letters: dict[str, str] | None = None, health: Health | None = None) -> str:
    topo = state.topo
    health = health or Health.all_up()
    letters = letters if letters is not None else job_letters(state)
    dom = topo.domain
    width = max(len(n) for n in topo.group_names[dom])
    lines = []
    for g, nodes in enumerate(topo.group_nodes[dom]):
        cells = []
        free_gpus = total = 0
        for n in nodes:
            owner = {}
            for job, mask in state.node_jobs[n].items():
                for i in range(topo.node_gpus[n]):
                    if mask >> i & 1:
                        owner[i] = letters.get(job, "?")
            node_cells = []
            node_down = health.node(topo.node_names[n]) is NodeState.DOWN
            for i in range(topo.node_gpus[n]):
                total += 1
                cell = gpu_cell(
                    owned=i in owner,
                    gpu_down=not state.full[n] >> i & 1,
                    node_usable=state.usable[n],
                    node_down=node_down,
                    degraded=bool(state.degraded[n] >> i & 1),
                )
                free_gpus += cell in (Cell.FREE, Cell.DEGRADED)
                node_cells.append(owner[i] if cell is Cell.JOB else SYMBOLS[cell])
            cells.append("".join(node_cells))
        name = topo.group_names[dom][g].ljust(width)
        lines.append(f"{name} │{' '.join(cells)}│ {free_gpus}/{total} free")
    return "\n".join(lines)
