"""Topology from Kubernetes node labels, and labels from a topology.

GPU Feature Discovery labels a multi-node-NVLink node ``nvidia.com/gpu.clique=<clusterUUID>.<cliqueId>``
and ``nvidia.com/gpu.count=<n>``. The NVLink domain comes from a provider label when the node has one
(``domain_label``), else from the clusterUUID. A GPU node with neither (HGX: no fabric) is its own
one-node domain. Nodes with neither a GPU count nor a clique label are not GPU nodes: skipped, listed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

from shared.core.topology import NodeSpec, Topology, TopologyError

from .hostlist import natural_key

CLIQUE_LABEL = "nvidia.com/gpu.clique"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
LEAF_LABEL = "network.topology.nvidia.com/leaf"
SPINE_LABEL = "network.topology.nvidia.com/spine"
DEFAULT_DOMAIN_LABEL = "ds.coreweave.com/nvlink.domain"

# (level, label) of the optional switch levels, outermost first
_SWITCH_LEVELS = (("spine", SPINE_LABEL), ("leaf", LEAF_LABEL))
# Kubernetes label values: at most 63 characters, alphanumerics with '-', '_', '.' inside.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


class LabelError(TopologyError):
    """Labels that don't describe a topology; the message names the node and the label key."""


@dataclass(frozen=True, slots=True)
class LabelImport:
    topology: Topology
    skipped: list[str]  # nodes without GPU labels, in input order


@dataclass(frozen=True, slots=True)
class _Node:
    """One GPU node's reading of its labels; ``keys`` says which label set each level (for errors)."""

    name: str
    gpus: int
    path: dict[str, str]
    keys: dict[str, str]


def topology_from_labels(
    nodes: Mapping[str, Mapping[str, str]],
    *,
    domain_label: str | None = DEFAULT_DOMAIN_LABEL,
    gpus_per_node: int | None = None,
    generation: int = 0,
) -> LabelImport:
    """Build the topology of the GPU nodes among ``nodes`` (node name -> labels).

    Nodes are sorted by (domain, node name), naturally, so the result doesn't depend on listing order.
    """
    parsed: list[_Node] = []
    skipped: list[str] = []
    for name, labels in nodes.items():
        if GPU_COUNT_LABEL not in labels and CLIQUE_LABEL not in labels:
            skipped.append(name)
            continue
        parsed.append(_read_node(name, labels, domain_label, gpus_per_node))
    if not parsed:
        raise LabelError(f"none of {len(nodes)} nodes has label {GPU_COUNT_LABEL} or {CLIQUE_LABEL}: no GPU nodes")
    parsed.sort(key=lambda n: (natural_key(n.path["domain"]), natural_key(n.name)))
    levels = (*_switch_levels(parsed), "domain", "clique")
    _check_nesting(parsed, levels)
    specs = [NodeSpec(n.name, n.gpus, tuple(n.path[lvl] for lvl in levels)) for n in parsed]
    return LabelImport(Topology(levels, specs, generation=generation), skipped)


def fabric_from_labels(
    name: str, labels: Mapping[str, str], *, domain_label: str | None = DEFAULT_DOMAIN_LABEL
) -> tuple[str, int, str | None]:
    """One node's (NVLink domain, clique id, leaf) from its labels, as an agent reports them.

    The same reading as `topology_from_labels`; the clique id is the number after the last dot of
    ``nvidia.com/gpu.clique`` (0 for a node without the label: its domain is a provider label or itself).
    """
    node = _read_node(name, labels, domain_label, gpus_per_node=1)
    clique = node.path["clique"].rpartition(".")[2]
    if not (clique.isascii() and clique.isdigit()):
        raise LabelError(f"node {name}: label {CLIQUE_LABEL}={node.path['clique']!r}: cliqueId isn't a number")
    return node.path["domain"], int(clique), node.path.get("leaf")


def _read_node(name: str, labels: Mapping[str, str], domain_label: str | None, gpus_per_node: int | None) -> _Node:
    path: dict[str, str] = {}
    keys: dict[str, str] = {}
    uuid = None
    if CLIQUE_LABEL in labels:
        clique = _value(name, labels, CLIQUE_LABEL)
        uuid, dot, clique_id = clique.rpartition(".")
        if not dot or not uuid or not clique_id:
            raise LabelError(f"node {name}: label {CLIQUE_LABEL}={clique!r} is not '<clusterUUID>.<cliqueId>'")
        path["clique"], keys["clique"] = clique, CLIQUE_LABEL
    if domain_label is not None and domain_label in labels:
        path["domain"], keys["domain"] = _value(name, labels, domain_label), domain_label
    elif uuid is not None:
        path["domain"], keys["domain"] = uuid, CLIQUE_LABEL
    else:
        path["domain"], keys["domain"] = name, GPU_COUNT_LABEL  # no fabric: its own domain
    if "clique" not in path:
        path["clique"], keys["clique"] = f"{path['domain']}.0", keys["domain"]
    for level, key in _SWITCH_LEVELS:
        if key in labels:
            path[level], keys[level] = _value(name, labels, key), key
    return _Node(name, _gpu_count(name, labels, gpus_per_node), path, keys)


