"""Slurm ``topology.yaml`` (Slurm 25.05+): read a block or tree topology, write a block one.

- block: each block is an NVLink domain (level ``domain``) holding one clique ``<block>.0``; node order
  is file order. ``block_sizes`` follows Slurm: the first (the planning base) is at most the smallest
  block's node count, each next one is the base times a larger power of two.
- tree: leaf switches (those with ``nodes``) become level ``leaf``; upper switches are checked but not
  modelled (leaf locality is what placement prefers). Each node is its own one-node NVLink domain
  (HGX-like), unless ``domain_size`` cuts each leaf's nodes, in file order, into domains of that many.
- flat: names no nodes, so there is nothing to build; selecting one is an error.

The file is read with ``yaml.compose`` so every error names the line (1-based) and the key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared.core.topology import NodeSpec, Topology, TopologyError

from .hostlist import HostlistError, compress, expand

SOURCE = "topology.yaml"
MAX_SWITCH_NAME = 64  # Slurm's limit on a switch name
Kind = Literal["block", "tree", "flat"]
_KINDS: tuple[Kind, ...] = ("block", "tree", "flat")
_UNSUPPORTED_KINDS = frozenset({"ring", "torus3d"})
_NULL_TAG = "tag:yaml.org,2002:null"


class SlurmTopologyError(TopologyError):
    """A topology.yaml that can't be used; ``line`` (1-based) is where, when a line is to blame."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"{SOURCE} line {line}: {message}" if line is not None else f"{SOURCE}: {message}")


@dataclass(frozen=True, slots=True)
class SlurmTopology:
    name: str
    kind: Kind
    block_sizes: tuple[int, ...]  # empty: not set (Slurm then derives them)
    topology: Topology


@dataclass(frozen=True, slots=True)
class _Group:
    """A block or leaf switch: its name, nodes in file order, and the line it starts on."""

    name: str
    nodes: tuple[str, ...]
    line: int


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    kind: Kind
    default: bool
    groups: tuple[_Group, ...]
    block_sizes: tuple[int, ...]
    line: int


# -- YAML access with line numbers --------------------------------------------------------------------
def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _compose(text: str) -> Node:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SlurmTopologyError(
            f"not valid YAML: {exc.problem or exc.context}", mark.line + 1 if mark else None
        ) from None
    except yaml.reader.ReaderError as exc:
        raise SlurmTopologyError(f"not valid YAML: {exc.reason}", text.count("\n", 0, exc.position) + 1) from None
    except yaml.YAMLError as exc:
        raise SlurmTopologyError(f"not valid YAML: {exc}") from None
    if root is None:
        raise SlurmTopologyError("the file is empty: expected a list of topologies", 1)
    return root


def _mapping(node: Node, what: str, allowed: tuple[str, ...]) -> dict[str, Node]:
    """Keys of a mapping node, rejecting unknown and repeated keys at their line."""
    if not isinstance(node, MappingNode):
        raise SlurmTopologyError(f"{what} must be a mapping of keys", _line(node))
    out: dict[str, Node] = {}
    for key_node, value in node.value:
        key = key_node.value if isinstance(key_node, ScalarNode) else None
        if key in _UNSUPPORTED_KINDS:
            raise SlurmTopologyError(f"{what}: topology type {key!r} is not supported here", _line(key_node))
        if not isinstance(key, str) or key not in allowed:
            raise SlurmTopologyError(f"{what}: unknown key {key!r} (allowed: {', '.join(allowed)})", _line(key_node))
        if key in out:
            raise SlurmTopologyError(f"{what}: key {key!r} appears twice", _line(key_node))
        out[key] = value
    return out


def _require(keys: dict[str, Node], key: str, what: str, node: Node) -> Node:
    if key not in keys:
        raise SlurmTopologyError(f"{what}: key {key!r} is missing", _line(node))
    return keys[key]


def _sequence(node: Node, what: str) -> list[Node]:
    if not isinstance(node, SequenceNode) or not node.value:
        raise SlurmTopologyError(f"{what} must be a non-empty list", _line(node))
    return list(node.value)


