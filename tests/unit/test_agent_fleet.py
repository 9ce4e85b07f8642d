"""A simulated fleet's reports, through inventory's records, rebuild Topology.uniform's fleet."""

from __future__ import annotations

import pytest

from services.agent.fleet import sim_fleet
from services.inventory.service import ReportError, record_from_register
from shared.core.topology import GpuState, NodeState, Topology, TopologyError
from shared.schemas import AgentRegister, GpuReport, NodeRecord
from shared.topology_view import topology_from_records


def test_fleet_names_match_uniform() -> None:
    fleet = sim_fleet(2, nodes_per_domain=3, gpus=4)
    assert [(b.node, b.domain, b.clique_id) for b in fleet] == [
        ("d00-n00", "d00", 0), ("d00-n01", "d00", 0), ("d00-n02", "d00", 0),
        ("d01-n00", "d01", 0), ("d01-n01", "d01", 0), ("d01-n02", "d01", 0),
    ]  # fmt: skip
    assert len({g.uuid for b in fleet for g in b.describe().gpus}) == 24  # per-node seeds
    assert [b.describe() for b in sim_fleet(2, 3)] == [b.describe() for b in sim_fleet(2, 3)]


@pytest.mark.parametrize("cliques", [1, 2])
def test_fleet_through_inventory_records_is_the_uniform_topology(cliques: int) -> None:
    fleet = sim_fleet(3, nodes_per_domain=4, gpus=4, cliques_per_domain=cliques)
    records = [record_from_register(b.describe(), None, now=100.0) for b in reversed(fleet)]  # order-free
    topo, health = topology_from_records(records, generation=7)
    uniform = Topology.uniform(3, 4, 4, cliques_per_domain=cliques)
    assert topo.levels == uniform.levels
    assert topo.specs() == uniform.specs()
    assert topo.generation == 7
    assert (health.nodes, health.gpus) == ({}, {})


def test_record_states_and_gpu_health_become_health() -> None:
    fleet = sim_fleet(1, nodes_per_domain=3)
    fleet[0].set_health(2, "degraded")
    fleet[1].set_health(0, "down")
    records = [record_from_register(b.describe(), None, now=0.0) for b in fleet]
    records[1].state = "down"
    records[2].state, records[2].drained = "draining", True
    _, health = topology_from_records(records)
    assert health.nodes == {"d00-n01": NodeState.DOWN, "d00-n02": NodeState.DRAINING}
    assert health.gpus == {("d00-n00", 2): GpuState.DEGRADED, ("d00-n01", 0): GpuState.DOWN}


def test_node_without_fabric_is_its_own_domain() -> None:
    reg = AgentRegister(node="hgx-7", cluster_uuid="", clique_id=0, gpus=[GpuReport(index=i) for i in range(8)])
    rec = record_from_register(reg, None, now=0.0)
    assert rec.domain == "hgx-7"
    topo, _ = topology_from_records([rec])
    assert topo.group_names[topo.domain] == ("hgx-7",)


def test_drain_survives_registration() -> None:
    reg = sim_fleet(1, 1)[0].describe()
    prev = NodeRecord(name=reg.node, domain="d00", state="down", drained=True, reason="bad fan")
    rec = record_from_register(reg, prev, now=5.0)
    assert (rec.state, rec.drained, rec.reason, rec.last_heartbeat) == ("draining", True, "bad fan", 5.0)


@pytest.mark.parametrize(
    ("reg", "field"),
    [
        (AgentRegister(node="a.b", cluster_uuid="d", clique_id=0, gpus=[GpuReport(index=0)]), "node"),
        (AgentRegister(node="n", cluster_uuid="d", clique_id=0, gpus=[]), "gpus"),
        (AgentRegister(node="n", cluster_uuid="d", clique_id=0, gpus=[GpuReport(index=1)]), "gpus"),
        (AgentRegister(node="n", cluster_uuid="d", clique_id=-1, gpus=[GpuReport(index=0)]), "clique_id"),
    ],
)
def test_impossible_registrations_are_refused(reg: AgentRegister, field: str) -> None:
    with pytest.raises(ReportError, match=f"^{field}:"):
        record_from_register(reg, None, now=0.0)


def test_no_records_is_a_topology_error() -> None:
    with pytest.raises(TopologyError):
        topology_from_records([])


def test_fleet_arguments_are_checked() -> None:
    with pytest.raises(ValueError):
        sim_fleet(0)
    with pytest.raises(ValueError):
        sim_fleet(1, nodes_per_domain=18, cliques_per_domain=4)
