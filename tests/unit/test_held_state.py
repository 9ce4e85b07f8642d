"""The queue's cycle state kept between cycles (`shared.held.HeldState`) against `occupy_held` from scratch.

A random walk over what the queue's views hold (allocations, job records, ended jobs, topology and health)
syncs one HeldState at every step and compares it with `occupy_held` on a fresh copy of the same empty state:
free GPUs, counts, pinned nodes and every allocation's fields. Records change the way the queue's views change
them: a new object when something changed, the same object otherwise.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from shared.core import ClusterState, Topology
from shared.core.topology import GpuState, Health, NodeState
from shared.held import HeldState, occupy_held
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, MoveTicket, NodeGpus

TOPO = Topology.uniform(3, nodes_per_domain=4, gpus_per_node=4)


def _body(job: str, gpus: int, rng: random.Random) -> JobBody:
    return JobBody(
        name=job,
        tenant=rng.choice(["a", "b"]),
        gpus=gpus,
        priority=rng.randrange(3),
        checkpointable=rng.random() < 0.5,
        duration_s=rng.choice([60.0, 600.0]),
    )


def _free_nodes(used: dict[str, set[int]], rng: random.Random, gpus: int) -> list[NodeGpus] | None:
    """GPUs nobody holds (in the walk's own bookkeeping), on one or two nodes."""
    names = list(TOPO.node_names)
    rng.shuffle(names)
    out: list[NodeGpus] = []
    need = gpus
    for name in names[:2]:
        free = [g for g in range(4) if g not in used.get(name, set())]
        take = free[: min(len(free), need if len(out) else max(1, need // 2))]
        if take:
            out.append(NodeGpus(name, take))
            need -= len(take)
        if need <= 0:
            break
    return out if need <= 0 and out else None


def _view(state: ClusterState, now: float) -> object:
    allocs = {
        k: (a.nodes, a.masks, a.priority, a.tenant, a.checkpointable, a.gpus, a.start, max(a.expected_end, now))
        for k, a in state.allocs.items()
    }
    return (state.free, state.nfree, state.count, state.node_jobs, state.pins, state.pinned_in, allocs)


class Walk:
    """What the queue's views hold, changed one step at a time."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.allocs: dict[str, AllocationRecord] = {}
        self.jobs: dict[str, JobRecord] = {}
        self.ended: dict[str, JobRecord] = {}
        self.used: dict[str, set[int]] = {}
        self.base = ClusterState(TOPO)
        self.now = 1000.0
        self.n = 0
        self.touched: set[str] = set()  # jobs whose allocation or record changed since `take_touched`

    def take_touched(self) -> set[str]:
        touched, self.touched = self.touched, set()
        return touched

    def _take(self, nodes: list[NodeGpus]) -> None:
        for ng in nodes:
            self.used.setdefault(ng.node, set()).update(ng.gpus)

    def _give(self, nodes: list[NodeGpus]) -> None:
        for ng in nodes:
            self.used.get(ng.node, set()).difference_update(ng.gpus)

    def step(self) -> str:
        before = (dict(self.allocs), dict(self.jobs), dict(self.ended))
        what = self._step()
        for now, was in zip((self.allocs, self.jobs, self.ended), before, strict=True):
            self.touched |= {j for j in now.keys() | was.keys() if now.get(j) is not was.get(j)}
        return what

    def _step(self) -> str:
        rng = self.rng
        self.now += rng.choice([0.0, 1.0, 30.0, 700.0])
        roll = rng.random()
        running = [j for j, r in self.jobs.items() if r.state in (JobState.PLACED, JobState.RUNNING) and j[0] != "l"]
        if roll < 0.35 or not running:
            self.n += 1
            job = f"j{self.n}"
            gpus = rng.choice([1, 2, 4, 6])
            nodes = _free_nodes(self.used, rng, gpus)
            if nodes is None:
                return "full"
            self._take(nodes)
            placed = rng.random() < 0.3
            self.jobs[job] = JobRecord(
                id=job,
                spec=_body(job, sum(len(ng.gpus) for ng in nodes), rng),
                state=JobState.PLACED if placed else JobState.RUNNING,
                attempt=1,
                allocation=nodes,
                started_at=None if placed else self.now - rng.choice([0.0, 100.0, 5000.0]),
            )
            if rng.random() < 0.9:  # else: its Committed event not seen yet (held by its record only)
                self.allocs[job] = AllocationRecord(job_id=job, attempt=1, nodes=nodes, committed_at=self.now)
            return "start"
        job = rng.choice(running)
        rec = self.jobs[job]
        if roll < 0.5:  # ends; its release may still be on its way
            del self.jobs[job]
            if job in self.allocs and rng.random() < 0.5:
                self.ended[job] = msgspec.structs.replace(rec, state=JobState.SUCCEEDED)
            else:
                self.allocs.pop(job, None)
                self._give(rec.allocation)
            return "end"
        if roll < 0.58:  # a release lands for an ended job
            if self.ended:
                gone = rng.choice(sorted(self.ended))
                self._give(self.ended.pop(gone).allocation)
                self.allocs.pop(gone, None)
            return "released"
        if roll < 0.68:  # placed → running, or a change that doesn't touch the state (the reason)
            if rec.state is JobState.PLACED:
                self.jobs[job] = msgspec.structs.replace(rec, state=JobState.RUNNING, started_at=self.now)
            else:
                self.jobs[job] = msgspec.structs.replace(rec, reason="x")
            return "change"
        if roll < 0.75:  # the commit event arrives (or a full read brings an equal record, a new object)
            self.allocs[job] = AllocationRecord(job_id=job, attempt=rec.attempt, nodes=rec.allocation, committed_at=0)
            return "commit"
        if roll < 0.82:  # starts migrating: its target GPUs are held too
            target = _free_nodes(self.used, rng, rec.spec.gpus)
            if target is None:
                return "no target"
            self._take(target)
            move = MoveTicket(migration_id="m", target=target, reason="test", since=self.now)
            self.jobs[job] = msgspec.structs.replace(rec, state=JobState.MIGRATING, move=move)
            return "migrate"
        if roll < 0.83:  # a lagging view: a record that names GPUs another job holds
            other = rng.choice(running)
            self.n += 1
            lag = f"lag{self.n}"
            nodes = self.jobs[other].allocation
            self.jobs[lag] = JobRecord(id=lag, spec=_body(lag, 1, rng), state=JobState.RUNNING, allocation=nodes)
            return "overlap"
        if roll < 0.92:  # the overlap goes away
            for j in [j for j in self.jobs if j[0] == "l"]:
                del self.jobs[j]
            return "overlap gone"
        if roll < 0.95:  # a new topology generation: a node down, a GPU down or degraded
            name = rng.choice(TOPO.node_names)
            health = Health(
                {name: NodeState.DOWN} if rng.random() < 0.5 else {},
                {(rng.choice(TOPO.node_names), rng.randrange(4)): rng.choice([GpuState.DOWN, GpuState.DEGRADED])},
            )
            self.base = ClusterState(TOPO, health)
            return "health"
        return "idle"


@pytest.mark.parametrize("seed", range(12))
def test_a_kept_state_is_the_state_built_from_scratch(seed: int) -> None:
    """Both ways of syncing: a pass over every id (`changed=None`) and only the jobs that changed."""
    walk = Walk(seed)
    scan, diff = HeldState(), HeldState()
    steps: list[str] = []
    for _ in range(400):
        steps.append(walk.step())
        fresh = walk.base.copy()
        held = occupy_held(fresh, list(walk.allocs.values()), walk.jobs, walk.now, ended=walk.ended)
        assert held == set(walk.allocs)
        for held_state, changed in ((scan, None), (diff, walk.take_touched())):
            got = held_state.sync(walk.base, walk.allocs, walk.jobs, walk.now, walk.ended, changed)
            assert _view(got, walk.now) == _view(fresh, walk.now), (changed, steps[-5:])
            got.check()
            # the copy handed out is the cycle's to change: the next sync must not see it
            for key in list(got.allocs)[:3]:
                got.release(key)
    kinds = set(steps)
    assert {"start", "end", "released", "change", "commit", "migrate", "overlap", "health"} <= kinds, kinds
    # most syncs applied differences: rebuilds come only with a new topology or an overlap
    assert scan.rebuilds < len(steps) / 2 and diff.rebuilds < len(steps) / 2


def test_unchanged_views_rebuild_nothing_and_an_unstarted_job_moves_with_now() -> None:
    nodes = [NodeGpus(TOPO.node_names[0], [0, 1])]
    rec = JobRecord(id="p", spec=JobBody(name="p", tenant="a", gpus=2, duration_s=600.0), state=JobState.PLACED)
    rec = msgspec.structs.replace(rec, allocation=nodes, attempt=1)
    alloc = AllocationRecord(job_id="p", attempt=1, nodes=nodes, committed_at=0.0)
    base = ClusterState(TOPO)
    held_state = HeldState()
    first = held_state.sync(base, {"p": alloc}, {"p": rec}, 100.0)
    second = held_state.sync(base, {"p": alloc}, {"p": rec}, 160.0, changed=set())
    assert held_state.rebuilds == 1
    assert (first.allocs["p"].start, second.allocs["p"].start) == (100.0, 160.0)
    assert second.allocs["p"].expected_end - second.allocs["p"].start == first.allocs["p"].expected_end - 100.0
    # a job that ended and was released leaves the state; a new base (health changed) rebuilds it
    empty = held_state.sync(base, {}, {}, 170.0, changed={"p"})
    assert empty.free == base.free and held_state.rebuilds == 1
    held_state.sync(ClusterState(TOPO), {}, {}, 180.0, changed=set())
    assert held_state.rebuilds == 2
