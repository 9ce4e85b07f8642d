"""What the API returns, built from the Redis records: the bodies of `shared.api` (encoded with msgspec.json,
described in /openapi.json)."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping

import msgspec

from shared import lifecycle
from shared.api import (
    AllocationView,
    ClusterView,
    DomainView,
    GpuView,
    JobView,
    MigrationView,
    NodeView,
    Placed,
    RankExitView,
    Utilisation,
)
from shared.picture import gpu_cell
from shared.schemas import AllocationRecord, JobRecord, MigrationRecord, NodeGpus, NodeRecord


def placed(nodes: Iterable[NodeGpus], domain_of: Mapping[str, str]) -> list[Placed]:
    return [Placed(domain=domain_of.get(ng.node, ""), node=ng.node, gpus=list(ng.gpus)) for ng in nodes]


_TRACE_ID = re.compile(r"[0-9a-f]{32}")  # W3C trace-context: lowercase hex


def trace_id(traceparent: str) -> str:
    """The trace id of a W3C traceparent (`00-<32 hex>-<16 hex>-<2 hex>`); "" when it isn't one."""
    parts = traceparent.split("-")
    if len(parts) != 4 or not _TRACE_ID.fullmatch(parts[1]) or parts[1] == "0" * 32:
        return ""
    return parts[1]


def job_view(rec: JobRecord, domain_of: Mapping[str, str]) -> JobView:
    s = rec.spec
    return JobView(
        id=rec.id,
        name=s.name,
        tenant=s.tenant,
        state=rec.state,
        reason=rec.reason,
        gpus=s.gpus,
        gpus_per_node=s.gpus_per_node,
        topology=s.topology,
        priority=s.priority,
        exclusive=s.exclusive,
        checkpointable=s.checkpointable,
        allocation=placed(rec.allocation, domain_of),
        submitted_at=rec.submitted_at,
        started_at=rec.started_at,
        ended_at=rec.ended_at,
        updated_at=rec.updated_at,
        attempt=rec.attempt,
        exit_codes=dict(rec.exit_codes),
        trace_id=trace_id(rec.trace),
        time_limit_s=s.time_limit_s,
        processes=s.processes,
        workdir=s.workdir,
        end=rec.end,
        exits=rank_exits(rec),
        segment=rec.segment if rec.allocation else None,
        min_gpus=s.min_gpus,
        array_id=rec.array_id or None,
        array_index=rec.array_index,
        array=s.array,
        dependency=s.dependency,
    )


def rank_exits(rec: JobRecord) -> list[RankExitView]:
    out = []
    for key, code in rec.exit_codes.items():
        node, _, rank = key.rpartition("/")
        out.append(
            RankExitView(
                node=node,
                rank=int(rank),
                exit_code=code,
                signal=_signal_name(-code) if code < 0 else None,
                cause=rec.exit_causes.get(key) or lifecycle.exit_cause(code),
            )
        )
    return sorted(out, key=lambda e: e.rank)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def migration_view(rec: MigrationRecord, domain_of: Mapping[str, str]) -> MigrationView:
    final = rec.steps.get(rec.state) if rec.state in ("done", "requeued", "rolled_back") else None
    return MigrationView(
        id=rec.id,
        job_id=rec.job_id,
        tenant=rec.tenant,
        kind=rec.kind,
        why=rec.why,
        state=rec.state,
        attempt=rec.attempt,
        source=placed(rec.source, domain_of),
        to=placed(rec.target, domain_of),
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        steps=dict(rec.steps),
        took_s=None if final is None else max(0.0, final - rec.created_at),
        error=rec.error,
        cost_gpu_s=rec.cost_gpu_s,
        gain_gpu_s=rec.gain_gpu_s,
    )


Counts = tuple[int, int, int, int]  # GPUs: total, healthy, busy, busy and healthy


def _counts(gpus: Iterable[tuple[bool, bool]]) -> Counts:
    total = healthy = busy = working = 0
    for ok, owned in gpus:
        total += 1
        healthy += ok
        busy += owned
        working += ok and owned
    return total, healthy, busy, working


def _utilisation(counts: Iterable[Counts]) -> Utilisation:
    total, healthy, busy, working = (sum(c) for c in zip(*counts, strict=True)) if counts else (0, 0, 0, 0)
    return Utilisation(total=total, healthy=healthy, busy=busy, ratio=round(working / healthy, 4) if healthy else 0.0)


NodeKey = tuple[object, ...]


