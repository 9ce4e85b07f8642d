"""`rackscale cluster`: GET /v1/cluster drawn with `shared.picture.render` (one row per NVLink domain).

The API document is turned back into what the renderer takes — a core `Topology` (levels domain > clique,
nodes in the document's order), a `Health` overlay (node up/draining/down, GPU degraded/down) and a
`ClusterState` holding every allocation — so the terminal picture is the same one the demo draws.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

from shared.api import ClusterView
from shared.core.state import Allocation, ClusterState, indices_mask
from shared.core.topology import GpuState, Health, NodeSpec, NodeState, Topology
from shared.picture import job_letters, render

_NODE_STATES = {s.value: s for s in NodeState}
_GPU_STATES = {s.value: s for s in GpuState}


def decode_cluster(data: bytes | str) -> ClusterView:
    """The /v1/cluster document, typed (fields added later by the gateway are ignored)."""
    return msgspec.json.decode(data, type=ClusterView)


def cluster_state(view: ClusterView) -> tuple[ClusterState, Health] | None:
    """The document as a core ClusterState and Health; None when no node has registered yet."""
    specs: list[NodeSpec] = []
    node_states: dict[str, NodeState] = {}
    gpu_states: dict[tuple[str, int], GpuState] = {}
    owned: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))  # job → node → GPUs
    for domain in view.domains:
        for node in domain.nodes:
            specs.append(NodeSpec(node.name, len(node.gpus) or 1, (domain.name, f"{domain.name}.{node.clique}")))
            state = _NODE_STATES.get(node.state, NodeState.DOWN)
            if state is not NodeState.UP:
                node_states[node.name] = state
            for gpu in node.gpus:
                if gpu.job is not None:
                    # a held GPU is drawn with its job's letter whatever its health: leave it in the free set
                    owned[gpu.job][node.name].append(gpu.index)
                    continue
                health = _GPU_STATES.get(gpu.health, GpuState.DOWN)
                if health is not GpuState.OK:
                    gpu_states[(node.name, gpu.index)] = health
    if not specs:
        return None
    topo = Topology(("domain", "clique"), specs, generation=view.generation)
    health = Health(node_states, gpu_states)
    state = ClusterState(topo, health)
    for job, by_node in sorted(owned.items()):
        nodes = [n for n in by_node if n in topo.node_index]
        state.allocate(
            Allocation(
                job,
                tuple(topo.node_index[n] for n in nodes),
                tuple(indices_mask(by_node[n]) for n in nodes),
            )
        )
    return state, health


def draw_cluster(view: ClusterView) -> str:
    """Header, one row per domain (18x4 cells on NVL72), the legend of job letters, nodes not up."""
    built = cluster_state(view)
    if built is None:
        return "no node has registered yet (agents report within a heartbeat of starting)"
    state, health = built
    letters = job_letters(state)
    u = view.utilisation
    lines = [
        f"{len(view.domains)} NVLink domains, {len(state.topo)} nodes, {u.total} GPUs: "
        f"{u.busy} busy, {u.healthy} healthy, utilisation {u.ratio:.0%} (topology generation {view.generation})",
        "",
        render(state, letters, health),
        "",
        "cells: '.' free  letter: job  'x' down  'd' draining  '~' degraded",
    ]
    if letters:
        gpus = {a.job_id: sum(len(p.gpus) for p in a.nodes) for a in view.allocations}
        lines.append("jobs:")
        lines += [f"  {letter}  {job}  {gpus.get(job, 0)} GPUs" for job, letter in letters.items()]
    troubled = [n for d in view.domains for n in d.nodes if n.state != "up"]
    if troubled:
        lines.append("nodes not up:")
        lines += [f"  {n.name}  {n.state}" + (f"  ({n.reason})" if n.reason else "") for n in troubled]
    return "\n".join(lines)
