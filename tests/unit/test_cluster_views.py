"""The gateway's `/v1/cluster` views kept between requests (`ClusterViews`): what is kept never shows stale."""

from __future__ import annotations

import msgspec

from services.gateway.views import OTHER_TENANT, ClusterViews, cluster_view, redact_cluster
from shared.schemas import AllocationRecord, NodeGpus, NodeRecord


def node(name: str, state: str = "up", beat: float = 1.0, health: dict[str, str] | None = None) -> NodeRecord:
    return NodeRecord(
        name=name, domain=name[:3], clique=0, gpus=4, state=state, last_heartbeat=beat, gpu_health=health or {}
    )


def alloc(job: str, node_name: str, gpus: list[int], attempt: int = 1) -> AllocationRecord:
    return AllocationRecord(job_id=job, attempt=attempt, committed_at=1.0, nodes=[NodeGpus(node=node_name, gpus=gpus)])


def doc(view: object) -> object:
    return msgspec.json.decode(msgspec.json.encode(view))


def test_each_build_equals_one_built_from_nothing() -> None:
    views = ClusterViews()
    steps = [
        ([node("d00-n00"), node("d00-n01"), node("d01-n00")], [alloc("a", "d00-n00", [0, 1])]),
        # heartbeats only: the kept node views with the new times
        (
            [node("d00-n00", beat=2.0), node("d00-n01", beat=2.0), node("d01-n00", beat=2.0)],
            [alloc("a", "d00-n00", [0, 1])],
        ),
        # a node goes down, a GPU degrades, a job ends and another starts, one job runs again (new attempt)
        (
            [node("d00-n00", beat=3.0), node("d00-n01", "down"), node("d01-n00", health={"2": "degraded"})],
            [alloc("a", "d00-n00", [0, 1], attempt=2), alloc("b", "d01-n00", [3])],
        ),
        ([node("d00-n00"), node("d01-n00")], []),  # a node gone from the records, nothing held
    ]
    for nodes, allocs in steps:
        assert doc(views.build(nodes, allocs, 5)) == doc(cluster_view(nodes, allocs, 5))


def test_a_redacted_view_leaves_the_kept_one_as_it_was() -> None:
    views = ClusterViews()
    nodes, allocs = [node("d00-n00")], [alloc("mine", "d00-n00", [0]), alloc("theirs", "d00-n00", [1])]
    full = views.build(nodes, allocs, 1)
    seen = redact_cluster(full, {"mine"})
    jobs = [g.job for g in seen.domains[0].nodes[0].gpus]
    assert jobs == ["mine", OTHER_TENANT, None, None]
    assert [a.job_id for a in seen.allocations] == ["mine"]
    again = views.build(nodes, allocs, 1)  # the kept node view: still naming every job
    assert [g.job for g in again.domains[0].nodes[0].gpus] == ["mine", "theirs", None, None]
    assert [a.job_id for a in again.allocations] == ["mine", "theirs"]