class ClusterViews:
    """Builds `/v1/cluster` views, keeping each node's view (its GPUs and their figures) while the node's record and
    its GPUs' owners stay the same, and each allocation's while its attempt does: at 278 domains (5,004 nodes,
    20,016 GPUs) building every GPU's view anew was most of the request. What it returns is never changed
    afterwards (`redact_cluster` copies), so the parts are shared between views."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeKey, NodeView, Counts]] = {}
        self._allocs: dict[tuple[str, int], AllocationView] = {}
        self._generation: int | None = None

    def build(
        self,
        nodes: list[NodeRecord],
        allocations: list[AllocationRecord],
        generation: int,
        heard: Mapping[str, float] | None = None,
    ) -> ClusterView:
        """`heard`: the nodes' last heartbeats, when newer than their records say (records kept per generation)."""
        if generation != self._generation:  # a node may be in another domain now: nothing kept is sure
            self._nodes, self._allocs, self._generation = {}, {}, generation
        domain_of = {n.name: n.domain for n in nodes}
        owner: dict[str, dict[int, str]] = {}
        for a in allocations:
            for ng in a.nodes:
                owner.setdefault(ng.node, {}).update((g, a.job_id) for g in ng.gpus)
        by_domain: dict[str, list[NodeView]] = {}
        counts: dict[str, list[Counts]] = {}
        kept: dict[str, tuple[NodeKey, NodeView, Counts]] = {}
        for n in sorted(nodes, key=lambda r: (r.domain, r.name)):
            held = owner.get(n.name)
            owners = tuple(held.get(i) for i in range(n.gpus)) if held else (None,) * n.gpus
            key = (n.domain, n.state, n.drained, n.reason, n.clique, n.leaf, n.backend, owners)
            if n.gpu_health:
                key += tuple(sorted(n.gpu_health.items()))
            beat = max(n.last_heartbeat, heard.get(n.name, 0.0)) if heard else n.last_heartbeat
            hit = self._nodes.get(n.name)
            if hit is not None and hit[0] == key:
                _, base, node_counts = hit
                view = msgspec.structs.replace(base, last_heartbeat=beat)
            else:
                view, node_counts = _node_view(n, owners)
                view.last_heartbeat = beat
            kept[n.name] = (key, view, node_counts)
            by_domain.setdefault(n.domain, []).append(view)
            counts.setdefault(n.domain, []).append(node_counts)
        self._nodes = kept
        domains = [DomainView(name=d, nodes=v, utilisation=_utilisation(counts[d])) for d, v in by_domain.items()]
        allocs = {}
        for a in allocations:
            av = self._allocs.get((a.job_id, a.attempt))
            if av is None:
                av = AllocationView(
                    job_id=a.job_id, attempt=a.attempt, committed_at=a.committed_at, nodes=placed(a.nodes, domain_of)
                )
            allocs[(a.job_id, a.attempt)] = av
        self._allocs = allocs
        overall = _utilisation([c for cs in counts.values() for c in cs])
        return ClusterView(
            generation=generation, domains=domains, allocations=list(allocs.values()), utilisation=overall
        )


def _node_view(n: NodeRecord, owners: tuple[str | None, ...]) -> tuple[NodeView, Counts]:
    """A node's view, and its GPUs' counts for the utilisation figures."""
    gpus, flags = [], []
    for i, job in enumerate(owners):
        health = n.gpu_health.get(str(i), "ok")
        cell = gpu_cell(
            owned=job is not None,
            gpu_down=health == "down",
            node_usable=n.state == "up",
            node_down=n.state == "down",
            degraded=health == "degraded",
        )
        gpus.append(GpuView(index=i, health=health, job=job, cell=cell.value))
        flags.append((n.state != "down" and health != "down", job is not None))
    view = NodeView(
        name=n.name,
        state=n.state,
        drained=n.drained,
        reason=n.reason,
        clique=n.clique,
        leaf=n.leaf,
        backend=n.backend,
        last_heartbeat=n.last_heartbeat,
        gpus=gpus,
    )
    return view, _counts(flags)


def cluster_view(nodes: list[NodeRecord], allocations: list[AllocationRecord], generation: int) -> ClusterView:
    """The cluster as one view, built from nothing (the gateway keeps a `ClusterViews` between requests)."""
    return ClusterViews().build(nodes, allocations, generation)


OTHER_TENANT = "(other tenant)"


def redact_cluster(view: ClusterView, mine: set[str]) -> ClusterView:
    """The cluster as a user sees it: GPUs of other tenants' jobs show as busy but unnamed, their allocations go.
    A new view: the parts it changes are copies (the given view's parts are shared with later ones)."""

    def hidden(n: NodeView) -> NodeView:
        if all(g.job is None or g.job in mine for g in n.gpus):
            return n
        gpus = [g if g.job is None or g.job in mine else msgspec.structs.replace(g, job=OTHER_TENANT) for g in n.gpus]
        return msgspec.structs.replace(n, gpus=gpus)

    domains = [msgspec.structs.replace(d, nodes=[hidden(n) for n in d.nodes]) for d in view.domains]
    allocations = [a for a in view.allocations if a.job_id in mine]
    return msgspec.structs.replace(view, domains=domains, allocations=allocations)
