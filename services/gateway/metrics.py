"""The cluster's figures for Prometheus, computed from Redis at scrape time by the gateway (it reads all).

Only the gateway exports these, so a sum over replicas' scrapes is the only double count to avoid
(`max by` or scraping one replica): every replica reports the same Redis.

  rackscale_jobs{state,tenant}                 job records by state and tenant (kept after they end)
  rackscale_queue_depth                        pending jobs
  rackscale_queue_oldest_pending_seconds       age of the oldest pending job
  rackscale_nodes{state}                       nodes up / draining / down
  rackscale_gpus{domain,state}                 GPUs free / busy / down per NVLink domain
  rackscale_domain_free_nodes{domain}          nodes up with every GPU free and healthy (whole free nodes)
  rackscale_large_job_slots{domain}            jobs of the planning unit (domain nodes - 2, e.g. 16 of 18)
                                               that could start in the domain now
  rackscale_fragmentation_ratio                share of free GPUs not on whole free nodes (0: none stranded)
  rackscale_dead_letter_messages               messages held in the dead-letter stream (every service's)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict

from prometheus_client.core import GaugeMetricFamily, Metric

from shared.metrics import gauge_text
from shared.runtime import Deps
from shared.schemas import JobState, NodeRecord

SPARE_NODES = 2  # operators plan jobs of domain nodes - 2, so a rack with a tray or two down still hosts them


def _gpu_states(nodes: list[NodeRecord], owned: set[tuple[str, int]]) -> dict[str, Counter[str]]:
    per_domain: dict[str, Counter[str]] = defaultdict(Counter)
    for n in nodes:
        c = per_domain[n.domain]
        for i in range(n.gpus):
            if n.state == "down" or n.gpu_health.get(str(i)) == "down":
                c["down"] += 1
            elif (n.name, i) in owned:
                c["busy"] += 1
            else:
                c["free"] += 1
    return per_domain


async def cluster_families(deps: Deps) -> list[Metric]:
    store = deps.store
    nodes, allocs, (jobs, _) = await asyncio.gather(
        store.nodes(), store.allocations(), store.list_jobs(offset=0, limit=1 << 30)
    )
    now = deps.clock()
    owned = {(ng.node, g) for a in allocs for ng in a.nodes for g in ng.gpus}

    by_state = GaugeMetricFamily("rackscale_jobs", "Jobs by state and tenant", labels=["state", "tenant"])
    counts = Counter((j.state.value, j.spec.tenant) for j in jobs)
    for (state, tenant), n in sorted(counts.items()):
        by_state.add_metric([state, tenant], n)
    pending = [j for j in jobs if j.state is JobState.PENDING]
    depth = GaugeMetricFamily("rackscale_queue_depth", "Pending jobs", value=len(pending))
    oldest = GaugeMetricFamily(
        "rackscale_queue_oldest_pending_seconds",
        "Age of the oldest pending job",
        value=max((now - j.submitted_at for j in pending), default=0.0),
    )

    node_states = GaugeMetricFamily("rackscale_nodes", "Nodes by state", labels=["state"])
    for state in ("up", "draining", "down"):
        node_states.add_metric([state], sum(n.state == state for n in nodes))

    gpus = GaugeMetricFamily("rackscale_gpus", "GPUs by state per NVLink domain", labels=["domain", "state"])
    for domain, c in sorted(_gpu_states(nodes, owned).items()):
        for state in ("free", "busy", "down"):
            gpus.add_metric([domain, state], c[state])

    whole = GaugeMetricFamily(
        "rackscale_domain_free_nodes", "Nodes up with every GPU free and healthy", labels=["domain"]
    )
    slots = GaugeMetricFamily(
        "rackscale_large_job_slots", "Jobs of (domain nodes - 2) nodes that could start now", labels=["domain"]
    )
    free_gpus = whole_gpus = 0
    domains: dict[str, list[NodeRecord]] = defaultdict(list)
    for n in nodes:
        domains[n.domain].append(n)
    for domain, members in sorted(domains.items()):
        free_nodes = 0
        for n in members:
            usable = [i for i in range(n.gpus) if n.gpu_health.get(str(i)) != "down"]
            free = [i for i in usable if (n.name, i) not in owned] if n.state == "up" else []
            free_gpus += len(free)
            if n.state == "up" and len(free) == n.gpus:
                free_nodes += 1
                whole_gpus += n.gpus
        whole.add_metric([domain], free_nodes)
        slots.add_metric([domain], free_nodes // max(1, len(members) - SPARE_NODES))
    frag = GaugeMetricFamily(
        "rackscale_fragmentation_ratio",
        "Share of free GPUs on nodes that are not wholly free",
        value=round(1 - whole_gpus / free_gpus, 6) if free_gpus else 0.0,
    )

    families: list[Metric] = [by_state, depth, oldest, node_states, gpus, whole, slots, frag]
    dlq = deps.names.stream_for(deps.names.dead_letter("gateway"))
    with contextlib.suppress(Exception):  # the figure is missing rather than the whole scrape failing
        info = await deps.bus.js.stream_info(dlq)
        families.append(
            GaugeMetricFamily(
                "rackscale_dead_letter_messages", "Messages in the dead-letter stream", value=info.state.messages
            )
        )
    return families


async def cluster_metrics(deps: Deps) -> bytes:
    return gauge_text(await cluster_families(deps))