def _name(node: Node, what: str) -> str:
    """A name as written (``block: 7`` is the name "7", as Slurm reads it)."""
    if not isinstance(node, ScalarNode) or node.tag == _NULL_TAG or not node.value:
        raise SlurmTopologyError(f"{what} must be a name", _line(node))
    return node.value


def _bool(node: Node, what: str) -> bool:
    value = _scalar(node, "bool")
    if not isinstance(value, bool):
        raise SlurmTopologyError(f"{what} must be true or false", _line(node))
    return value


def _int(node: Node, what: str) -> int:
    value = _scalar(node, "int")
    if not isinstance(value, int) or isinstance(value, bool):
        raise SlurmTopologyError(f"{what} must be a whole number", _line(node))
    return value


def _scalar(node: Node, tag: str) -> object:
    """The value of a scalar of YAML type ``tag`` (as the safe loader reads it), else None."""
    if not isinstance(node, ScalarNode) or node.tag != f"tag:yaml.org,2002:{tag}":
        return None
    return SafeConstructor().construct_object(node)


def _hostlist(node: Node, what: str) -> tuple[str, ...]:
    if not isinstance(node, ScalarNode) or node.tag == _NULL_TAG:
        raise SlurmTopologyError(f"{what} must be a hostlist such as node[01-18]", _line(node))
    try:
        names = expand(node.value)
    except HostlistError as exc:
        raise SlurmTopologyError(f"{what}: {exc}", _line(node)) from None
    if not names:
        raise SlurmTopologyError(f"{what} is empty", _line(node))
    return tuple(names)


# -- reading ------------------------------------------------------------------------------------------
def load_topology_yaml(
    text: str, *, name: str | None = None, gpus_per_node: int = 4, domain_size: int | None = None
) -> SlurmTopology:
    """Read ``text`` and build the topology named ``name``, else the cluster default, else the first.

    Every topology in the file is checked, not just the one chosen: Slurm rejects the whole file too.
    """
    root = _compose(text)
    entries = [_entry(item) for item in _sequence(root, "the file (a list of topologies)")]
    _check_unique([(e.name, e.line) for e in entries], "topology")
    chosen = _choose(entries, name, _line(root))
    if chosen.kind == "flat":
        raise SlurmTopologyError(
            f"topology {chosen.name!r} is flat: it lists no nodes, so it describes no topology", chosen.line
        )
    if chosen.kind == "block":
        topo = _block_topology(chosen.groups, gpus_per_node)
    else:
        topo = _tree_topology(chosen.groups, gpus_per_node, domain_size)
    return SlurmTopology(chosen.name, chosen.kind, chosen.block_sizes, topo)


def _entry(node: Node) -> _Entry:
    keys = _mapping(node, "topology entry", ("topology", "cluster_default", *_KINDS))
    name = _name(_require(keys, "topology", "topology entry", node), "key 'topology'")
    what = f"topology {name!r}"
    default = False
    if "cluster_default" in keys:
        default = _bool(keys["cluster_default"], f"{what}: cluster_default")
    kinds = [k for k in keys if k in _KINDS]
    if not kinds:
        raise SlurmTopologyError(f"{what}: needs one of the keys {', '.join(_KINDS)}", _line(node))
    if len(kinds) > 1:
        raise SlurmTopologyError(f"{what}: has both {kinds[0]!r} and {kinds[1]!r}", _line(keys[kinds[1]]))
    kind = kinds[0]
    body = keys[kind]
    if kind == "flat":
        if not _bool(body, f"{what}: flat"):
            raise SlurmTopologyError(f"{what}: flat: false names no topology type; drop the entry", _line(body))
        return _Entry(name, "flat", default, (), (), _line(node))
    if kind == "block":
        groups, sizes = _blocks(body, what)
        return _Entry(name, "block", default, groups, sizes, _line(node))
    return _Entry(name, "tree", default, _switches(body, what), (), _line(node))