def _value(name: str, labels: Mapping[str, str], key: str) -> str:
    value = labels[key]
    if not isinstance(value, str) or not value:
        raise LabelError(f"node {name}: label {key}={value!r} is empty or not a string")
    return value


def _gpu_count(name: str, labels: Mapping[str, str], gpus_per_node: int | None) -> int:
    if GPU_COUNT_LABEL not in labels:
        if gpus_per_node is None:
            raise LabelError(f"node {name}: label {GPU_COUNT_LABEL} is missing and no gpus_per_node was given")
        return gpus_per_node
    text = labels[GPU_COUNT_LABEL]
    if not isinstance(text, str) or not (text.isascii() and text.isdigit()):
        raise LabelError(f"node {name}: label {GPU_COUNT_LABEL}={text!r} is not a whole number")
    if int(text) < 1:
        raise LabelError(f"node {name}: label {GPU_COUNT_LABEL}={text!r} must be at least 1")
    return int(text)


def _switch_levels(parsed: list[_Node]) -> tuple[str, ...]:
    """Switch levels some node is labelled with; then every GPU node must be."""
    levels: list[str] = []
    for level, key in _SWITCH_LEVELS:
        having = next((n for n in parsed if level in n.path), None)
        if having is None:
            continue
        lacking = next((n for n in parsed if level not in n.path), None)
        if lacking is not None:
            raise LabelError(
                f"node {lacking.name}: label {key} is missing but node {having.name} has "
                f"{key}={having.path[level]!r}: label every GPU node or none"
            )
        levels.append(level)
    return tuple(levels)


def _check_nesting(parsed: list[_Node], levels: tuple[str, ...]) -> None:
    """Each group sits under one outer group; say which labels disagree (Topology would only say where)."""
    for outer, inner in pairwise(levels):
        home: dict[str, _Node] = {}
        for node in parsed:
            first = home.setdefault(node.path[inner], node)
            if first.path[outer] != node.path[outer]:
                raise LabelError(
                    f"node {node.name}: label {node.keys[inner]} puts {inner} {node.path[inner]!r} under "
                    f"{outer} {node.path[outer]!r} (label {node.keys[outer]}), but node {first.name} has it "
                    f"under {outer} {first.path[outer]!r}"
                )


# -- export ------------------------------------------------------------------------------------------
def labels_from_topology(
    topo: Topology, *, domain_label: str | None = DEFAULT_DOMAIN_LABEL
) -> dict[str, dict[str, str]]:
    """The labels (per node) that ``topology_from_labels`` turns back into ``topo``.

    Without ``domain_label`` the domain travels in the clique label's clusterUUID part, so each clique
    must be named '<domain>.<id>'.
    """
    levels = topo.levels[1:]
    known = tuple(lvl for lvl in ("spine", "leaf", topo.domain_level, "clique") if lvl in levels)
    if known != levels:
        raise LabelError(
            f"levels {list(levels)} can't be written as node labels: only spine ({SPINE_LABEL}), leaf "
            f"({LEAF_LABEL}), {topo.domain_level!r} and clique ({CLIQUE_LABEL}), in that order"
        )
    return {name: _node_labels(topo, i, domain_label) for i, name in enumerate(topo.node_names)}


def _node_labels(topo: Topology, i: int, domain_label: str | None) -> dict[str, str]:
    name = topo.node_names[i]
    path = dict(zip(topo.levels[1:], topo.node_path(i), strict=True))
    domain = path[topo.domain_level]
    clique = path.get("clique", f"{domain}.0")
    uuid, dot, clique_id = clique.rpartition(".")
    if not dot or not uuid or not clique_id:
        raise LabelError(f"node {name}: clique {clique!r} can't be label {CLIQUE_LABEL} ('<clusterUUID>.<id>')")
    if domain_label is None and uuid != domain:
        raise LabelError(
            f"node {name}: without a domain label, label {CLIQUE_LABEL}={clique!r} would put it in domain "
            f"{uuid!r}, not {domain!r}"
        )
    labels = {CLIQUE_LABEL: clique, GPU_COUNT_LABEL: str(topo.node_gpus[i])}
    if domain_label is not None:
        labels[domain_label] = domain
    for level, key in _SWITCH_LEVELS:
        if level in path:
            labels[key] = path[level]
    for key, value in labels.items():
        if not _LABEL_VALUE.fullmatch(value):
            raise LabelError(f"node {name}: label {key}={value!r} is not a valid Kubernetes label value")
    return labels
