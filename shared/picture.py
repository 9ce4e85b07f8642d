"""Terminal picture of a cluster: one row per NVLink domain, one cell per GPU (node by node).

    d00 │AAAA AAAA BBBB .... xxxx ....│ 12/72 free
Cells: '.' free, a letter per job (same job, same letter), 'x' down GPU or down node, 'd' draining
node's free GPU, '~' degraded free GPU. Pure: takes a ClusterState, returns text.
"""

from __future__ import annotations

import string

from shared.core.state import ClusterState
from shared.core.topology import Health, NodeState

_LABELS = string.ascii_uppercase + string.ascii_lowercase.replace("d", "").replace("x", "") + string.digits


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
            for i in range(topo.node_gpus[n]):
                total += 1
                if i in owner:
                    node_cells.append(owner[i])
                elif not state.full[n] >> i & 1:
                    node_cells.append("x")
                elif not state.usable[n]:
                    node_cells.append("x" if health.node(topo.node_names[n]) is NodeState.DOWN else "d")
                else:
                    free_gpus += 1
                    node_cells.append("~" if state.degraded[n] >> i & 1 else ".")
            cells.append("".join(node_cells))
        name = topo.group_names[dom][g].ljust(width)
        lines.append(f"{name} │{' '.join(cells)}│ {free_gpus}/{total} free")
    return "\n".join(lines)
