"""Importers and exporters of the topology: Slurm hostlists and topology.yaml, GPU agent reports,
Kubernetes node labels. Pure: stdlib, yaml and the topology model only."""

from __future__ import annotations

from .agents import AgentReport, agent_reports_from_topology, topology_from_agents
from .hostlist import HostlistError, compress, expand, natural_key
from .k8s import (
    CLIQUE_LABEL,
    DEFAULT_DOMAIN_LABEL,
    GPU_COUNT_LABEL,
    LEAF_LABEL,
    SPINE_LABEL,
    LabelError,
    LabelImport,
    fabric_from_labels,
    labels_from_topology,
    topology_from_labels,
)
from .slurm import SlurmTopology, SlurmTopologyError, dump_topology_yaml, load_topology_yaml

__all__ = [
    "CLIQUE_LABEL",
    "DEFAULT_DOMAIN_LABEL",
    "GPU_COUNT_LABEL",
    "LEAF_LABEL",
    "SPINE_LABEL",
    "AgentReport",
    "HostlistError",
    "LabelError",
    "LabelImport",
    "SlurmTopology",
    "SlurmTopologyError",
    "agent_reports_from_topology",
    "compress",
    "dump_topology_yaml",
    "expand",
    "fabric_from_labels",
    "labels_from_topology",
    "load_topology_yaml",
    "natural_key",
    "topology_from_agents",
    "topology_from_labels",
]
