"""The registered fleet as the core sees it: the one builder from inventory's node records, and its one cache.

The gateway (to validate a submission), the queue (to schedule) and the migration service (to plan moves)
all read the topology here, so a job is checked against the very topology it will be scheduled on.

Each `NodeRecord` becomes the agent report it was built from (`shared.core.topology_io.agents`): the
record's domain is the cluster UUID (for a node without a fabric, inventory stored the node's own name,
which yields the same one-node domain), `state` draining/down becomes the node's `NodeState`, and
`gpu_health` ("degraded"/"down" per GPU index) the GPUs' `GpuState`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from shared.core import ClusterState
from shared.core.topology import GpuState, Health, NodeState, Topology, TopologyError
from shared.core.topology_io.agents import AgentReport, topology_from_agents
from shared.schemas import NodeRecord
from shared.store import Store

log = logging.getLogger("rackscale.topology")


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

    The leaf level is a soft preference (crossing a leaf costs far less than leaving NVLink), so leaves that
    can't form a level (some nodes report none, or one domain sits under two leaves) drop the level, with a
    warning that names the node, instead of leaving the whole fleet unschedulable. Pass
    `store.topology_generation()` as `generation` to tell topologies apart. Raises TopologyError for no
    records at all (a topology needs a node) or records the core can't hold.
    """
    reports = [report_from_record(r) for r in records]
    try:
        return topology_from_agents(reports, generation=generation)
    except TopologyError as e:
        if not any(r.leaf is not None for r in reports):
            raise
        leafless = topology_from_agents([dataclasses.replace(r, leaf=None) for r in reports], generation=generation)
        log.warning("scheduling without the leaf level: %s", e)
        return leafless


class TopologyView:
    """The core's topology and health from inventory's records, rebuilt only when `topo:gen` moves.

    `get(max_age_s=...)` skips asking for `topo:gen` when it was asked that recently and `invalidate` wasn't
    called since (a reader that hears inventory's NodeChanged events calls it): a decision on a view that
    lags a change by that much is caught by the commit script (node not up) and decided again. While no
    topology is known (no node registered yet), every `get` asks. Records that form no topology at all are
    logged once per generation and read as no topology: the gateway then validates statically, the queue
    places nothing until inventory's records change."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        # (topo:gen, the view, node → domain, node → address)
        self._cache: tuple[int, tuple[Topology, Health] | None, dict[str, str], dict[str, str]] | None = None
        self._empty: tuple[int, ClusterState] | None = None
        self._checked_at: float | None = None
        self._lock = asyncio.Lock()  # concurrent readers of a new generation build it once

    def invalidate(self) -> None:
        self._checked_at = None

    @property
    def generation(self) -> int:
        """`topo:gen` of the view the last `get` returned (-1 before any)."""
        return self._cache[0] if self._cache is not None else -1

    @property
    def domain_of(self) -> Mapping[str, str]:
        """Node name → NVLink domain name, of the records the last `get` read (empty before any)."""
        return self._cache[2] if self._cache is not None else {}

    @property
    def addr_of(self) -> Mapping[str, str]:
        """Node name → where other nodes reach it (its agent's `addr`; absent: its name), as `domain_of`."""
        return self._cache[3] if self._cache is not None else {}

    async def get(self, max_age_s: float = 0.0) -> tuple[Topology, Health] | None:
        """(Topology, Health), or None until a node registers."""
        now = self.clock()
        cache = self._cache
        fresh = self._checked_at is not None and now - self._checked_at < max_age_s
        if cache is not None and cache[1] is not None and fresh:
            return cache[1]
        gen = await self.store.topology_generation()
        self._checked_at = now
        if cache is None or cache[0] != gen:
            async with self._lock:
                if self._cache is None or self._cache[0] != gen:
                    # Read after the generation: at worst newer nodes are cached under an older number (and
                    # rebuilt when it moves on).
                    records = await self.store.nodes()
                    domains = {r.name: r.domain for r in records}
                    self._cache = (gen, _build(records, gen), domains, {r.name: r.addr for r in records if r.addr})
        assert self._cache is not None
        return self._cache[1]

    def last(self) -> tuple[Topology, Health] | None:
        """What `get` returned last, without asking the store whether it is current (for lookups that may lag
        a topology change, such as which domain a node is in)."""
        return self._cache[1] if self._cache is not None else None

    def base_state(self) -> ClusterState:
        """The ClusterState of the view `get` last returned, with no allocations: built once per generation
        (building one is the costly part of a cycle's set-up). Shared: copy it before changing it."""
        assert self._cache is not None and self._cache[1] is not None, "get() returned no topology yet"
        gen, (topo, health), _, _ = self._cache
        if self._empty is None or self._empty[0] != gen:
            self._empty = (gen, ClusterState(topo, health))
        return self._empty[1]


def _build(records: list[NodeRecord], generation: int) -> tuple[Topology, Health] | None:
    if not records:
        return None
    try:
        return topology_from_records(records, generation=generation)
    except TopologyError:
        log.exception("the registered nodes (topology generation %d) form no topology", generation)
        return None
