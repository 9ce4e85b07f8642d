"""Tiny builders for the core unit tests: fleets, occupancy, host lists and ASCII sketches.

A sketch draws a fleet one NVLink domain per row, one cell per node in index order::

    d00 ##############....      d00: n00-n13 busy, n14-n17 free
    d01 ##.......x........      d01: n00-n01 busy, n09 down

Cells:

    .   free node                          #   busy node (every GPU held)
    x   node down                          d   node draining (no job on it)
    1-9 partly used: that many GPUs free (the lowest-numbered GPUs are the busy ones)
    g   free node whose GPU 0 is degraded  G   busy node whose GPU 0 is degraded
    -   free node whose GPU 0 is down
    |   ignored (a visual separator, e.g. between cliques)

Text after the cells (separated by whitespace) is a comment. `from_sketch` builds the state a sketch
draws (busy cells of a row are one job ``busy-d00``, each partly used node a job ``part-d00-n03``);
`sketch` draws a state back in the same alphabet, for failure messages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from shared.core import (
    Allocation,
    ClusterState,
    Context,
    GpuState,
    Health,
    JobSpec,
    NodeState,
    Placement,
    Topology,
    get_policy,
    request,
)

INF = float("inf")


class Fleet(ClusterState):
    """A ClusterState that remembers its health overlay, so `sketch` can tell down from draining."""

    __slots__ = ("health",)

    def __init__(self, topo: Topology, health: Health | None = None) -> None:
        super().__init__(topo, health)
        self.health = health or Health.all_up()


def fleet(
    domains: int,
    nodes: int = 18,
    gpus: int = 4,
    *,
    leaves: int | None = None,
    cliques: int = 1,
    down: Iterable[str] = (),
    draining: Iterable[str] = (),
    gpu_down: Iterable[tuple[str, int]] = (),
    degraded: Iterable[tuple[str, int]] = (),
) -> Fleet:
    """A free uniform fleet (`Topology.uniform`) under the given health."""
    topo = Topology.uniform(domains, nodes, gpus, cliques_per_domain=cliques, domains_per_leaf=leaves)
    node_health: dict[str, NodeState] = dict.fromkeys(draining, NodeState.DRAINING)
    node_health.update(dict.fromkeys(down, NodeState.DOWN))
    gpu_health: dict[tuple[str, int], GpuState] = dict.fromkeys(degraded, GpuState.DEGRADED)
    gpu_health.update(dict.fromkeys(gpu_down, GpuState.DOWN))
    return Fleet(topo, Health(node_health, gpu_health))


def occupy(
    state: ClusterState,
    job_id: str,
    node_names: Iterable[str],
    gpus: Iterable[int] | None = None,
    **alloc_kw: object,
) -> Allocation:
    """Allocate whole nodes (every healthy GPU) or the given GPU indices on each named node."""
    topo = state.topo
    idx = tuple(topo.node_index[n] for n in node_names)
    if gpus is None:
        masks = tuple(state.full[i] for i in idx)
    else:
        mask = sum(1 << g for g in set(gpus))
        masks = (mask,) * len(idx)
    alloc = Allocation(job_id, idx, masks, **alloc_kw)  # type: ignore[arg-type]
    state.allocate(alloc)
    return alloc


def domain_nodes(state: ClusterState, domain: str) -> list[str]:
    topo = state.topo
    g = topo.group_names[topo.domain].index(domain)
    return [topo.node_names[n] for n in topo.group_nodes[topo.domain][g]]


def busy_domains(state: ClusterState, busy: Mapping[str, int], **alloc_kw: object) -> None:
    """Occupy the first N nodes of each named domain, as one job ``busy-<domain>`` per domain."""
    for dom, n in busy.items():
        if n:
            occupy(state, f"busy-{dom}", domain_nodes(state, dom)[:n], **alloc_kw)


def names(topo: Topology, placement: Placement | None) -> list[str] | None:
    """The placement's node names, in placement order (None stays None)."""
    if placement is None:
        return None
    return [topo.node_names[n] for n in placement.nodes]


_RANGE = re.compile(r"^(?P<prefix>.*-n)(?P<lo>\d+)(?:\.\.(?P<hi>\d+))?$")


def hosts(spec: str) -> list[str]:
    """Expand ``"d00-n14..17 d01-n02"`` into node names (2-digit node numbers, as Topology.uniform)."""
    out: list[str] = []
    for token in spec.replace(",", " ").split():
        m = _RANGE.match(token)
        if not m:
            raise ValueError(f"bad host token {token!r}")
        lo = int(m["lo"])
        hi = int(m["hi"]) if m["hi"] else lo
        width = len(m["lo"])
        out.extend(f"{m['prefix']}{i:0{width}d}" for i in range(lo, hi + 1))
    return out


def _cell(state: ClusterState, node: int) -> str:
    topo = state.topo
    name = topo.node_names[node]
    health = getattr(state, "health", None)
    if not state.usable[node]:
        down = health is not None and health.node(name) is NodeState.DOWN
        return "x" if down else "d"
    everything = (1 << topo.node_gpus[node]) - 1
    full, free, degraded = state.full[node], state.free[node], state.degraded[node]
    if free == full:
        if full != everything:
            return "-"
        return "g" if degraded else "."
    if free == 0:
        return "G" if degraded else "#"
    return str(state.nfree[node])


