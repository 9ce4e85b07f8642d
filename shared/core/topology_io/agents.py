"""Topology from GPU agent reports: what NVML's ``nvmlDeviceGetGpuFabricInfo`` says, plus the node name.

An NVLink domain is a ``clusterUuid``; a partition inside it is ``<clusterUuid>.<cliqueId>``. A node
without a multi-node NVLink fabric (HGX, or NVML answering NOT_SUPPORTED) reports an empty or all-zero
cluster UUID and becomes its own one-node domain, named after the node. Leaf and spine switch names are
optional, but all-or-none: a level known for half the fleet would make the other half look unconnected.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.core.topology import GpuState, Health, NodeSpec, NodeState, Topology, TopologyError

from .hostlist import natural_key

# What NVML fills in when a GPU has no fabric (or it has not been probed): not a domain.
NO_FABRIC_UUIDS = frozenset({"", "00000000-0000-0000-0000-000000000000"})
# Outer levels an agent may name, outermost first.
OUTER_LEVELS = ("spine", "leaf")
CLIQUE = "clique"


@dataclass(frozen=True, slots=True)
class AgentReport:
    """One node's self-description. ``gpus`` are the GPU indices the node holds, 0..n-1."""

    node: str
    cluster_uuid: str
    clique_id: int
    gpus: tuple[int, ...]
    leaf: str | None = None
    spine: str | None = None
    gpu_health: dict[int, GpuState] = field(default_factory=dict)
    node_state: NodeState = NodeState.UP

    @property
    def domain(self) -> str:
        return self.node if self.cluster_uuid in NO_FABRIC_UUIDS else self.cluster_uuid

    @property
    def clique(self) -> str:
        return f"{self.domain}.{self.clique_id}"


def topology_from_agents(reports: Iterable[AgentReport], generation: int = 0) -> tuple[Topology, Health]:
    """The topology and health the reports describe, nodes sorted by (domain, node name).

    Sorting (naturally: ``n2`` before ``n10``) makes the result independent of arrival order. The same
    node reported twice identically is fine (at-least-once delivery); differently, an error.
    """
    by_node = _dedupe(reports)
    ordered = sorted(by_node.values(), key=lambda r: (natural_key(r.domain), natural_key(r.node)))
    if not ordered:
        raise TopologyError("no agent reports: a topology needs at least one node")
    outer = _outer_levels(ordered)
    specs = [NodeSpec(r.node, len(r.gpus), (*(getattr(r, lvl) for lvl in outer), r.domain, r.clique)) for r in ordered]
    topo = Topology((*outer, "domain", CLIQUE), specs, generation=generation)
    return topo, _health(ordered)


def _dedupe(reports: Iterable[AgentReport]) -> dict[str, AgentReport]:
    by_node: dict[str, AgentReport] = {}
    for report in reports:
        _check(report)
        seen = by_node.setdefault(report.node, report)
        if seen != report:
            raise TopologyError(f"node {report.node!r}: two agent reports disagree: {seen} vs {report}")
    return by_node


def _check(r: AgentReport) -> None:
    """Reject a report the topology can't hold, naming the node."""
    if not isinstance(r.node, str) or not r.node:
        raise TopologyError(f"agent report with node name {r.node!r}: a node needs a name")
    if not isinstance(r.cluster_uuid, str):
        raise TopologyError(f"node {r.node!r}: cluster_uuid must be a string, got {r.cluster_uuid!r}")
    if not isinstance(r.clique_id, int) or isinstance(r.clique_id, bool) or r.clique_id < 0:
        raise TopologyError(f"node {r.node!r}: clique_id must be a whole number >= 0, got {r.clique_id!r}")
    gpus = list(r.gpus)
    if not gpus or sorted(gpus) != list(range(len(gpus))):
        raise TopologyError(
            f"node {r.node!r}: gpu indices {gpus} must be 0..n-1, each once (a missing GPU is reported "
            f"down in gpu_health, not left out)"
        )
    for idx, state in r.gpu_health.items():
        if idx not in r.gpus:
            raise TopologyError(f"node {r.node!r}: gpu_health names gpu {idx}, not one of {gpus}")
        if not isinstance(state, GpuState):
            raise TopologyError(f"node {r.node!r}: gpu {idx} health {state!r} is not a GpuState")
    if not isinstance(r.node_state, NodeState):
        raise TopologyError(f"node {r.node!r}: node_state {r.node_state!r} is not a NodeState")
    for level in OUTER_LEVELS:
        value = getattr(r, level)
        if value is not None and (not isinstance(value, str) or not value):
            raise TopologyError(f"node {r.node!r}: {level} must be a non-empty name or None, got {value!r}")


