"""The topology tree: named levels of groups above nodes of GPUs. Immutable per inventory generation.

A topology is a list of nodes, each naming its group at every level, outermost first, e.g.
levels ``("leaf", "domain", "clique")`` and a node in ``("leaf-a", "d03", "d03.0")``. Every inner group
sits inside exactly one outer group (a clique in one domain, a domain under one leaf); the builder
checks it. A synthetic root level ``cluster`` (one group) is always present first, so "anywhere" is a
level like the others. Node order is index order: Slurm takes nodes inside a block in that order.

Free capacity is not here: it changes every cycle and lives in `state.ClusterState`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

CLUSTER = "cluster"
DOMAIN = "domain"
# Words a job may use for the NVLink-domain level.
DOMAIN_ALIASES = frozenset({"domain", "nvlink", "rack", "block"})


class TopologyError(ValueError):
    """A topology that can't be built: the message names the node, level or group at fault."""


class NodeState(StrEnum):
    UP = "up"
    DRAINING = "draining"  # running jobs keep running; nothing new lands
    DOWN = "down"


class GpuState(StrEnum):
    OK = "ok"
    DEGRADED = "degraded"  # usable, placed last
    DOWN = "down"  # never allocated


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as an importer reports it: its name, GPU count and group name per level."""

    name: str
    gpus: int
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Health:
    """Sparse health overlay: nodes and GPUs not named are up / ok."""

    nodes: dict[str, NodeState]
    gpus: dict[tuple[str, int], GpuState]

    @staticmethod
    def all_up() -> Health:
        return Health({}, {})

    def node(self, name: str) -> NodeState:
        return self.nodes.get(name, NodeState.UP)


class Topology:
    """Immutable topology. Groups and nodes are addressed by dense indices for the hot path."""

    __slots__ = (
        "_descendants",
        "_max_group",
        "domain_level",
        "generation",
        "group_children",
        "group_level_parent",
        "group_names",
        "group_nodes",
        "level_index",
        "levels",
        "max_node_gpus",
        "node_gpus",
        "node_group",
        "node_index",
        "node_names",
    )

    def __init__(
        self,
        levels: Sequence[str],
        nodes: Iterable[NodeSpec],
        *,
        domain_level: str = DOMAIN,
        generation: int = 0,
    ) -> None:
        user_levels = tuple(levels)
        if CLUSTER in user_levels:
            raise TopologyError(f"level name {CLUSTER!r} is reserved for the root")
        if len(set(user_levels)) != len(user_levels):
            raise TopologyError(f"level names repeat: {list(user_levels)}")
        if domain_level not in user_levels:
            raise TopologyError(f"domain level {domain_level!r} is not one of the levels {list(user_levels)}")
        self.levels: tuple[str, ...] = (CLUSTER, *user_levels)
        self.level_index: dict[str, int] = {name: i for i, name in enumerate(self.levels)}
        self.domain_level = domain_level
        self.generation = generation

        names: list[str] = []
        gpus: list[int] = []
        group_ids: list[dict[str, int]] = [{} for _ in self.levels]
        node_group: list[list[int]] = [[] for _ in self.levels]
        parent_of: list[dict[int, int]] = [{} for _ in self.levels]
        index: dict[str, int] = {}
        for spec in nodes:
            if spec.name in index:
                raise TopologyError(f"node {spec.name!r} appears twice")
            if spec.gpus < 1:
                raise TopologyError(f"node {spec.name!r}: gpus must be at least 1, got {spec.gpus}")
            if len(spec.groups) != len(user_levels):
                raise TopologyError(
                    f"node {spec.name!r}: {len(spec.groups)} group names for {len(user_levels)} levels "
                    f"{list(user_levels)}"
                )
            index[spec.name] = len(names)
            names.append(spec.name)
            gpus.append(spec.gpus)
            path = (CLUSTER, *spec.groups)
            prev = -1
            for li, gname in enumerate(path):
                gid = group_ids[li].setdefault(gname, len(group_ids[li]))
                node_group[li].append(gid)
                if li > 0:
                    known = parent_of[li].setdefault(gid, prev)
                    if known != prev:
                        outer = self.levels[li - 1]
                        raise TopologyError(f"node {spec.name!r}: {self.levels[li]} {gname!r} sits under two {outer}s")
                prev = gid
        if not names:
            raise TopologyError("a topology needs at least one node")

        self.node_names: tuple[str, ...] = tuple(names)
        self.node_gpus: tuple[int, ...] = tuple(gpus)
        self.node_index = index
        self.max_node_gpus = max(gpus)
        self.node_group: tuple[tuple[int, ...], ...] = tuple(tuple(g) for g in node_group)
        self.group_names: tuple[tuple[str, ...], ...] = tuple(
            tuple(sorted(ids, key=ids.__getitem__)) for ids in group_ids
        )
        members: list[list[list[int]]] = [[[] for _ in ids] for ids in group_ids]
        for li in range(len(self.levels)):
            for n, g in enumerate(self.node_group[li]):
                members[li][g].append(n)
        self.group_nodes: tuple[tuple[tuple[int, ...], ...], ...] = tuple(
            tuple(tuple(m) for m in lvl) for lvl in members
        )
        # parent group (one level out) of each group, -1 for the root
        self.group_level_parent: tuple[tuple[int, ...], ...] = tuple(
            tuple(parent_of[li].get(g, -1) for g in range(len(group_ids[li]))) for li in range(len(self.levels))
        )
        # child groups (one level in) of each group; empty at the innermost level
        children: list[list[list[int]]] = [[[] for _ in ids] for ids in group_ids]
        for li in range(1, len(self.levels)):
            for g, parent in enumerate(self.group_level_parent[li]):
                children[li - 1][parent].append(g)
        self.group_children: tuple[tuple[tuple[int, ...], ...], ...] = tuple(
            tuple(tuple(c) for c in lvl) for lvl in children
        )

        self._max_group = tuple(max(len(m) for m in lvl) for lvl in self.group_nodes)
        self._descendants: dict[tuple[int, int, int], tuple[int, ...]] = {}

    # -- lookups -----------------------------------------------------------------------------------
    def level(self, name: str) -> int:
        """Index of a level by name; the domain aliases ("nvlink", "rack", ...) mean the domain level."""
        if name in self.level_index:
            return self.level_index[name]
        if name in DOMAIN_ALIASES:
            return self.level_index[self.domain_level]
        raise TopologyError(f"unknown topology level {name!r}; levels are {list(self.levels)}")

    @property
    def domain(self) -> int:
        return self.level_index[self.domain_level]

    def groups(self, level: int) -> tuple[tuple[int, ...], ...]:
        return self.group_nodes[level]

    def descendants(self, level: int, group: int, inner: int) -> tuple[int, ...]:
        """Groups of level `inner` inside group `group` of level `level` (cached: the tree is immutable)."""
        key = (level, group, inner)
        found = self._descendants.get(key)
        if found is None:
            seen: dict[int, None] = {}
            for node in self.group_nodes[level][group]:
                seen.setdefault(self.node_group[inner][node])
            found = self._descendants[key] = tuple(seen)
        return found

    def max_group_nodes(self, level: int) -> int:
        return self._max_group[level]

    def node_path(self, node: int) -> tuple[str, ...]:
        """Group names of a node per user level (without the root)."""
        return tuple(self.group_names[li][self.node_group[li][node]] for li in range(1, len(self.levels)))

    def specs(self) -> list[NodeSpec]:
        return [NodeSpec(n, self.node_gpus[i], self.node_path(i)) for i, n in enumerate(self.node_names)]

    def __len__(self) -> int:
        return len(self.node_names)

    def __repr__(self) -> str:
        dom = self.domain
        return (
            f"Topology(levels={list(self.levels[1:])}, nodes={len(self)}, "
            f"domains={len(self.group_nodes[dom])}, gpus={sum(self.node_gpus)})"
        )

    # -- builders ----------------------------------------------------------------------------------
    @classmethod
    def uniform(
        cls,
        domains: int,
        nodes_per_domain: int = 18,
        gpus_per_node: int = 4,
        *,
        cliques_per_domain: int = 1,
        domains_per_leaf: int | None = None,
    ) -> Topology:
        """A fleet of identical NVLink domains (default NVL72: 18 nodes x 4 GPUs).

        Nodes are named ``d03-n07``, domains ``d03``, cliques ``d03.0``, leaves ``leaf00``.
        """
        if domains < 1 or nodes_per_domain < 1:
            raise TopologyError("a uniform fleet needs at least one domain of at least one node")
        if cliques_per_domain < 1 or nodes_per_domain % cliques_per_domain:
            raise TopologyError(
                f"cliques_per_domain={cliques_per_domain} must divide nodes_per_domain={nodes_per_domain}"
            )
        per_clique = nodes_per_domain // cliques_per_domain
        levels = ("leaf", DOMAIN, "clique") if domains_per_leaf else (DOMAIN, "clique")
        specs = []
        for d in range(domains):
            for n in range(nodes_per_domain):
                groups: tuple[str, ...] = (f"d{d:02d}", f"d{d:02d}.{n // per_clique}")
                if domains_per_leaf:
                    groups = (f"leaf{d // domains_per_leaf:02d}", *groups)
                specs.append(NodeSpec(f"d{d:02d}-n{n:02d}", gpus_per_node, groups))
        return cls(levels, specs)
