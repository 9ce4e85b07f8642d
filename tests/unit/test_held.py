"""The view the queue's cycle and the migration service plan on (`shared.held.occupy_held`).

One domain of 3 nodes x 4 GPUs. Job `m` runs on n00 and is migrating to n02 (its checkpoint is being
written): n00 stays held until the acks, n02 is held for the restore, and neither can be preempted.

    n00 [m m m m]   n01 [. . . .]   n02 [(m) (m) (m) (m)]
"""

from __future__ import annotations

from shared.core import Allocate, ClusterState, CycleConfig, Pending, Preempt, Scheduler, TenantPolicy, Topology
from shared.held import MOVE_SUFFIX, UNPREEMPTIBLE, occupy_held
from shared.jobs import job_spec
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, MoveTicket, NodeGpus

ALL = [0, 1, 2, 3]


def record(job_id: str, state: JobState, nodes: list[NodeGpus], *, priority: int = 0, gpus: int = 4) -> JobRecord:
    body = JobBody(name=job_id, tenant="t", gpus=gpus, priority=priority, checkpointable=True)
    return JobRecord(id=job_id, spec=body, state=state, attempt=1, allocation=nodes)


def test_a_migrating_job_holds_its_source_and_its_target_and_neither_is_a_victim() -> None:
    topo = Topology.uniform(1, nodes_per_domain=3, gpus_per_node=4)
    m = record("m", JobState.MIGRATING, [NodeGpus("d00-n00", ALL)])
    m.move = MoveTicket(migration_id="x", target=[NodeGpus("d00-n02", ALL)], reason="test", since=0.0)
    state = ClusterState(topo)
    held = occupy_held(
        state, [AllocationRecord(job_id="m", attempt=1, nodes=m.allocation, committed_at=0.0)], {"m": m}, 0.0
    )
    assert held == {"m"}
    assert state.free == [0, 0b1111, 0]
    assert state.allocs["m"].priority == UNPREEMPTIBLE and state.allocs["m" + MOVE_SUFFIX].priority == UNPREEMPTIBLE

    # a high-priority job of 8 GPUs can take neither: it fits nowhere and preempts nothing
    big = record("big", JobState.PENDING, [], priority=100, gpus=8)
    result = Scheduler(CycleConfig(policy="rackscale")).cycle(state, [job_spec(big.spec, big.id)], 0.0)
    assert not any(isinstance(d, Allocate | Preempt) for d in result.decisions), result.decisions


def test_a_running_job_on_its_own_allocation_stays_a_victim() -> None:
    topo = Topology.uniform(1, nodes_per_domain=3, gpus_per_node=4)
    r = record("r", JobState.RUNNING, [NodeGpus("d00-n00", ALL)], priority=1)
    state = ClusterState(topo)
    occupy_held(state, [AllocationRecord(job_id="r", attempt=1, nodes=r.allocation, committed_at=0.0)], {"r": r}, 0.0)
    assert state.allocs["r"].priority == 1
    assert "r" + MOVE_SUFFIX not in state.allocs


def test_an_ended_job_whose_release_is_on_its_way_still_counts_for_its_tenants_quota() -> None:
    """The queue drops an ended job from its view before placement has freed its GPUs: the allocation still
    counts for the tenant (`ended`), or the next cycle would let the tenant over its quota for a moment."""
    topo = Topology.uniform(1, nodes_per_domain=3, gpus_per_node=4)
    done = record("done", JobState.SUCCEEDED, [NodeGpus("d00-n00", ALL)])
    alloc = AllocationRecord(job_id="done", attempt=1, nodes=done.allocation, committed_at=0.0)
    nxt = record("next", JobState.PENDING, [])
    config = CycleConfig(policy="rackscale", tenants={"t": TenantPolicy(quota_gpus=4)})

    unknown = ClusterState(topo)
    occupy_held(unknown, [alloc], {}, 0.0)  # without the record, the GPUs are held by nobody's tenant
    assert any(
        isinstance(d, Allocate) for d in Scheduler(config).cycle(unknown, [job_spec(nxt.spec, nxt.id)], 0.0).decisions
    )

    state = ClusterState(topo)
    assert occupy_held(state, [alloc], {}, 0.0, ended={"done": done}) == {"done"}
    assert state.free == [0, 0b1111, 0b1111] and state.allocs["done"].priority == UNPREEMPTIBLE
    decisions = Scheduler(config).cycle(state, [job_spec(nxt.spec, nxt.id)], 0.0).decisions
    assert [d.code.name for d in decisions if isinstance(d, Pending)] == ["QUOTA"], decisions