def _choose(entries: list[_Entry], name: str | None, line: int) -> _Entry:
    if name is not None:
        for entry in entries:
            if entry.name == name:
                return entry
        raise SlurmTopologyError(f"no topology named {name!r}; the file has {[e.name for e in entries]}", line)
    return next((e for e in entries if e.default), entries[0])


def _check_unique(named: list[tuple[str, int]], what: str) -> None:
    first: dict[str, int] = {}
    for name, line in named:
        if name in first:
            raise SlurmTopologyError(f"{what} {name!r} is defined twice (first at line {first[name]})", line)
        first[name] = line


def _blocks(node: Node, what: str) -> tuple[tuple[_Group, ...], tuple[int, ...]]:
    keys = _mapping(node, f"{what}: block", ("block_sizes", "blocks"))
    items = _sequence(_require(keys, "blocks", f"{what}: block", node), f"{what}: blocks")
    groups = tuple(_block(item) for item in items)
    _check_unique([(g.name, g.line) for g in groups], "block")
    _check_disjoint(groups, "block")
    sizes: tuple[int, ...] = ()
    if "block_sizes" in keys:
        sizes = _block_sizes(keys["block_sizes"], groups)
    return groups, sizes


def _block(node: Node) -> _Group:
    keys = _mapping(node, "block", ("block", "nodes"))
    name = _name(_require(keys, "block", "block", node), "key 'block'")
    nodes_node = _require(keys, "nodes", f"block {name!r}", node)
    return _Group(name, _hostlist(nodes_node, f"block {name!r}: key 'nodes'"), _line(node))


def _check_disjoint(groups: tuple[_Group, ...], what: str) -> None:
    owner: dict[str, _Group] = {}
    for group in groups:
        for node_name in group.nodes:
            first = owner.setdefault(node_name, group)
            if first is not group:
                raise SlurmTopologyError(
                    f"{what} {group.name!r}: node {node_name!r} is already in {what} {first.name!r} "
                    f"(line {first.line})",
                    group.line,
                )


def _block_sizes(node: Node, groups: tuple[_Group, ...]) -> tuple[int, ...]:
    items = _sequence(node, "block_sizes")
    sizes = [_int(item, f"block_sizes[{i}]") for i, item in enumerate(items)]
    smallest = min(groups, key=lambda g: len(g.nodes))
    problem = block_sizes_problem(sizes, len(smallest.nodes), f"block {smallest.name!r}")
    if problem is not None:
        index, message = problem
        raise SlurmTopologyError(message, _line(items[index]))
    return tuple(sizes)


def block_sizes_problem(sizes: list[int], smallest: int, smallest_name: str) -> tuple[int, str] | None:
    """(index, why) of the first block size Slurm would reject, or None.

    The first size is the planning base: at least 1, at most the smallest block. Each next size is the
    base times a power of two, larger than the one before.
    """
    base = sizes[0]
    if base < 1:
        return 0, f"block_sizes[0]={base} must be at least 1"
    if base > smallest:
        return (
            0,
            f"block_sizes[0]={base} is larger than the smallest block ({smallest_name}, {smallest} nodes)",
        )
    for i in range(1, len(sizes)):
        size, prev = sizes[i], sizes[i - 1]
        ratio, rest = divmod(size, base)
        if size < 1 or rest or ratio & (ratio - 1):
            return i, f"block_sizes[{i}]={size} is not {base} x a power of two"
        if size <= prev:
            return i, f"block_sizes[{i}]={size} is not larger than block_sizes[{i - 1}]={prev}"
    return None


