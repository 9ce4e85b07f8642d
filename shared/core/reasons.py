"""Pending reasons in a user's words: "needs 16 nodes in one NVLink domain; the largest free run is 12
nodes in domain d07; reserved to start in ~40 min"."""

from __future__ import annotations

from shared.core.shape import Request, level_label
from shared.core.state import ClusterState


def _unit(state: ClusterState, req: Request, count: int) -> str:
    noun = "node" if count == 1 else "nodes"
    if req.k >= state.topo.max_node_gpus:
        return noun
    return f"{noun} with {req.k} free GPU{'s' if req.k > 1 else ''}"


def explain(state: ClusterState, req: Request, honours_required: bool = True) -> str:
    """Why the request doesn't fit this state right now."""
    topo = state.topo
    free = state.count[0][0][req.k]
    if not req.slices or not honours_required:
        return f"needs {req.nodes} {_unit(state, req, req.nodes)}; {free} {'is' if free == 1 else 'are'} free"
    level, size = req.slices[-1]
    label = level_label(topo, level)
    short = "domain" if level == topo.domain else topo.levels[level]
    row = state.count[level]
    best = max(range(len(row)), key=lambda g: (row[g][req.k], -g))
    run = row[best][req.k]
    largest = f"{run} {_unit(state, req, run)} in {short} {topo.group_names[level][best]}"
    unit = _unit(state, req, size)
    pieces = req.nodes // size
    if pieces == 1 and len(req.slices) == 1:
        return f"needs {size} {unit} in one {label}; the largest free run is {largest}"
    hosting = sum(r[req.k] // size for r in row)
    return (
        f"needs {pieces} segments of {size} {unit}, each in one {label}; free runs can host {hosting} "
        f"now (largest: {largest})"
    )


def duration(seconds: float) -> str:
    """Rough human duration: ~40 s, ~12 min, ~2.5 h, ~3 d."""
    s = max(0.0, seconds)
    if s < 90:
        return f"~{round(s)} s"
    if s < 90 * 60:
        return f"~{round(s / 60)} min"
    if s < 48 * 3600:
        return f"~{s / 3600:.1f} h"
    return f"~{s / 86400:.1f} d"
