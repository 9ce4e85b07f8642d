"""The migration planner's choices on hand-made fleets, with the expected moves written out.

Fleets are NVL72-like (18 nodes x 4 GPUs per domain); jobs hold whole nodes unless said otherwise. Node
names read ``d02-n05``: domain 2, node 5.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from shared.core import (
    Allocation,
    ClusterState,
    JobSpec,
    MigrationBudget,
    Movable,
    Plan,
    Topology,
    get_policy,
    plan_defrag,
    plan_evacuation,
)
from shared.core.migration import natural_wait
from shared.core.shape import request

ALL = 0b1111
HOUR = 3600.0
POLICY = get_policy("rackscale")


class Fleet:
    """A ClusterState plus the specs of its running jobs, built job by job."""

    def __init__(self, domains: int) -> None:
        self.topo = Topology.uniform(domains, 18, 4)
        self.state = ClusterState(self.topo)
        self.specs: dict[str, JobSpec] = {}

    def run(
        self,
        job_id: str,
        domain: int,
        nodes: Iterable[int],
        *,
        ckpt: bool = True,
        end: float = 100 * HOUR,
        segment: int | None = None,
        spread: Iterable[tuple[int, Iterable[int]]] = (),
    ) -> None:
        """Job on `nodes` of `domain` (and on `spread`: more (domain, nodes) pairs)."""
        idx = [domain * 18 + n for n in nodes]
        for d, ns in spread:
            idx += [d * 18 + n for n in ns]
        spec = JobSpec(job_id, 4 * len(idx), checkpointable=ckpt, segment=segment, expected_runtime_s=end)
        self.specs[job_id] = spec
        self.state.allocate(Allocation(job_id, tuple(idx), (ALL,) * len(idx), checkpointable=ckpt, expected_end=end))

    def movable(self, ckpt_s: float = 60.0) -> dict[str, Movable]:
        return {j: Movable(s, ckpt_s, ckpt_s) for j, s in self.specs.items() if s.checkpointable}

    def names(self, nodes: Iterable[int]) -> list[str]:
        return [self.topo.node_names[n] for n in nodes]

    def snapshot(self) -> tuple[object, ...]:
        s = self.state
        return (list(s.free), [list(map(list, lvl)) for lvl in s.count], list(s.usable), sorted(s.allocs))


def scattered() -> Fleet:
    """18 free nodes in three pieces of 6 (d00, d01, d02); d03 full. Only d02 can be emptied to 16 free:
    d00 and d01 hold jobs that can't checkpoint, and d02's jobs d and e (5 nodes each) fit the 6-node
    holes of d00 and d01."""
    f = Fleet(4)
    f.run("a", 0, range(0, 2))
    f.run("b", 0, range(2, 4))
    f.run("x0", 0, range(4, 12), ckpt=False)
    f.run("c", 1, range(0, 6))
    f.run("x1", 1, range(6, 12), ckpt=False)
    f.run("d", 2, range(0, 5))
    f.run("e", 2, range(5, 10))
    f.run("f", 2, range(10, 12))
    f.run("x3", 3, range(0, 18), ckpt=False)
    return f


BIG = JobSpec("big", 64, expected_runtime_s=10 * HOUR, submit_time=0.0)  # 16 nodes, required: one domain


def test_defrag_scattered_free_nodes_fewest_moves() -> None:
    f = scattered()
    before = f.snapshot()
    plan = plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), now=0.0)
    assert plan is not None and plan.beneficiary == "big" and plan.complete
    # two moves: d and e out of d02, into the two 6-node holes (lowest index first)
    assert [(m.job_id, f.names(m.src.nodes), f.names(m.dst.nodes)) for m in plan.moves] == [
        ("d", [f"d02-n{i:02d}" for i in range(0, 5)], [f"d00-n{i:02d}" for i in range(12, 17)]),
        ("e", [f"d02-n{i:02d}" for i in range(5, 10)], [f"d01-n{i:02d}" for i in range(12, 17)]),
    ]
    assert plan.cost_gpu_s == pytest.approx(2 * 20 * 120.0)
    # the wait it saves: the first 16-node run would free up when the running jobs end, 100 h from now
    assert plan.gain_gpu_s == pytest.approx(64 * 100 * HOUR)
    assert "d02" in plan.why
    # pure: the state is exactly as it was
    assert f.snapshot() == before
    f.state.check()
    # applying the moves makes the job fit
    for m in plan.moves:
        f.state.release(m.job_id)
        f.state.allocate(m.allocation())
    placed = POLICY.place(f.state, request(BIG, f.topo), _ctx())
    assert placed is not None
    assert {f.topo.node_names[n][:3] for n in placed.nodes} == {"d02"}


def _ctx():  # type: ignore[no-untyped-def]
    from shared.core import Context

    return Context(now=0.0, job_end=10 * HOUR, demand=frozenset({16}))


def test_defrag_is_deterministic() -> None:
    plans = [plan_defrag(scattered().state, [BIG], scattered().movable(), POLICY, MigrationBudget(), 0.0)]
    f = scattered()
    plans.append(plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0))
    assert plans[0] is not None and plans[1] is not None
    assert [(m.job_id, m.dst) for m in plans[0].moves] == [(m.job_id, m.dst) for m in plans[1].moves]


def test_defrag_not_worth_it_when_the_wait_is_short() -> None:
    f = Fleet(4)
    # same layout, but everything in d02 ends in 10 s: 64 GPUs x 10 s waiting < 2 moves x 20 GPUs x 120 s
    for jid, d, ns, ck in [
        ("a", 0, range(0, 2), True),
        ("x0", 0, range(2, 12), False),
        ("x1", 1, range(0, 12), False),
        ("d", 2, range(0, 5), True),
        ("e", 2, range(5, 10), True),
        ("f", 2, range(10, 12), True),
        ("x3", 3, range(0, 18), False),
    ]:
        f.run(jid, d, ns, ckpt=ck, end=10.0)
    assert natural_wait(f.state, request(BIG, f.topo), 0.0) == pytest.approx(10.0)
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0) is None
    # and with a cheap enough move (no checkpoint time) it goes ahead
    assert plan_defrag(f.state, [BIG], f.movable(ckpt_s=0.01), POLICY, MigrationBudget(), 0.0) is not None


def test_defrag_budget_limits() -> None:
    f = scattered()
    # the one workable domain needs two moves: one move in flight leaves room for only one
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(max_moves=2, in_flight=1), 0.0) is None
    # GPU-seconds of moving per hour nearly spent
    tight = MigrationBudget(gpu_s_per_hour=10_000.0, spent_gpu_s=6_000.0)
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, tight, 0.0) is None
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(gpu_s_per_hour=10_000.0), 0.0) is not None


def two_domain_job_fleet() -> Fleet:
    """d02 and d04 each hold one movable 10-node job and 8 free nodes; d05 and d06 have 10-node holes."""
    f = Fleet(7)
    f.run("x0", 0, range(0, 18), ckpt=False)
    f.run("x1", 1, range(0, 18), ckpt=False)
    f.run("p", 2, range(0, 10))
    f.run("x3", 3, range(0, 18), ckpt=False)
    f.run("q", 4, range(0, 10))
    f.run("x5", 5, range(0, 8), ckpt=False)
    f.run("x6", 6, range(0, 8), ckpt=False)
    return f


PAIR = JobSpec("pair", 128, segment=16, expected_runtime_s=10 * HOUR)  # two 16-node segments


def test_defrag_two_segments_empties_two_domains() -> None:
    f = two_domain_job_fleet()
    plan = plan_defrag(f.state, [PAIR], f.movable(), POLICY, MigrationBudget(), 0.0)
    assert plan is not None and plan.complete
    assert [(m.job_id, f.names(m.dst.nodes)[0], f.names(m.dst.nodes)[-1]) for m in plan.moves] == [
        ("p", "d05-n08", "d05-n17"),
        ("q", "d06-n08", "d06-n17"),
    ]


def test_defrag_staged_empties_whole_domains_first() -> None:
    f = two_domain_job_fleet()
    plan = plan_defrag(f.state, [PAIR], f.movable(), POLICY, MigrationBudget(max_moves=1), 0.0)
    assert isinstance(plan, Plan) and not plan.complete
    assert [m.job_id for m in plan.moves] == ["p"]  # d02 now, d04 later
    assert plan.cost_gpu_s == pytest.approx(2 * 40 * 120.0)  # the whole plan's cost was weighed
    assert "later: d04" in plan.why


def test_defrag_never_moves_a_job_spanning_domains() -> None:
    f = Fleet(3)
    # the only job that could make room in d00 or d01 spans both (two 4-node segments)
    f.run("span", 0, range(0, 4), segment=4, spread=[(1, range(0, 4))])
    f.run("x0", 0, range(4, 10), ckpt=False)
    f.run("x1", 1, range(4, 10), ckpt=False)
    f.run("x2", 2, range(0, 18), ckpt=False)
    assert f.state.count[0][0][4] >= 16
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0) is None


def test_defrag_leaves_jobs_that_fit_or_can_spill_to_the_cycle() -> None:
    f = Fleet(2)
    f.run("a", 0, range(0, 4))
    fits = JobSpec("fits", 64)
    spill = JobSpec("small", 4, nvlink="none")
    assert plan_defrag(f.state, [fits, spill], f.movable(), POLICY, MigrationBudget(), 0.0) is None


def test_evacuation_in_place_on_a_spare() -> None:
    f = Fleet(2)
    f.run("g", 0, range(0, 16))  # d00-n16 and n17 are spares
    f.state.set_usable(3, False)  # d00-n03 fails
    before = f.snapshot()
    ev = plan_evacuation(f.state, {3: ALL}, f.movable(), POLICY, 0.0)
    assert ev.requeue == ()
    (m,) = ev.moves
    assert m.job_id == "g" and m.in_place
    expected = [f"d00-n{i:02d}" for i in range(16)]
    expected[3] = "d00-n16"
    assert f.names(m.dst.nodes) == expected
    assert "in place" in ev.why["g"]
    assert f.snapshot() == before


def test_evacuation_without_spare_replaces_the_job_in_one_domain() -> None:
    f = Fleet(2)
    f.run("g", 0, range(0, 16))
    f.run("x", 0, range(16, 18), ckpt=False)
    f.state.set_usable(3, False)
    ev = plan_evacuation(f.state, {3: ALL}, f.movable(), POLICY, 0.0)
    (m,) = ev.moves
    assert not m.in_place
    assert f.names(m.dst.nodes) == [f"d01-n{i:02d}" for i in range(16)]
    assert m.domains(f.topo) == ("d01",)


def test_evacuation_requeues_what_cant_checkpoint_or_go_anywhere() -> None:
    f = Fleet(1)
    f.run("nock", 0, range(0, 2), ckpt=False)
    f.run("big", 0, range(2, 18))  # no spare left in the only domain, nowhere else to go
    f.state.set_usable(0, False)
    f.state.set_usable(2, False)
    ev = plan_evacuation(f.state, {0: ALL, 2: ALL}, f.movable(), POLICY, 0.0)
    assert ev.moves == ()
    assert ev.requeue == ("big", "nock")
    assert "not checkpointable" in ev.why["nock"]


def test_evacuation_of_a_failed_gpu_moves_the_rank_to_spare_gpus_of_another_node() -> None:
    f = Fleet(1)
    f.run("g", 0, range(0, 4))
    # GPU 2 of d00-n01 fails; the node's other GPUs stay in the job's hands until it moves
    ev = plan_evacuation(f.state, {1: 0b0100}, f.movable(), POLICY, 0.0)
    (m,) = ev.moves
    assert f.names(m.dst.nodes) == ["d00-n00", "d00-n04", "d00-n02", "d00-n03"]


def test_degraded_gpu_moves_only_when_there_is_room() -> None:
    f = Fleet(1)
    f.run("g", 0, range(0, 18))
    ev = plan_evacuation(f.state, {}, f.movable(), POLICY, 0.0, degraded={5: 0b0001})
    assert ev.moves == () and ev.requeue == ()  # keeps running on the degraded GPU


def segmented_spanning_fleet() -> Fleet:
    """d02 has 14 free nodes and one 4-node segment of job `seg`, whose other segment is in d03; d01 has a
    6-node hole; everything else holds jobs that can't checkpoint."""
    f = Fleet(4)
    f.run("x0", 0, range(0, 18), ckpt=False)
    f.run("x1", 1, range(0, 12), ckpt=False)
    f.run("seg", 2, range(0, 4), segment=4, spread=[(3, range(0, 4))])
    f.run("x3", 3, range(4, 18), ckpt=False)
    return f