def _outer_levels(reports: list[AgentReport]) -> tuple[str, ...]:
    """The outer levels some report names; every report must then name them."""
    levels: list[str] = []
    for level in OUTER_LEVELS:
        named = [r for r in reports if getattr(r, level) is not None]
        if not named:
            continue
        missing = next((r for r in reports if getattr(r, level) is None), None)
        if missing is not None:
            raise TopologyError(
                f"node {missing.node!r} reports no {level} but node {named[0].node!r} reports "
                f"{level} {getattr(named[0], level)!r}: every report names the {level}, or none does"
            )
        levels.append(level)
    return tuple(levels)


def _health(reports: list[AgentReport]) -> Health:
    nodes = {r.node: r.node_state for r in reports if r.node_state is not NodeState.UP}
    gpus = {
        (r.node, idx): state for r in reports for idx, state in sorted(r.gpu_health.items()) if state is not GpuState.OK
    }
    return Health(nodes, gpus)


# -- export ------------------------------------------------------------------------------------------
def agent_reports_from_topology(topo: Topology, health: Health | None = None) -> list[AgentReport]:
    """The reports that rebuild ``topo`` (and ``health``), one per node in topology order.

    The clique id is the clique name's suffix after its last '.'; without a clique level the whole
    domain is clique 0. Health entries for nodes not in the topology are ignored.
    """
    health = health or Health.all_up()
    levels = topo.levels[1:]
    _check_exportable(levels, topo.domain_level)
    gpu_health: dict[str, dict[int, GpuState]] = {}
    for (node, idx), state in health.gpus.items():
        gpu_health.setdefault(node, {})[idx] = state
    clique_owner: dict[tuple[str, int], str] = {}
    reports = []
    for i, name in enumerate(topo.node_names):
        path = dict(zip(levels, topo.node_path(i), strict=True))
        domain = path[topo.domain_level]
        clique_name = path.get(CLIQUE, f"{domain}.0")
        clique_id = _clique_id(name, clique_name)
        owner = clique_owner.setdefault((domain, clique_id), clique_name)
        if owner != clique_name:
            raise TopologyError(
                f"node {name!r}: cliques {owner!r} and {clique_name!r} of domain {domain!r} both end in "
                f".{clique_id}; agent reports would merge them"
            )
        reports.append(
            AgentReport(
                node=name,
                cluster_uuid=domain,
                clique_id=clique_id,
                gpus=tuple(range(topo.node_gpus[i])),
                leaf=path.get("leaf"),
                spine=path.get("spine"),
                gpu_health=gpu_health.get(name, {}),
                node_state=health.node(name),
            )
        )
    return reports


def _check_exportable(levels: tuple[str, ...], domain_level: str) -> None:
    expected = tuple(lvl for lvl in (*OUTER_LEVELS, domain_level, CLIQUE) if lvl in levels)
    if expected != levels:
        raise TopologyError(
            f"levels {list(levels)} can't be carried by agent reports: only spine, leaf, "
            f"{domain_level!r} and clique, in that order"
        )


def _clique_id(node: str, clique: str) -> int:
    _, dot, suffix = clique.rpartition(".")
    if not dot or not (suffix.isascii() and suffix.isdigit()):
        raise TopologyError(f"node {node!r}: clique {clique!r} does not end in '.<cliqueId>' with a whole-number id")
    return int(suffix)
