"""How the queue and the migration service put held GPUs into a cycle's state (`shared.held.occupy`).

One domain of 2 nodes x 4 GPUs. A priority-0 job holds node n00; a priority-10 job needs both nodes:

    n00 [a a a a]   n01 [. . . .]        the cycle may preempt `a` only when `a` is placed or running —
                                           never while its order is still on its way to placement.
"""

from __future__ import annotations

import pytest

from shared.core import Allocate, ClusterState, CycleConfig, Preempt, Scheduler, Topology
from shared.held import occupy
from shared.jobs import job_spec
from shared.schemas import JobBody, JobRecord, JobState, NodeGpus


def record(job_id: str, priority: int, state: JobState, nodes: list[NodeGpus]) -> JobRecord:
    body = JobBody(name=job_id, tenant="t", gpus=4 * max(1, len(nodes)), priority=priority, checkpointable=True)
    return JobRecord(id=job_id, spec=body, state=state, submitted_at=0.0, updated_at=0.0, allocation=nodes)


@pytest.fixture
def topo() -> Topology:
    return Topology.uniform(1, nodes_per_domain=2, gpus_per_node=4)


@pytest.mark.parametrize(("preemptible", "expect_preempt"), [(True, True), (False, False)])
def test_only_placed_work_is_a_victim(topo: Topology, preemptible: bool, expect_preempt: bool) -> None:
    n0 = topo.node_names[0]
    state = ClusterState(topo)
    held = [NodeGpus(n0, [0, 1, 2, 3])]
    occupy(state, "a", held, record("a", 0, JobState.RUNNING, held), 0.0, preemptible=preemptible)
    big = record("big", 10, JobState.PENDING, [NodeGpus("x", [0]), NodeGpus("y", [0])])
    result = Scheduler(CycleConfig()).cycle(state, [job_spec(big.spec, "big", 0.0)], 1.0)
    kinds = {type(d) for d in result.decisions}
    assert (Preempt in kinds) is expect_preempt
    assert (Allocate in kinds) is expect_preempt


def test_an_overlapping_inflight_order_still_takes_its_free_gpus(topo: Topology) -> None:
    # n00 [a a . .] held; an in-flight order for `b` names n00 GPUs 1-2 (overlap on 1) and n01 GPU 0
    n0, n1 = topo.node_names[0], topo.node_names[1]
    state = ClusterState(topo)
    occupy(state, "a", [NodeGpus(n0, [0, 1])], None, 0.0, preemptible=True)
    order = [NodeGpus(n0, [1, 2]), NodeGpus(n1, [0])]
    occupy(state, "b", order, record("b", 0, JobState.PENDING, order), 0.0, preemptible=False)
    assert state.free[0] == 0b1000  # GPU 2 went to b, GPU 3 stays free
    assert state.free[1] == 0b1110
    assert state.allocs["b"].priority > 1000  # above any priority a job can ask for