def test_defrag_moves_whole_segments_of_a_spanning_job_when_allowed() -> None:
    f = segmented_spanning_fleet()
    assert plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0) is None
    plan = plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(segments=True), 0.0)
    assert plan is not None and plan.complete
    (m,) = plan.moves
    # the d02 segment goes to d01's hole; the d03 segment keeps its GPUs; the whole job pays the pause
    assert f.names(m.dst.nodes) == ["d01-n12", "d01-n13", "d01-n14", "d01-n15"] + [f"d03-n{i:02d}" for i in range(4)]
    assert m.cost_gpu_s == pytest.approx(32 * 120.0)
    assert "the rest stay" in m.reason
    f.state.check()


def two_cheap_domains() -> Fleet:
    """d00 and d01 are equally cheap to empty to 16 nodes (one 5-node checkpointable job each, a and b,
    beside 2 pinned nodes); d02 and d03 hold jobs that can't checkpoint on n00-n11 (6-node holes)."""
    f = Fleet(4)
    f.run("a", 0, range(0, 5))
    f.run("x0", 0, range(5, 7), ckpt=False)
    f.run("b", 1, range(0, 5))
    f.run("x1", 1, range(5, 7), ckpt=False)
    f.run("x2", 2, range(0, 12), ckpt=False)
    f.run("x3", 3, range(0, 12), ckpt=False)
    return f