def sketch(state: ClusterState) -> str:
    """Draw the state one domain per row, in the module's alphabet."""
    topo = state.topo
    dom = topo.domain
    rows = []
    for g, members in enumerate(topo.group_nodes[dom]):
        cells = "".join(_cell(state, n) for n in members)
        rows.append(f"{topo.group_names[dom][g]} {cells}")
    return "\n".join(rows)


def parse_rows(text: str) -> list[tuple[str, str]]:
    rows = []
    for line in text.strip().splitlines():
        tokens = line.split()
        if not tokens:
            continue
        rows.append((tokens[0], tokens[1].replace("|", "")))
    return rows


def from_sketch(
    text: str,
    gpus: int = 4,
    *,
    leaves: int | None = None,
    cliques: int = 1,
    ends: Mapping[str, float] | None = None,
) -> Fleet:
    """Build the fleet a sketch draws; `ends` gives the busy jobs of a domain an expected end."""
    rows = parse_rows(text)
    width = len(rows[0][1])
    for i, (dom, cells) in enumerate(rows):
        if dom != f"d{i:02d}" or len(cells) != width:
            raise ValueError(f"row {i} ({dom!r}): rows must be d00, d01, ... of {width} cells each")
    down, draining, gpu_down, degraded = [], [], [], []
    for dom, cells in rows:
        for n, c in enumerate(cells):
            name = f"{dom}-n{n:02d}"
            if c == "x":
                down.append(name)
            elif c == "d":
                draining.append(name)
            elif c in "gG":
                degraded.append((name, 0))
            elif c == "-":
                gpu_down.append((name, 0))
            elif not (c in ".#" or (c.isdigit() and 0 < int(c) < gpus)):
                raise ValueError(f"{name}: bad cell {c!r}")
    state = fleet(
        len(rows),
        width,
        gpus,
        leaves=leaves,
        cliques=cliques,
        down=down,
        draining=draining,
        gpu_down=gpu_down,
        degraded=degraded,
    )
    ends = ends or {}
    for dom, cells in rows:
        end = ends.get(dom, INF)
        busy = [f"{dom}-n{n:02d}" for n, c in enumerate(cells) if c in "#G"]
        if busy:
            occupy(state, f"busy-{dom}", busy, expected_end=end)
        for n, c in enumerate(cells):
            if c.isdigit():
                name = f"{dom}-n{n:02d}"
                occupy(state, f"part-{name}", [name], gpus=range(gpus - int(c)), expected_end=end)
    return state


def clone(state: ClusterState) -> Fleet:
    """A fresh state with the same topology, health and allocations (built from scratch)."""
    health = getattr(state, "health", None)
    copy = Fleet(state.topo, health)
    for n in range(len(state.topo)):
        copy.set_usable(n, state.usable[n])
    for alloc in state.allocs.values():
        copy.allocate(
            Allocation(
                alloc.job_id,
                alloc.nodes,
                alloc.masks,
                priority=alloc.priority,
                tenant=alloc.tenant,
                checkpointable=alloc.checkpointable,
                start=alloc.start,
                expected_end=alloc.expected_end,
                hold=alloc.hold,
            )
        )
    return copy


def snapshot(state: ClusterState) -> dict[str, object]:
    """Everything a change could touch, in comparable form."""
    return {
        "free": tuple(state.free),
        "nfree": tuple(state.nfree),
        "usable": tuple(state.usable),
        "count": tuple(tuple(tuple(row) for row in level) for level in state.count),
        "allocs": sorted((a.job_id, a.nodes, a.masks, a.expected_end) for a in state.allocs.values()),
        "node_jobs": tuple(tuple(sorted(jobs.items())) for jobs in state.node_jobs),
        "tenant_gpus": sorted(state.tenant_gpus.items()),
        "priorities": sorted(state.priorities.items()),
    }


def job(gpus: int, job_id: str = "j", **kw: object) -> JobSpec:
    return JobSpec(job_id, gpus, **kw)  # type: ignore[arg-type]


def place(policy: str, state: ClusterState, spec: JobSpec, ctx: Context | None = None) -> Placement | None:
    return get_policy(policy).place(state, request(spec, state.topo), ctx or Context())


def layout(topo: Topology, placement: Placement | None) -> dict[str, int] | None:
    """{node name: GPU mask} of a placement."""
    if placement is None:
        return None
    return {topo.node_names[n]: m for n, m in zip(placement.nodes, placement.masks, strict=True)}


def expect_layout(spec: str, full: int) -> dict[str, int]:
    """``"d00-n02=1000 d00-n05"``: node names with a GPU mask (binary, GPU 0 rightmost); bare = `full`."""
    out: dict[str, int] = {}
    for token in spec.split():
        hostpart, _, mask = token.partition("=")
        for name in hosts(hostpart):
            out[name] = int(mask, 2) if mask else full
    return out