def _switches(node: Node, what: str) -> tuple[_Group, ...]:
    """Leaf switches of a tree, after checking every switch and every ``children`` reference."""
    keys = _mapping(node, f"{what}: tree", ("switches",))
    items = _sequence(_require(keys, "switches", f"{what}: tree", node), f"{what}: switches")
    leaves: list[_Group] = []
    named: list[tuple[str, int]] = []
    children: list[tuple[str, Node]] = []
    for item in items:
        sw_keys = _mapping(item, "switch", ("switch", "children", "nodes"))
        name = _name(_require(sw_keys, "switch", "switch", item), "key 'switch'")
        if len(name) > MAX_SWITCH_NAME:
            raise SlurmTopologyError(f"switch {name!r} is longer than {MAX_SWITCH_NAME} characters", _line(item))
        named.append((name, _line(item)))
        if "children" in sw_keys and "nodes" in sw_keys:
            raise SlurmTopologyError(f"switch {name!r}: has both 'children' and 'nodes'", _line(item))
        if "nodes" in sw_keys:
            leaves.append(_Group(name, _hostlist(sw_keys["nodes"], f"switch {name!r}: key 'nodes'"), _line(item)))
        elif "children" in sw_keys:
            children.append((name, sw_keys["children"]))
        else:
            raise SlurmTopologyError(f"switch {name!r}: key 'nodes' or 'children' is missing", _line(item))
    _check_unique(named, "switch")
    known = {n for n, _ in named}
    for name, child_node in children:
        for child in _hostlist(child_node, f"switch {name!r}: key 'children'"):
            if child not in known:
                raise SlurmTopologyError(f"switch {name!r}: child switch {child!r} is not defined", _line(child_node))
    _check_disjoint(tuple(leaves), "switch")
    return tuple(leaves)


# -- building -----------------------------------------------------------------------------------------
def _block_topology(blocks: tuple[_Group, ...], gpus_per_node: int) -> Topology:
    specs = [NodeSpec(n, gpus_per_node, (b.name, f"{b.name}.0")) for b in blocks for n in b.nodes]
    return Topology(("domain", "clique"), specs)


def _tree_topology(leaves: tuple[_Group, ...], gpus_per_node: int, domain_size: int | None) -> Topology:
    if domain_size is not None and domain_size < 1:
        raise SlurmTopologyError(f"domain_size={domain_size} must be at least 1")
    specs = []
    for leaf in leaves:
        if domain_size is not None and len(leaf.nodes) % domain_size:
            raise SlurmTopologyError(
                f"switch {leaf.name!r}: {len(leaf.nodes)} nodes don't split into domains of {domain_size}",
                leaf.line,
            )
        for i, node_name in enumerate(leaf.nodes):
            domain = node_name if domain_size is None else f"{leaf.name}.{i // domain_size}"
            specs.append(NodeSpec(node_name, gpus_per_node, (leaf.name, domain, f"{domain}.0")))
    return Topology(("leaf", "domain", "clique"), specs)


# -- writing ------------------------------------------------------------------------------------------
def dump_topology_yaml(
    topo: Topology, *, name: str = "rackscale", block_sizes: list[int] | tuple[int, ...] | None = None
) -> str:
    """A block topology.yaml: one block per NVLink domain, named like the domain, nodes in index order.

    Blocks come in order of first appearance; ``load_topology_yaml`` gives back the same node names,
    domains and (domain by domain) node order. Leaf/spine levels and GPU counts are not written.
    """
    dom = topo.domain
    members = topo.group_nodes[dom]
    block: dict[str, object] = {}
    if block_sizes:
        smallest = min(range(len(members)), key=lambda g: len(members[g]))
        smallest_name = f"block {topo.group_names[dom][smallest]!r}"
        problem = block_sizes_problem(list(block_sizes), len(members[smallest]), smallest_name)
        if problem is not None:
            raise SlurmTopologyError(problem[1])
        block["block_sizes"] = list(block_sizes)
    block["blocks"] = [
        {"block": topo.group_names[dom][g], "nodes": _compressed([topo.node_names[i] for i in nodes])}
        for g, nodes in enumerate(members)
    ]
    doc = [{"topology": name, "cluster_default": True, "block": block}]
    header = "# Slurm topology.yaml written by rackscale: one block per NVLink domain.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def _compressed(names: list[str]) -> str:
    try:
        return compress(names, sort=False)  # keeps index order, which the block's node order is
    except HostlistError as exc:
        raise SlurmTopologyError(f"can't write the nodes as a hostlist: {exc}") from None