def _moves(f: Fleet, plan: Plan | None) -> list[tuple[str, list[str], list[str]]]:
    assert plan is not None
    return [(m.job_id, f.names(m.src.nodes), f.names(m.dst.nodes)) for m in plan.moves]


def test_defrag_empties_the_domains_the_jobs_reservation_holds_first() -> None:
    f = two_cheap_domains()
    a_out = ("a", [f"d00-n{i:02d}" for i in range(5)], [f"d02-n{i:02d}" for i in range(12, 17)])
    b_out = ("b", [f"d01-n{i:02d}" for i in range(5)], [f"d02-n{i:02d}" for i in range(12, 17)])
    # no reservation: the lowest index of the equally cheap domains
    assert _moves(f, plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0)) == [a_out]
    # big's reservation holds d01: room made there stays big's (the cycle keeps backfill out of it)
    promised = {"big": frozenset({1})}
    plan = plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0, promised=promised)
    assert _moves(f, plan) == [b_out]


def test_defrag_keeps_moved_jobs_off_other_reservations() -> None:
    """As above, and another job's reservation holds d02: b goes to d03's hole instead of d02's."""
    f = two_cheap_domains()
    promised = {"big": frozenset({1}), "other": frozenset({2})}
    plan = plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0, promised=promised)
    assert _moves(f, plan) == [("b", [f"d01-n{i:02d}" for i in range(5)], [f"d03-n{i:02d}" for i in range(12, 17)])]
    # when only a reserved domain has room (d00 and d03 fill up), the move still goes there
    f.run("y0", 0, range(7, 18), ckpt=False)
    f.run("y3", 3, range(12, 18), ckpt=False)
    plan = plan_defrag(f.state, [BIG], f.movable(), POLICY, MigrationBudget(), 0.0, promised=promised)
    assert _moves(f, plan) == [("b", [f"d01-n{i:02d}" for i in range(5)], [f"d02-n{i:02d}" for i in range(12, 17)])]
