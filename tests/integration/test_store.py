"""The commit and release scripts against a real Redis/Valkey: each test twice, on the session's server (embedded,
or RACKSCALE_REDIS_URL) and on a Valkey Cluster of three primaries, where every key of a cell is in one slot."""

from __future__ import annotations

import msgspec
import pytest
from redis.crc import key_slot

from shared.schemas import (
    AllocationRecord,
    JobBody,
    JobRecord,
    JobState,
    MigrationRecord,
    NodeGpus,
    NodeHealthState,
    NodeRecord,
    Reservations,
)
from shared.store import ViewMark
from tests.integration.conftest import open_store
from tests.servers import snapshot, swap_in

pytestmark = pytest.mark.asyncio


@pytest.fixture(params=["server", "cluster"])
def redis_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    # the cluster starts only when a cluster case runs (`-k server` leaves it off)
    return redis_url if request.param == "server" else str(request.getfixturevalue("redis_cluster_url"))


def _rec(job: str, attempt: int, gpus: list[int]) -> AllocationRecord:
    return AllocationRecord(job_id=job, attempt=attempt, nodes=[NodeGpus("d00-n00", gpus)], committed_at=0.0)


async def test_a_released_attempt_never_commits_again(redis_url: str, namespace: str) -> None:
    store = await open_store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("j", 1, [0, 1]))).ok
        assert (await store.commit(_rec("j", 1, [0, 1]))).duplicate  # a redelivered order is a no-op
        assert await store.release("j")
        assert not await store.release("j")  # idempotent
        late = await store.commit(_rec("j", 1, [2, 3]))  # the same order redelivered after the job ended
        assert not late.ok and late.reason.startswith("stale"), late
        assert await store.gpu_owners("d00-n00") == {}
        assert (await store.commit(_rec("j", 2, [2, 3]))).ok  # a requeued job's next attempt still can
        assert await store.gpu_owners("d00-n00") == {2: "j", 3: "j"}
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_a_release_of_an_allocation_read_before_a_newer_commit_frees_nothing(
    redis_url: str, namespace: str
) -> None:
    # placement reads the allocation, then releases it: if the job's attempt 1 was released and attempt 2
    # committed in between, the release of what it read must leave attempt 2's GPUs and record alone
    store = await open_store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("j", 1, [0, 1]))).ok
        read = await store.allocation("j")
        assert read is not None and await store.release("j")
        assert (await store.commit(_rec("j", 2, [2, 3]))).ok
        assert not await store.release("j", read)
        assert await store.gpu_owners("d00-n00") == {2: "j", 3: "j"}
        assert (held := await store.allocation("j")) is not None and held.attempt == 2
        assert await store.release("j", held)
        assert await store.gpu_owners("d00-n00") == {} and await store.allocation("j") is None
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_commit_refuses_taken_gpus_and_unusable_nodes(redis_url: str, namespace: str) -> None:
    store = await open_store(redis_url, namespace)
    try:
        assert (await store.commit(_rec("a", 1, [0]))).ok
        clash = await store.commit(_rec("b", 1, [0, 1]))
        assert not clash.ok and clash.reason.startswith("gpu_taken"), clash
        assert await store.gpu_owners("d00-n00") == {0: "a"}  # nothing of b's was written
        await store.put_node(NodeRecord(name="d00-n00", domain="d00", state="draining"))
        drained = await store.commit(_rec("c", 1, [3]))
        assert not drained.ok and drained.reason.startswith("node_unavailable"), drained
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_a_leader_lease_has_one_holder_and_passes_on_when_it_lapses(redis_url: str, namespace: str) -> None:
    store = await open_store(redis_url, namespace)
    key = store.names.queue_leader_key
    try:
        assert await store.hold_lease(key, "a", 5.0)
        assert not await store.hold_lease(key, "b", 5.0)  # a holds it
        await store.r.pexpire(key, 100_000)
        assert await store.hold_lease(key, "a", 5.0)  # renewed by its holder, to the lease's length
        assert 0 < await store.r.pttl(key) <= 5_000
        await store.r.delete(key)  # a's lease lapsed
        assert await store.hold_lease(key, "b", 5.0)
        assert not await store.hold_lease(key, "a", 5.0)
        assert await store.r.get(key) == b"b"
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_the_undecided_set_follows_each_job_write(redis_url: str, namespace: str) -> None:
    store = await open_store(redis_url, namespace)
    n = store.names

    async def undecided() -> set[str]:
        return {m.decode() for m in await store.r.smembers(n.undecided_jobs_key)}

    try:
        assert not await store.undecided_job_ids()
        await store.put_job(JobRecord(id="a", spec=JobBody(name="a", tenant="t", gpus=4)), new=True)
        await store.put_job(JobRecord(id="b", spec=JobBody(name="b", tenant="t", gpus=4)), new=True)
        assert await store.undecided_job_ids() == await undecided() == {"a", "b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, inflight_since=1.0))  # ordered
        assert await undecided() == {"b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, inflight_since=None))  # rejected: back
        assert await undecided() == {"a", "b"}
        await store.update_job("a", lambda r: msgspec.structs.replace(r, state=JobState.RUNNING))
        await store.update_job("b", lambda r: msgspec.structs.replace(r, state=JobState.CANCELLED))
        assert not await store.undecided_job_ids()
        assert {m.decode() for m in await store.r.smembers(n.active_jobs_key)} == {"a"}
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_a_position_is_never_recorded_onto_a_stale_copy(redis_url: str, namespace: str) -> None:
    """The queue reads its consumers' positions, then the view's clock; a copy taken before the writes those
    positions count (a replica behind, promoted) is swapped in before the position is recorded: the record is
    refused and the view marked behind, so the next cycle catches it up from the copy's own position (it
    once recorded the live position onto the copy, and the copy's missing writes were never made again)."""
    store = await open_store(redis_url, namespace)
    spec = JobBody(name="j", tenant="t", gpus=4)
    try:
        await store.create_job(JobRecord(id="early", spec=spec))
        assert await store.record_view(ViewMark(1, 1))
        copy = await snapshot(store.r, store.names.key_pattern)
        await store.create_job(JobRecord(id="late", spec=spec))  # the write the position 2 counts
        await store.see_view_clock()
        assert await store.record_view(ViewMark(2, 2))  # on the live view: recorded
        await swap_in(store.r, store.names.key_pattern, copy)
        await store.see_view_clock()  # the copy's clock is older than the one seen: nothing newer is taken in
        assert not await store.record_view(ViewMark(3, 3))
        assert await store.view_status() == ("behind", ViewMark(1, 1))
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()


async def test_every_other_read_and_write_of_a_cell(redis_url: str, namespace: str) -> None:
    """The store's families the tests above don't reach: node reads (a pipelined MGET), heartbeats, health states
    (MSET), reservations, job listing and restoring (pipelines), allocation restoring (MULTI/EXEC) and reads (a
    script over many keys), moves. On a cluster they all reach the cell's one slot, whose keys are all there."""
    store = await open_store(redis_url, namespace)
    n = store.names
    spec = JobBody(name="j", tenant="t", gpus=4)
    try:
        await store.put_node(NodeRecord(name="d00-n01", domain="d00", last_heartbeat=5.0))
        await store.touch_nodes({"d00-n00": 10.0, "d00-n01": 3.0})  # GT: n01 keeps its later beat
        got = await store.get_nodes(["d00-n01", "nope", "d00-n00"])
        assert [r.last_heartbeat if r else None for r in got] == [5.0, None, 10.0]
        assert [r.name for r in await store.nodes()] == ["d00-n00", "d00-n01"]
        assert await store.node_states(["d00-n00", "nope"]) == ["up", None]
        assert await store.silent_nodes(before=6.0) == ["d00-n01"]
        assert await store.topology_generation() == 2
        await store.put_health_states({"d00-n00": NodeHealthState(), "d00-n01": NodeHealthState()})
        health = await store.nodes_with_health(["d00-n00", "nope"])
        assert health["d00-n00"][1] == NodeHealthState() and health["nope"] == (None, None)
        await store.delete_health_state("d00-n01")
        assert (await store.nodes_with_health(["d00-n01"]))["d00-n01"][1] is None
        await store.put_reservations(Reservations(at=1.0, reserved=["a"]))
        assert await store.reservations() == Reservations(at=1.0, reserved=["a"])

        jobs = [JobRecord(id=f"j{i}", spec=spec, submitted_at=float(i)) for i in range(3)]
        await store.restore_jobs([*jobs[:2], msgspec.structs.replace(jobs[2], state=JobState.SUCCEEDED)])
        assert await store.active_job_ids() == ["j0", "j1"] and await store.undecided_job_ids() == {"j0", "j1"}
        page, total = await store.list_jobs(state=JobState.PENDING, offset=1, limit=5)
        assert ([r.id for r in page], total) == (["j1"], 2)
        assert [r.id for r in await store.get_jobs(["j2", "nope", "j0"])] == ["j2", "j0"]

        held = {j: _rec(j, 1, [g]) for j, g in (("j0", 0), ("j1", 1))}
        await store.restore_allocations(held, {"j0": 1, "j1": 1, "j2": 3})
        assert sorted(a.job_id for a in await store.allocations()) == ["j0", "j1"]
        assert await store.gpu_owners("d00-n00") == {0: "j0", 1: "j1"}
        assert not (await store.commit(_rec("j2", 3, [2]))).ok  # the floor restored with it
        await store.restore_allocations({"j1": held["j1"]}, {})  # j0's goes, j1's stays
        assert [a.job_id for a in await store.allocations()] == ["j1"]
        assert await store.gpu_owners("d00-n00") == {1: "j1"}

        for i, at in enumerate((1.0, 2.0)):
            move = MigrationRecord(
                id=f"m{i}", job_id="j1", tenant="t", kind="defrag", why="", attempt=1, source=[], target=[]
            )
            await store.put_migration(msgspec.structs.replace(move, created_at=at))
        page_m, total_m = await store.list_migrations(job_id="j1")
        assert ([m.id for m in page_m], total_m) == (["m1", "m0"], 2)

        keys = [k async for k in store.r.scan_iter(n.key_pattern)]
        assert len(keys) >= 20 and {key_slot(k) for k in keys} == {key_slot(n.cell.encode())}
    finally:
        await store.r.delete(*[k async for k in store.r.scan_iter(store.names.key_pattern)])
        await store.close()
