"""The queue's reservations reach the migration planner through Redis, by domain name.

The defragmentation planner empties a blocked job's own reserved domains first and keeps moved jobs out of
every reserved one (`plan_defrag(promised=)`, as `rackscale sim --migration on` runs it). In the running
system the reservations live in the queue leader's scheduler and the planner in the migration service: the
leader's cycle writes them (`names.reservations_key`) and the planner maps the names onto its own topology.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.migration.service import MigrationService
from services.queue.service import QueueService
from shared.runtime import Deps
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, NodeGpus, TopologyBody
from shared.settings import Settings
from tests.integration.conftest import namespace_deps, service_deps

pytestmark = pytest.mark.asyncio

NOW = 1000.0


@pytest_asyncio.fixture
async def deps(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Deps]:
    nodes = {"n0": "d0", "n1": "d0", "n2": "d1", "n3": "d1"}
    async with service_deps(nats_url, redis_url, namespace, nodes, clock=lambda: NOW) as d:
        yield d


async def _running(deps: Deps, job: str, node: str, duration_s: float) -> None:
    """A one-node job running on `node` since NOW, expected to end after `duration_s`."""
    nodes = [NodeGpus(node, [0, 1, 2, 3])]
    body = JobBody(name=job, tenant="t", gpus=4, gpus_per_node=4, duration_s=duration_s)
    rec = JobRecord(id=job, spec=body, state=JobState.RUNNING, attempt=1, allocation=nodes, started_at=NOW)
    await deps.store.put_job(rec, new=True)
    assert (await deps.store.commit(AllocationRecord(job_id=job, attempt=1, nodes=nodes, committed_at=NOW))).ok


async def _leader_reserving_big(deps: Deps) -> QueueService:
    """One node of each domain busy, d1's job ending first: the leader's cycle reserves d1 for a two-node job."""
    await _running(deps, "long", "n0", 3600.0)
    await _running(deps, "short", "n2", 60.0)
    big = JobBody(name="big", tenant="t", gpus=8, gpus_per_node=4, topology=TopologyBody(nvlink="required"))
    await deps.store.put_job(JobRecord(id="big", spec=big, submitted_at=NOW), new=True)
    queue = QueueService(deps)
    assert await queue._lead()
    await queue.run_cycle(full=True)
    return queue


async def test_the_leaders_reservations_reach_the_planner_by_domain_name(deps: Deps) -> None:
    await _leader_reserving_big(deps)
    shared = await deps.store.reservations()
    assert shared is not None and shared.domains == {"big": ["d1"]}, shared
    rec = await deps.store.get_job("big")
    assert rec is not None and rec.state is JobState.PENDING and "reserved" in rec.reason, rec

    migration = MigrationService(deps)
    known = await migration.topology.get()
    assert known is not None
    topo = known[0]
    d1 = topo.group_names[topo.domain].index("d1")
    assert await migration._promised(topo, {"big"}) == {"big": frozenset({d1})}
    assert await migration._promised(topo, set()) == {}  # a job no longer waiting holds nothing


async def test_the_reservations_are_written_again_only_when_they_change(deps: Deps) -> None:
    queue = await _leader_reserving_big(deps)
    await deps.store.r.delete(deps.names.reservations_key)
    await queue.run_cycle(full=True)  # the same reservation: nothing written
    assert await deps.store.reservations() is None
    queue._shared_reservations = None  # say, a new leader: it writes what it reserves
    await queue.run_cycle(full=True)
    shared = await deps.store.reservations()
    assert shared is not None and shared.domains == {"big": ["d1"]}


@pytest.mark.parametrize("defrag", ["on", "off"])
async def test_the_cycle_places_for_the_planner_only_while_it_defragments(
    nats_url: str, redis_url: str, namespace: str, defrag: str
) -> None:
    settings = Settings(prefix=namespace, defrag=defrag)
    async with namespace_deps(settings, nats_url, redis_url, clock=lambda: NOW) as d:
        assert QueueService(d).scheduler.policy.pin_aware is (defrag == "on")
        assert MigrationService(d).policy.pin_aware is (defrag == "on")


@pytest.mark.parametrize("failover", [False, True])
async def test_the_queue_lends_a_reservations_held_nodes_and_takes_them_back(
    nats_url: str, redis_url: str, namespace: str, failover: bool
) -> None:
    """As `rackscale sim` does by default: a checkpointable gang of 4+ nodes borrows a reservation's held nodes
    although it would outlast the start; the reserved job preempts it (checkpointed) once it fits without it.
    `failover`: another replica leads the second cycle and takes the loan back from the memory the first left."""
    clock = [NOW]
    nodes = {f"n{i}": "d0" for i in range(6)}
    async with service_deps(nats_url, redis_url, namespace, nodes, clock=lambda: clock[0]) as deps:
        await _running(deps, "long", "n0", 3600.0)
        await _running(deps, "short", "n1", 60.0)
        big = JobBody(name="big", tenant="t", gpus=20, gpus_per_node=4, topology=TopologyBody(nvlink="required"))
        loan = JobBody(name="loan", tenant="t", gpus=16, gpus_per_node=4, duration_s=36000.0, checkpointable=True)
        await deps.store.put_job(JobRecord(id="big", spec=big, submitted_at=NOW), new=True)
        await deps.store.put_job(JobRecord(id="loan", spec=loan, submitted_at=NOW + 1), new=True)
        queue = QueueService(deps)
        assert queue.scheduler.lend
        assert await queue._lead()
        await queue.run_cycle(full=True)
        rec = await deps.store.get_job("big")
        assert rec is not None and rec.state is JobState.PENDING and "reserved" in rec.reason, rec
        lent = await deps.store.get_job("loan")  # on the held nodes n2-n5 (n1 frees at NOW + 60)
        assert lent is not None and lent.inflight_since is not None, lent
        assert sorted(ng.node for ng in lent.allocation) == ["n2", "n3", "n4", "n5"], lent.allocation
        assert queue.scheduler.lent == {"loan": frozenset({"big"})}

        # placement committed the loan and it runs; then `short` ends and big fits without the borrower
        lent.state, lent.inflight_since, lent.started_at = JobState.RUNNING, None, NOW
        await deps.store.put_job(lent)
        commit = AllocationRecord(job_id="loan", attempt=lent.attempt, nodes=lent.allocation, committed_at=NOW)
        assert (await deps.store.commit(commit)).ok
        assert await deps.store.release("short")
        await deps.store.update_job("short", lambda r: _ended(r, NOW + 60))
        clock[0] = NOW + 61
        if failover:
            await deps.store.r.delete(deps.names.queue_leader_key)  # the first leader is gone
            queue = QueueService(deps)
            assert await queue._lead()
        await queue.run_cycle(full=True)
        back = await deps.store.get_job("loan")
        assert (
            back is not None
            and back.state is JobState.PENDING
            and back.reason == "requeued after preemption for job big"
        ), back
        rec = await deps.store.get_job("big")
        assert rec is not None and rec.inflight_since is not None, rec
        assert sorted(ng.node for ng in rec.allocation) == ["n1", "n2", "n3", "n4", "n5"], rec.allocation
        assert queue.scheduler.lent == {}


def _ended(rec: JobRecord, at: float) -> JobRecord:
    rec.state, rec.ended_at, rec.updated_at = JobState.SUCCEEDED, at, at
    return rec


@pytest.mark.parametrize(("lend", "min_nodes", "lends"), [("auto", 4, True), ("off", 4, False), ("on", 8, True)])
async def test_the_queue_lends_as_its_settings_say(
    nats_url: str, redis_url: str, namespace: str, lend: str, min_nodes: int, lends: bool
) -> None:
    settings = Settings(prefix=namespace, lend_reserved=lend, lend_min_nodes=min_nodes)
    async with namespace_deps(settings, nats_url, redis_url, clock=lambda: NOW) as d:
        scheduler = QueueService(d).scheduler
        assert scheduler.lend is lends  # auto: rackscale's choice, which lends
        assert scheduler.config.lend_min_nodes == min_nodes
