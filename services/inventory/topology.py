"""The placement core's Topology and Health from inventory's node records (what the queue and gateway read).

Each `NodeRecord` becomes the agent report it was built from (`shared.core.topology_io.agents`): the
record's domain is the cluster UUID (for a node without a fabric, inventory stored the node's own name,
which yields the same one-node domain), `state` draining/down becomes the node's `NodeState`, and
`gpu_health` ("degraded"/"down" per GPU index) the GPUs' `GpuState`.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.core.topology import GpuState, Health, NodeState, Topology, TopologyError
from shared.core.topology_io.agents import AgentReport, topology_from_agents
from shared.schemas import NodeRecord


def report_from_record(rec: NodeRecord) -> AgentReport:
    """The agent report a node record stands for; TopologyError names the node if a field can't be read."""
    try:
        gpu_health = {int(idx): GpuState(state) for idx, state in rec.gpu_health.items()}
        node_state = NodeState(rec.state)
    except ValueError as e:
        raise TopologyError(f"node {rec.name!r}: unreadable health in its record: {e}") from e
    return AgentReport(
        node=rec.name,
        cluster_uuid=rec.domain,
        clique_id=rec.clique,
        gpus=tuple(range(rec.gpus)),
        leaf=rec.leaf,
        gpu_health=gpu_health,
        node_state=node_state,
    )


def topology_from_records(records: Iterable[NodeRecord], generation: int = 0) -> tuple[Topology, Health]:
    """Topology (levels [leaf,] domain, clique; nodes sorted by domain then name) and health of the records.

    Pass `store.topology_generation()` as `generation` to tell topologies apart. Raises TopologyError for
    no records at all (a topology needs a node) or records the core can't hold.
    """
    return topology_from_agents((report_from_record(r) for r in records), generation=generation)
