"""Table-driven tests of the scheduling cycle (shared/core/cycle.py), against its documented contract.

Fleets are drawn with `cycle_builders.fleet`: one row per NVLink domain, one character per node
(``.`` free, ``#`` down, ``~`` draining, ``!`` a GPU down, a letter a running job on the whole node).
Unless a case says otherwise: NVL72 domains of 18 nodes x 4 GPUs, policy rackscale, now = 0.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.core import (
    Allocate,
    Allocation,
    ClusterState,
    CycleConfig,
    JobSpec,
    NodeSpec,
    Pending,
    PendingCode,
    Preempt,
    Reserve,
    Scheduler,
    Slice,
    TenantPolicy,
    Topology,
    order_jobs,
)
from shared.core.cycle import HOLD_PREFIX
from shared.core.policies import Context, get_policy
from shared.core.shape import request
from tests.unit.cycle_builders import INF, Run, cycle, domains_of, fleet, job, nodes

FREE2 = ["." * 18, "." * 18]


def _assert_clean(state) -> None:
    state.check()
    assert not [j for j in state.allocs if j.startswith(HOLD_PREFIX)], "a reservation hold outlived the cycle"


# ================================================================================================ ordering
ORDER_CASES = [
    # d00 ..................   every job fits: the order alone is under test
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [job("lo", 4, submit_time=0.0, tenant="a"), job("hi", 4, priority=5, submit_time=99.0, tenant="b")],
        CycleConfig(),
        None,
        ["hi", "lo"],
        id="priority-first",
    ),
    # d00 ..................   equal weights, nothing held: the tenants take turns (ties by name)
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [
            job("x1", 4, tenant="x"),
            job("x2", 4, tenant="x", submit_time=1.0),
            job("y1", 4, tenant="y"),
            job("y2", 4, tenant="y", submit_time=1.0),
        ],
        CycleConfig(),
        None,
        ["x1", "y1", "x2", "y2"],
        id="equal-weights-alternate",
    ),
    # d00 ..................   x has weight 2: each 8-GPU job raises x's share by 4, y's by 8
    # d01 ..................   shares after each pick: x4 y8 x8 x12(tie 8/8 -> x) y16
    pytest.param(
        FREE2,
        {},
        [job(f"x{i}", 8, tenant="x", submit_time=float(i)) for i in (1, 2, 3)]
        + [job(f"y{i}", 8, tenant="y", submit_time=float(i)) for i in (1, 2)],
        CycleConfig(tenants={"x": TenantPolicy(weight=2.0)}),
        None,
        ["x1", "y1", "x2", "x3", "y2"],
        id="weight-two-gets-twice-the-turns",
    ),
    # d00 XXXX..............   x already holds 16 GPUs: y goes until its share reaches 16, then turns
    # d01 ..................
    pytest.param(
        ["XXXX" + "." * 14, "." * 18],
        {"X": Run(tenant="x")},
        [job(f"x{i}", 4, tenant="x", submit_time=float(i)) for i in (1, 2)]
        + [job(f"y{i}", 4, tenant="y", submit_time=float(i)) for i in (1, 2, 3, 4, 5)],
        CycleConfig(),
        None,
        ["y1", "y2", "y3", "y4", "x1", "y5", "x2"],
        id="held-gpus-count",
    ),
    # d00 ..................   recent usage 8 for x: y first until the shares meet
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [
            job("x1", 4, tenant="x"),
            job("x2", 4, tenant="x", submit_time=1.0),
            job("y1", 4, tenant="y"),
            job("y2", 4, tenant="y", submit_time=1.0),
        ],
        CycleConfig(),
        {"x": 8.0},
        ["y1", "y2", "x1", "x2"],
        id="usage-shifts-the-order",
    ),
    # d00 ..................   same tenant: submit time, then id
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [job("b", 4, submit_time=5.0), job("a", 4, submit_time=5.0), job("c", 4, submit_time=1.0)],
        CycleConfig(),
        None,
        ["c", "a", "b"],
        id="submit-time-then-id",
    ),
    # d00 ..................   priority beats fair share: x's usage doesn't push its urgent job back
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [job("y1", 4, tenant="y"), job("x1", 4, tenant="x", priority=1, submit_time=9.0)],
        CycleConfig(),
        {"x": 1e6},
        ["x1", "y1"],
        id="priority-beats-share",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "jobs", "config", "usage", "expected"), ORDER_CASES)
def test_order(rows, runs, jobs, config, usage, expected) -> None:
    state = fleet(rows, runs)
    held: dict[str, int] = {}
    for a in state.allocs.values():
        held[a.tenant] = held.get(a.tenant, 0) + a.gpus
    assert [j.id for j in order_jobs(jobs, held, config, usage)] == expected
    result = cycle(state, jobs, config=config, usage=usage)
    assert result.order == expected
    assert [d.job_id for d in result.decisions] == expected
    assert all(isinstance(d, Allocate) for d in result.decisions)


# d00 AAAAAAAAAAAAAAAAA.   one free node: the tenant whose turn comes first gets it
@pytest.mark.parametrize(
    ("usage", "winner", "loser"),
    [pytest.param(None, "x1", "y1", id="ties-by-name"), pytest.param({"x": 1.0}, "y1", "x1", id="usage-flips-it")],
)
def test_order_decides_who_gets_the_last_node(usage, winner, loser) -> None:
    state = fleet(["A" * 17 + "."], {"A": Run(end=500.0)})
    result = cycle(state, [job("x1", 4, tenant="x"), job("y1", 4, tenant="y")], usage=usage)
    by = result.by_job()
    assert isinstance(by[winner], Allocate)
    assert not isinstance(by[loser], Allocate)


# ================================================================================================ quotas
QUOTA_CASES = [
    # d00 AAAAAAAAAAAA......   A: tenant a, 48 GPUs; a's quota 64
    # d01 ..................
    # order: b (share 0) before a (48): b1, a1 (48+16 = 64, allowed), a2 (64+4 > 64)
    pytest.param(
        ["A" * 12 + "." * 6, "." * 18],
        {"A": Run(tenant="a")},
        [job("a1", 16, tenant="a"), job("a2", 4, tenant="a", submit_time=1.0), job("b1", 8, tenant="b")],
        {"a": TenantPolicy(quota_gpus=64)},
        {"b1", "a1"},
        {"a2": "tenant a is at its quota: 64 of 64 GPUs in use, this job needs 4"},
        id="at-quota-after-this-cycle",
    ),
    # d00 ..................   a job larger than the whole quota; a smaller one of the tenant still runs
    # d01 ..................
    pytest.param(
        FREE2,
        {},
        [job("a1", 64, tenant="a"), job("a2", 32, tenant="a", submit_time=1.0), job("b1", 64, tenant="b")],
        {"a": TenantPolicy(quota_gpus=32)},
        {"a2", "b1"},
        {"a1": "tenant a is at its quota: 0 of 32 GPUs in use, this job needs 64"},
        id="larger-than-quota",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "jobs", "tenants", "placed", "quota"), QUOTA_CASES)
def test_quota(rows, runs, jobs, tenants, placed, quota) -> None:
    state = fleet(rows, runs)
    by = cycle(state, jobs, config=CycleConfig(tenants=tenants)).by_job()
    assert {j for j, d in by.items() if isinstance(d, Allocate)} == placed
    for job_id, reason in quota.items():
        assert by[job_id] == Pending(job_id, PendingCode.QUOTA, reason)
    _assert_clean(state)


# ================================================================================================ invalid shapes
INVALID_CASES = [
    pytest.param(job("bad", 0), "gpus", id="zero-gpus"),
    pytest.param(job("bad", 8, gpus_per_node=8), "gpus_per_node", id="more-gpus-per-node-than-nodes-have"),
    pytest.param(job("bad", 6, gpus_per_node=4), "gpus", id="not-a-multiple-of-gpus-per-node"),
    pytest.param(job("bad", 80), "gpus", id="required-larger-than-a-domain"),
    pytest.param(job("bad", 64, segment=5), "segment", id="segment-does-not-divide"),
    pytest.param(job("bad", 64, segment=8, nvlink="none"), "segment", id="segment-without-nvlink"),
    pytest.param(job("bad", 64, segment=20), "segment", id="segment-larger-than-a-domain"),
    pytest.param(job("bad", 8, nvlink="bogus"), "topology.nvlink", id="unknown-nvlink-need"),
    pytest.param(job("bad", 8, level="spine"), "topology.level", id="unknown-level"),
    pytest.param(job("bad", 8, expected_runtime_s=-1.0), "expected_runtime_s", id="negative-runtime"),
    pytest.param(job("bad", 8, priority=1.5), "priority", id="fractional-priority"),
    pytest.param(
        job("bad", 32, slices=(Slice("domain", 4), Slice("domain", 2))), "slices[1].level", id="slices-not-nested"
    ),
    pytest.param(job("bad", 8, slices=(Slice("domain", 0),)), "slices[0].nodes", id="empty-slice"),
    pytest.param(job("bad", 4 * 37), "gpus", id="more-nodes-than-the-cluster"),
]


# d00 ..................   the invalid job is pending with the field named; the valid one beside it runs
# d01 ..................
@pytest.mark.parametrize(("bad", "field"), INVALID_CASES)
def test_invalid_shape(bad: JobSpec, field: str) -> None:
    state = fleet(FREE2)
    result = cycle(state, [bad, job("ok", 8, submit_time=1.0)])
    by = result.by_job()
    assert isinstance(by["bad"], Pending)
    assert by["bad"].code is PendingCode.INVALID
    assert by["bad"].reason.startswith(f"{field}: "), by["bad"].reason
    assert isinstance(by["ok"], Allocate)
    assert set(state.allocs) == {"ok"}
    _assert_clean(state)


# ================================================================================================ reservations
# The fleet most reservation and backfill cases share:
# d00 AAAAAA BBBBBB ......   A ends at 100, B at 300; 6 nodes free
# d01 DDDDDDDDD EEEEEEE ..   D ends at 200, E at 400; 2 nodes free
# A 16-node job: t=100 d00 has 12 free; t=200 d01 has 11 (23 in all, no run of 16); t=300 d00 has 18 -> 300.
# Its layout is d00 n00-n15; the free part held is d00 n12-n15.
RESV_ROWS = ["AAAAAA BBBBBB ......", "DDDDDDDDD EEEEEEE .."]
RESV_RUNS = {"A": Run(end=100.0), "B": Run(end=300.0), "D": Run(end=200.0), "E": Run(end=400.0)}

RESERVE_CASES = [
    pytest.param(
        RESV_ROWS,
        RESV_RUNS,
        0.0,
        300.0,
        "d00",
        "needs 16 nodes in one NVLink domain; the largest free run is 6 nodes in domain d00; "
        "reserved to start in ~5 min",
        id="earliest-end-that-frees-a-run",
    ),
    # d00 AAAAAA BBBBBB ......   A ends at 100, B at 500
    # d01 DDDDDDDDD EEEEEEE ..   D ends at 200, E at 400 -> d01 frees 18 at 400, before d00 does
    pytest.param(
        RESV_ROWS,
        {**RESV_RUNS, "B": Run(end=500.0)},
        0.0,
        400.0,
        "d01",
        "needs 16 nodes in one NVLink domain; the largest free run is 6 nodes in domain d00; "
        "reserved to start in ~7 min",
        id="run-frees-in-the-other-domain",
    ),
    # d00 AAAAAAAAAAAAAAAAAA   A was expected to end at 50; now is 100: it counts as ending now
    # d01 BBBBBBBBBBBBBBBBBB   B ends at 1000
    pytest.param(
        ["A" * 18, "B" * 18],
        {"A": Run(end=50.0), "B": Run(end=1000.0)},
        100.0,
        100.0,
        "d00",
        "needs 16 nodes in one NVLink domain; the largest free run is 0 nodes in domain d00; reserved to start in ~0 s",
        id="overdue-job-frees-now",
    ),
    # d00 AAAAAAAA BBBBBBBB CC   ends 100 / 250 / 175: 8+2 free at 175, 18 only at 250
    pytest.param(
        ["AAAAAAAA BBBBBBBB CC"],
        {"A": Run(end=100.0), "B": Run(end=250.0), "C": Run(end=175.0)},
        0.0,
        250.0,
        "d00",
        "needs 16 nodes in one NVLink domain; the largest free run is 0 nodes in domain d00; "
        "reserved to start in ~4 min",
        id="needs-the-last-of-three-ends",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "now", "start", "domain", "reason"), RESERVE_CASES)
def test_reservation_start(rows, runs, now, start, domain, reason) -> None:
    state = fleet(rows, runs)
    result = cycle(state, [job("X", 64, expected_runtime_s=1000.0)], now=now)
    (d,) = result.decisions
    assert isinstance(d, Reserve)
    assert d.start == start
    assert len(d.nodes) == 16
    assert domains_of(state.topo, d.nodes) == {domain}
    assert d.reason == reason
    assert "reserved to start in" in d.reason
    _assert_clean(state)


# d00 AAAAAAAAAA........   A ends at 100. R1 (16 nodes, 50 s) can start at 100 and ends at 150;
#                          R2 (16 nodes) can start when R1 ends: 150. Nothing is broken for good.
def test_second_reservation_starts_when_the_first_ends() -> None:
    state = fleet(["A" * 10 + "." * 8], {"A": Run(end=100.0)})
    result = cycle(state, [job("R1", 64, expected_runtime_s=50.0), job("R2", 64, expected_runtime_s=50.0)])
    by = result.by_job()
    assert isinstance(by["R1"], Reserve) and by["R1"].start == 100.0
    assert isinstance(by["R2"], Reserve), by["R2"]
    assert by["R2"].start == 150.0
    _assert_clean(state)


# RESV fleet; reservations=1: only X1 reserves, the others are pending behind it. After X1's hold
# (d00 n12-n15) the largest free run is 2 nodes (d00 n16-n17, tie with d01 to the lower index).
@pytest.mark.parametrize("depth", [1, 2])
def test_reservation_depth(depth: int) -> None:
    state = fleet(RESV_ROWS, RESV_RUNS)
    jobs = [job(f"X{i}", 64, expected_runtime_s=1000.0, submit_time=float(i)) for i in (1, 2, 3)]
    by = cycle(state, jobs, config=CycleConfig(reservations=depth)).by_job()
    reserved = [j for j in ("X1", "X2", "X3") if isinstance(by[j], Reserve)]
    assert reserved == ["X1", "X2", "X3"][:depth]
    assert by["X1"].start == 300.0
    for j in ("X1", "X2", "X3")[depth:]:
        assert by[j].code is PendingCode.NO_FIT
        assert by[j].reason.endswith(f"; {depth} reservations ahead"), by[j].reason
    if depth == 1:
        assert by["X2"].reason == (
            "needs 16 nodes in one NVLink domain; the largest free run is 2 nodes in domain d00; 1 reservations ahead"
        )
    _assert_clean(state)


# ================================================================================================ backfill
HELD = (12, 13, 14, 15)  # d00 nodes X's reservation holds in the RESV fleet

BACKFILL_CASES = [
    # 2 nodes, long: fits outside the hold (d00 n16-17 or d01 n16-17)
    pytest.param(job("s", 8, expected_runtime_s=1e5), CycleConfig(reservations=1), True, False, id="outside-the-hold"),
    # 6 nodes in one domain only fit with the held nodes; 300 s ends exactly at X's start: allowed
    pytest.param(
        job("s", 24, expected_runtime_s=300.0), CycleConfig(reservations=1), True, True, id="held-nodes-ends-in-time"
    ),
    # same, one second longer: it would delay X
    pytest.param(job("s", 24, expected_runtime_s=301.0), CycleConfig(reservations=1), False, None, id="held-too-long"),
    # no expected runtime: the default (a day) is far past X's start
    pytest.param(job("s", 24), CycleConfig(reservations=1), False, None, id="held-default-runtime"),
    # backfill off: nothing starts behind the blocked X, even what fits outside its hold
    pytest.param(
        job("s", 8, expected_runtime_s=10.0),
        CycleConfig(reservations=1, backfill=False),
        False,
        None,
        id="backfill-off",
    ),
]


@pytest.mark.parametrize(("small", "config", "starts", "on_held"), BACKFILL_CASES)
def test_backfill(small: JobSpec, config: CycleConfig, starts: bool, on_held: bool | None) -> None:
    state = fleet(RESV_ROWS, RESV_RUNS)
    topo = state.topo
    result = cycle(state, [job("X", 64, expected_runtime_s=1000.0), replace(small, submit_time=1.0)], config=config)
    by = result.by_job()
    assert isinstance(by["X"], Reserve) and by["X"].start == 300.0
    held = set(nodes(topo, 0, HELD))
    assert held <= set(by["X"].nodes)
    d = by["s"]
    if starts:
        assert isinstance(d, Allocate), d
        assert d.backfilled
        assert d.expected_end <= by["X"].start or not (held & set(d.nodes))
        assert bool(held & set(d.nodes)) is on_held
        assert len(domains_of(topo, d.nodes)) == 1
    elif config.backfill:
        assert d == Pending("s", PendingCode.NO_FIT, d.reason)
        assert d.reason.endswith("; 1 reservations ahead")
        assert "s" not in state.allocs
    else:
        assert d == Pending("s", PendingCode.BLOCKED, "waits behind job X (backfill off)")
    _assert_clean(state)


# ================================================================================================ preemption
# d00 AAAAAAAAA BBBBBBBBB    A, B: 36 GPUs each, not checkpointable        cost (2 non-ckpt, 72 GPUs)
# d01 CCCCCCCC DDDDDDDD EE   C, D: 32 each, checkpointable; E not           cost (0, 64) <- cheapest
# d02 FFFFFFFFFFFFFFFFF G    F: 68, checkpointable; G not                   cost (0, 68)
# Everything priority 0, ending at 10000.
PRE_ROWS = ["AAAAAAAAA BBBBBBBBB", "CCCCCCCC DDDDDDDD EE", "FFFFFFFFFFFFFFFFF G"]
PRE_RUNS = {
    "A": Run(end=1e4),
    "B": Run(end=1e4),
    "C": Run(end=1e4, checkpointable=True),
    "D": Run(end=1e4, checkpointable=True),
    "E": Run(end=1e4),
    "F": Run(end=1e4, checkpointable=True),
    "G": Run(end=1e4),
}

PREEMPT_CASES = [
    pytest.param(PRE_ROWS, PRE_RUNS, [job("H", 64, priority=10)], {"H": ["C", "D"]}, id="cheapest-domain"),
    # the second preemptor takes the next cheapest domain: d02 (F alone, 68 GPUs, checkpointable)
    pytest.param(
        PRE_ROWS,
        PRE_RUNS,
        [job("H1", 64, priority=10), job("H2", 64, priority=10, submit_time=1.0)],
        {"H1": ["C", "D"], "H2": ["F"]},
        id="two-preemptors",
    ),
    # d00 AAAAAAAAAAAAAAAA BB   A not checkpointable (64 GPUs), B checkpointable: B then A, cost (1 non-ckpt, 72)
    # d01 CCCCCCCCCCCCCCCCC D   C checkpointable (68 GPUs): cost (0, 68) <- no non-checkpointable victim wins
    pytest.param(
        ["AAAAAAAAAAAAAAAA BB", "CCCCCCCCCCCCCCCCC D"],
        {
            "A": Run(end=1e4),
            "B": Run(end=1e4, checkpointable=True),
            "C": Run(end=1e4, checkpointable=True),
            "D": Run(end=1e4),
        },
        [job("H", 64, priority=10)],
        {"H": ["C"]},
        id="checkpointable-first",
    ),
    # d00 AAAAAAAAAAAAAAAAAA   A priority 10 = H's: never a victim
    # d01 BBBBBBBBBBBBBBBBBB   B priority 20: never a victim
    # d02 CCCCCCCCC DDDDDDDDD  C priority 0 (9 nodes: not enough alone), D priority 10
    pytest.param(
        ["A" * 18, "B" * 18, "CCCCCCCCC DDDDDDDDD"],
        {
            "A": Run(end=1e3, priority=10, checkpointable=True),
            "B": Run(end=1e3, priority=20, checkpointable=True),
            "C": Run(end=1e3),
            "D": Run(end=1e3, priority=10),
        },
        [job("H", 64, priority=10)],
        {},
        id="never-equal-or-higher-priority",
    ),
    # segments: 2 x 8 nodes; d00 has room for one segment (9 free), the other comes from one victim group
    # d00 AAAAAAAAA .........
    # d01 BBBBBBBB CCCCCCCC DD  B, C checkpointable, 32 GPUs each: one of them frees a segment
    pytest.param(
        ["AAAAAAAAA .........", "BBBBBBBB CCCCCCCC DD"],
        {
            "A": Run(end=1e4),
            "B": Run(end=1e4, checkpointable=True),
            "C": Run(end=1e4, checkpointable=True),
            "D": Run(end=1e4),
        },
        [job("H", 64, priority=10, segment=8)],
        {"H": ["B"]},
        id="segment-frees-one-group",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "jobs", "victims"), PREEMPT_CASES)
def test_preemption(rows, runs, jobs, victims) -> None:
    state = fleet(rows, runs)
    topo = state.topo
    before = {j: (a.nodes, a.checkpointable) for j, a in state.allocs.items()}
    result = cycle(state, jobs)
    by = result.by_job()
    preempts = result.of(Preempt)
    assert {p.for_job: [] for p in preempts} == {h: [] for h in victims}
    for h, expected in victims.items():
        mine = [p for p in preempts if p.for_job == h]
        assert sorted(p.job_id for p in mine) == sorted(expected)
        # victims in ONE domain, the job in that same domain (unsegmented) or including it
        victim_domains = set().union(*(domains_of(topo, before[p.job_id][0]) for p in mine))
        assert len(victim_domains) == 1
        alloc = by[h]
        assert isinstance(alloc, Allocate)
        assert not alloc.backfilled
        assert victim_domains <= domains_of(topo, alloc.nodes)
        # Preempt decisions come before the job's Allocate, and carry the victim's checkpointability
        at = result.decisions.index(alloc)
        for p in mine:
            assert result.decisions.index(p) < at
            assert p.checkpoint is before[p.job_id][1]
            assert p.job_id not in state.allocs
        assert state.allocs[h].nodes == alloc.nodes
    if not victims:
        assert not preempts
        for j in jobs:
            assert not isinstance(by[j.id], Allocate)
    for j in {j for j in before if j not in {p.job_id for p in preempts}}:
        assert state.allocs[j].nodes == before[j][0]
    _assert_clean(state)


def test_preempted_segment_job_fills_the_free_run_first() -> None:
    # d00 AAAAAAAAA .........   one segment of 8 goes in d00's free run, the other on B's nodes in d01
    # d01 BBBBBBBB CCCCCCCC DD
    state = fleet(
        ["AAAAAAAAA .........", "BBBBBBBB CCCCCCCC DD"],
        {"A": Run(end=1e4), "B": Run(end=1e4, checkpointable=True), "C": Run(end=1e4, checkpointable=True)},
    )
    topo = state.topo
    by = cycle(state, [job("H", 64, priority=10, segment=8)]).by_job()
    assert isinstance(by["H"], Allocate)
    per = {d: sum(1 for n in by["H"].nodes if domains_of(topo, [n]) == {d}) for d in ("d00", "d01")}
    assert per == {"d00": 8, "d01": 8}


def test_preemption_disabled() -> None:
    state = fleet(PRE_ROWS, PRE_RUNS)
    result = cycle(state, [job("H", 64, priority=10)], config=CycleConfig(preemption=False))
    assert not result.of(Preempt)
    (d,) = result.decisions
    assert isinstance(d, Reserve) and d.start == 1e4
    assert set(state.allocs) == set(PRE_RUNS)
    _assert_clean(state)


# d00 JJJJJJJJJJJJJJJJJJ     J priority 30, ends at 100: R (priority 20, 16 nodes) reserves d00 for t=100
# d01 KKKK LLLLLLLLLLLLLL    K priority 0, L priority 30: R can't preempt (K frees only 4 nodes)
# H (priority 10, 4 nodes) may preempt K only if it is expected to end by R's start (100).
@pytest.mark.parametrize(
    ("runtime", "preempts"),
    [pytest.param(50.0, True, id="ends-before-the-reservation"), pytest.param(500.0, False, id="runs-past-it")],
)
def test_preemption_never_runs_past_a_reservation(runtime: float, preempts: bool) -> None:
    state = fleet(
        ["J" * 18, "KKKK LLLLLLLLLLLLLL"],
        {"J": Run(end=100.0, priority=30), "K": Run(end=1e4), "L": Run(end=1e4, priority=30)},
    )
    result = cycle(
        state,
        [job("R", 64, priority=20, expected_runtime_s=1e3), job("H", 16, priority=10, expected_runtime_s=runtime)],
    )
    by = result.by_job()
    assert isinstance(by["R"], Reserve) and by["R"].start == 100.0
    if preempts:
        assert result.of(Preempt) == [Preempt("K", "H", False)]
        assert isinstance(by["H"], Allocate)
        assert by["H"].nodes == nodes(state.topo, 1, range(4))
    else:
        assert not result.of(Preempt)
        assert not isinstance(by["H"], Allocate)
        assert "K" in state.allocs
    _assert_clean(state)


# ================================================================================================ reasons
# d00 AAAAAAAAAAAA......   6 free
# d01 BBBBBB............   12 free  <- the largest run
# d02 CCCCCCCC..........   10 free (7 in the segment case)
REASON_RUNS = {"A": Run(end=1e3), "B": Run(end=1e3), "C": Run(end=1e3)}
REASON_CASES = [
    pytest.param(
        ["A" * 12 + "." * 6, "B" * 6 + "." * 12, "C" * 8 + "." * 10],
        job("J", 64),
        CycleConfig(),
        "needs 16 nodes in one NVLink domain; the largest free run is 12 nodes in domain d01; reserved to start in "
        "~17 min",
        id="largest-free-run",
    ),
    pytest.param(
        ["A" * 12 + "." * 6, "B" * 6 + "." * 12, "C" * 11 + "." * 7],
        job("J", 64, segment=8),
        CycleConfig(),
        "needs 2 segments of 8 nodes, each in one NVLink domain; free runs can host 1 now "
        "(largest: 12 nodes in domain d01); reserved to start in ~17 min",
        id="segments",
    ),
    pytest.param(
        ["A" * 12 + "." * 6, "B" * 6 + "." * 12, "C" * 8 + "." * 10],
        job("J", 32, gpus_per_node=2),
        CycleConfig(),
        "needs 16 nodes with 2 free GPUs in one NVLink domain; the largest free run is 12 nodes with 2 free GPUs "
        "in domain d01; reserved to start in ~17 min",
        id="partial-nodes",
    ),
    # flat ignores domains: only the free total counts
    # d00 AAAAAAAAAAAA......   6 free
    # d01 BBBBBBBBBB........   8 free
    pytest.param(
        ["A" * 12 + "." * 6, "B" * 10 + "." * 8],
        job("J", 64),
        CycleConfig(policy="flat"),
        "needs 16 nodes; 14 are free; reserved to start in ~17 min",
        id="flat-free-total",
    ),
    pytest.param(
        ["A" * 12 + "." * 6, "B" * 10 + "." * 8],
        job("J", 64),
        CycleConfig(policy="flat", reservations=0),
        "needs 16 nodes; 14 are free",
        id="no-reservation-no-suffix",
    ),
]


@pytest.mark.parametrize(("rows", "spec", "config", "reason"), REASON_CASES)
def test_pending_reason(rows, spec, config, reason) -> None:
    state = fleet(rows, REASON_RUNS)
    (d,) = cycle(state, [spec], config=config).decisions
    assert d.reason == reason
    assert isinstance(d, Reserve) if config.reservations else d.code is PendingCode.NO_FIT


# ================================================================================================ never fits
NEVER_CASES = [
    # d00 ###...............   3 nodes down in every domain: 15 usable, a 16-node job never fits
    # d01 ###...............
    pytest.param(["###" + "." * 15, "###" + "." * 15], {}, job("J", 64), "15 nodes in domain d00", id="three-down"),
    # d00 ##~AAAAAAAAAAAAAAA   down, draining and busy: even when A and B end, 15 usable per domain
    # d01 #~~BBBBBBBBB......
    pytest.param(
        ["##~" + "A" * 15, "#~~" + "B" * 9 + "." * 6],
        {"A": Run(end=100.0), "B": Run(end=200.0)},
        job("J", 64),
        "6 nodes in domain d01",
        id="down-draining-and-busy",
    ),
    # d00 !!!...............   a GPU down on 3 nodes per domain: 15 whole nodes left
    # d01 !!!...............
    pytest.param(["!!!" + "." * 15, "!!!" + "." * 15], {}, job("J", 64), "15 nodes in domain d00", id="gpus-down"),
    # d00 ###...............   segments of 8 still fit one domain each... but 3 segments need 24 of 30 usable
    # d01 #########.........   d01 has only 9: room for 1 + 1 segments in all
    pytest.param(
        ["###" + "." * 15, "#" * 9 + "." * 9],
        {},
        job("J", 96, segment=8),
        "largest: 15 nodes in domain d00",
        id="segments-never-fit",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "spec", "largest"), NEVER_CASES)
def test_never_fits(rows, runs, spec, largest) -> None:
    state = fleet(rows, runs)
    (d,) = cycle(state, [spec]).decisions
    assert isinstance(d, Pending) and d.code is PendingCode.NEVER_FITS, d
    assert largest in d.reason
    assert d.reason.endswith("; won't fit even when running jobs end")
    _assert_clean(state)


# d00 AAAAAAAAAAAAAAAAAA   A runs with no expected end (INF): the job fits once A ends, so it is not
# d01 BBBBBBBBBBBBBBBBBB   NEVER_FITS ("wouldn't fit even with every running job ended"); no start is known
def test_blocked_by_jobs_without_an_end_is_not_never_fits() -> None:
    state = fleet(["A" * 18, "B" * 18], {"A": Run(end=INF), "B": Run(end=INF)})
    (d,) = cycle(state, [job("J", 64)]).decisions
    assert isinstance(d, Pending), d
    assert d.code is not PendingCode.NEVER_FITS, d


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(job("J", 60), id="15-whole-nodes"),
        pytest.param(job("J", 32, gpus_per_node=2), id="16-nodes-with-2-gpus"),  # 3 free GPUs are enough
    ],
)
def test_fits_what_health_leaves(spec: JobSpec) -> None:
    # d00 !!!...............   the same fleet as gpus-down: smaller or partial-node shapes still fit
    # d01 !!!...............
    state = fleet(["!!!" + "." * 15, "!!!" + "." * 15])
    (d,) = cycle(state, [spec]).decisions
    assert isinstance(d, Allocate)
    assert len(domains_of(state.topo, d.nodes)) == 1
    for n, m in zip(d.nodes, d.masks, strict=True):
        assert m & ~state.full[n] == 0


# ================================================================================================ state after
# d00 AAAAAAAA BBBB ......   A priority 0, checkpointable, ends 100; B priority 10, ends 300
# d01 DDDDDDDDD EEEEEEE ..   D, E priority 10, end 200 / 400
# X (priority 5) can't preempt enough (A frees 8 + 6 free < 16): reserved for t=300 on d00 n00-n15, holding
# n12-n15. "urgent" (priority 3, 7 nodes, ends 250 < 300) can't borrow 6 held+free nodes, so it preempts A
# and lands on n00-n06; n07 (in X's layout) is left free by the preemption.
LEAK_ROWS = ["AAAAAAAA BBBB ......", "DDDDDDDDD EEEEEEE .."]
LEAK_RUNS = {
    "A": Run(end=100.0, checkpointable=True),
    "B": Run(end=300.0, priority=10),
    "D": Run(end=200.0, priority=10),
    "E": Run(end=400.0, priority=10),
}


def _mixed() -> tuple:
    """The LEAK fleet with X reserved, a preemption, a backfilled job outside the hold, one borrowing it,
    one that runs too long for it, and an invalid one."""
    state = fleet(LEAK_ROWS, LEAK_RUNS)
    jobs = [
        job("X", 64, priority=5, expected_runtime_s=1000.0),
        job("urgent", 28, priority=3, expected_runtime_s=250.0),
        job("out", 8, expected_runtime_s=1e5, submit_time=1.0),
        job("borrow", 16, expected_runtime_s=200.0, submit_time=2.0),
        job("long", 24, expected_runtime_s=1e5, submit_time=3.0),
        job("bad", 0, submit_time=5.0),
    ]
    return state, jobs


RESERVED_LAYOUT_CASES = [
    # RESV fleet: a job outside the hold, one borrowing the hold that ends in time, one too long
    pytest.param(
        RESV_ROWS,
        RESV_RUNS,
        [
            job("X", 64, expected_runtime_s=1000.0),
            job("out", 8, expected_runtime_s=1e5, submit_time=1.0),
            job("borrow", 24, expected_runtime_s=250.0, submit_time=2.0),
            job("long", 16, expected_runtime_s=1e5, submit_time=3.0),
        ],
        id="backfill",
    ),
    # LEAK fleet: after "urgent" preempts A, d00 n07 (X's layout, no longer busy, not held) is free;
    # "late" (3 nodes, a day) must not take it, or X can't start at 300.
    pytest.param(
        LEAK_ROWS,
        LEAK_RUNS,
        [
            job("X", 64, priority=5, expected_runtime_s=1000.0),
            job("urgent", 28, priority=3, expected_runtime_s=250.0),
            job("late", 12, expected_runtime_s=1e5),
        ],
        id="preemption-leftovers",
    ),
]


@pytest.mark.parametrize(("rows", "runs", "jobs"), RESERVED_LAYOUT_CASES)
def test_reserved_layout_is_clear_by_its_start(rows, runs, jobs) -> None:
    """Whole-node reservation: whatever holds its nodes after the cycle is expected to end by its start."""
    state = fleet(rows, runs)
    result = cycle(state, jobs)
    reserves = result.of(Reserve)
    assert [r.job_id for r in reserves][:1] == ["X"]
    for r in reserves:
        late = sorted(
            (a.job_id, state.topo.node_names[n], a.expected_end)
            for a in state.allocs.values()
            for n in a.nodes
            if n in set(r.nodes) and a.expected_end > r.start
        )
        assert not late, f"{r.job_id} reserved for t={r.start} on nodes still busy after it: {late}"
    _assert_clean(state)


def test_state_after_cycle() -> None:
    state, jobs = _mixed()
    result = cycle(state, jobs, config=CycleConfig(reservations=2))
    allocs = result.of(Allocate)
    assert allocs
    for d in allocs:
        a = state.allocs[d.job_id]
        assert (a.nodes, a.masks, a.expected_end) == (d.nodes, d.masks, d.expected_end)
        spec = next(j for j in jobs if j.id == d.job_id)
        assert (a.priority, a.tenant, a.checkpointable, a.start) == (
            spec.priority,
            spec.tenant,
            spec.checkpointable,
            0.0,
        )
    for p in result.of(Preempt):
        assert p.job_id not in state.allocs
    decided = [d.job_id for d in result.decisions if not isinstance(d, Preempt)]
    assert sorted(decided) == sorted(j.id for j in jobs)  # one final decision per job
    assert len(decided) == len(set(decided))
    _assert_clean(state)


def test_max_tested() -> None:
    state = fleet(FREE2)
    jobs = [job(f"j{i}", 4, submit_time=float(i)) for i in range(4)]
    by = cycle(state, jobs, config=CycleConfig(max_tested=2)).by_job()
    assert [type(by[f"j{i}"]) for i in range(4)] == [Allocate, Allocate, Pending, Pending]
    assert by["j2"] == Pending("j2", PendingCode.NOT_TESTED, "not yet tested: 2 jobs ahead of it")


# ================================================================================================ determinism
@pytest.mark.parametrize("policy", ["flat", "tree", "block", "rackscale"])
def test_deterministic(policy: str) -> None:
    config = CycleConfig(policy=policy, reservations=2)
    runs = []
    for _ in range(2):
        state, jobs = _mixed()
        result = cycle(state, jobs, config=config)
        runs.append((result.decisions, result.order, {j: (a.nodes, a.masks) for j, a in state.allocs.items()}))
    assert runs[0] == runs[1]


# ===================================================================================== sticky reservations
# X: 32 nodes in two 16-node segments. First cycle (now 0):
#   d00 AAAAAAAAAAAAAAAAAA   A ends at 1000
#   d01 BBBBBBBBBBBBBBBBBB   B ends at 1000
#   d02 CCCCCCCCCCCCCCCCCC   C ends at 2000       -> X reserved on d00 + d01 at 1000 (both policies)
# Second cycle (now 100), the estimates have moved: B ends at `b_end`, d02 now holds D ending at 900.
# A fresh forecast: d00 + d02 at 1000. Rackscale keeps d00 + d01 unless that starts much later
# (STICKY_FACTOR x 900 s + STICKY_SLACK_S = 4950 s from now); block re-plans from scratch every cycle.
@pytest.mark.parametrize(
    ("policy", "b_end", "start", "doms"),
    [
        ("rackscale", 1200.0, 1200.0, {"d00", "d01"}),  # 1100 s from now: kept
        ("rackscale", 5050.0, 5050.0, {"d00", "d01"}),  # 4950 s: still within the slack
        ("rackscale", 5051.0, 1000.0, {"d00", "d02"}),  # just past it: moves to the sooner layout
        ("block", 1200.0, 1000.0, {"d00", "d02"}),
    ],
)
def test_reservation_keeps_its_domains_unless_much_later(policy: str, b_end: float, start: float, doms) -> None:
    sched = Scheduler(CycleConfig(policy=policy))
    x = job("X", 128, segment=16, expected_runtime_s=500.0)
    first = fleet(["A" * 18, "B" * 18, "C" * 18], {"A": Run(end=1000.0), "B": Run(end=1000.0), "C": Run(end=2000.0)})
    (d,) = sched.cycle(first, [x], 0.0).decisions
    assert isinstance(d, Reserve) and d.start == 1000.0
    assert domains_of(first.topo, d.nodes) == {"d00", "d01"}
    second = fleet(["A" * 18, "B" * 18, "D" * 18], {"A": Run(end=1000.0), "B": Run(end=b_end), "D": Run(end=900.0)})
    (d,) = sched.cycle(second, [x], 100.0).decisions
    assert isinstance(d, Reserve)
    assert d.start == start
    assert domains_of(second.topo, d.nodes) == doms
    _assert_clean(second)


def test_promise_is_forgotten_once_the_job_is_not_reserved() -> None:
    sched = Scheduler(CycleConfig(policy="rackscale"))
    x = job("X", 64, expected_runtime_s=500.0)
    busy = fleet(["A" * 18], {"A": Run(end=1000.0)})
    assert isinstance(sched.cycle(busy, [x], 0.0).decisions[0], Reserve)
    assert set(sched.promised) == {"X"}
    free = fleet(["." * 18])
    assert isinstance(sched.cycle(free, [x], 10.0).decisions[0], Allocate)
    assert sched.promised == {}


# d00 ..................   every domain free; `within` confines a placement (a kept reservation's forecast)
# d01 ..................   to the domains named, for a single-domain job and a segmented one alike
# d02 ..................
@pytest.mark.parametrize("policy", ["block", "rackscale"])
@pytest.mark.parametrize(
    ("gpus", "segment", "within", "doms"), [(64, None, {2}, {"d02"}), (128, 16, {0, 2}, {"d00", "d02"})]
)
def test_placement_within_domains(policy: str, gpus: int, segment: int | None, within, doms) -> None:
    state = fleet(["." * 18] * 3)
    req = request(job("X", gpus, segment=segment), state.topo)
    got = get_policy(policy).place(state, req, Context(within=frozenset(within)))
    assert got is not None and domains_of(state.topo, got.nodes) == doms
    assert get_policy(policy).place(state, req, Context(within=frozenset({1}) if segment else frozenset())) is None


# ============================================================================ lending reserved nodes
# RESV fleet at 0: X (16 nodes, 1000 s) is reserved on d00 at 300 (when B ends), holding d00 n12-15.
# S (6 nodes in one domain, checkpointable, runs 1e5 s) only fits with the held nodes and would delay X.
# With `lend_checkpointable` it borrows them (d00 n12-17) anyway; X keeps its reservation (S counts as
# gone for X's forecast) and, once it would fit without S, preempts S (checkpointed: it keeps its progress)
# and starts:
#   t=0    d00 AAAAAABBBBBB SSSSSS   X reserved at 300 on d00; S borrows n12-17
#   t=100  d00 ......BBBBBB SSSSSS   A ended; X still reserved at 300 on d00 (not d01 at 400)
#   t=300  d00 ............ SSSSSS   B ended; X fits without S: Preempt S, Allocate X on d00 n00-15
def test_lent_reserved_nodes_come_back_when_the_reservation_is_due() -> None:
    config = CycleConfig(reservations=1, lend_checkpointable=True)
    sched = Scheduler(config)
    x = job("X", 64, expected_runtime_s=1000.0)
    s = job("S", 24, expected_runtime_s=1e5, checkpointable=True, submit_time=1.0)
    state = fleet(RESV_ROWS, RESV_RUNS)
    by = sched.cycle(state, [x, s], 0.0).by_job()
    assert isinstance(by["X"], Reserve) and by["X"].start == 300.0
    assert isinstance(by["S"], Allocate) and by["S"].nodes == nodes(state.topo, 0, range(12, 18))
    assert sched.lent == {"S": frozenset({"X"})}
    _assert_clean(state)

    runs = {"B": Run(end=300.0), "S": Run(end=1e5, checkpointable=True), "D": Run(end=200.0), "E": Run(end=400.0)}
    later = fleet(["......BBBBBB SSSSSS", "DDDDDDDDD EEEEEEE .."], runs)
    (d,) = sched.cycle(later, [x], 100.0).decisions
    assert isinstance(d, Reserve) and d.start == 300.0 and domains_of(later.topo, d.nodes) == {"d00"}

    due = fleet(["............ SSSSSS", "......... EEEEEEE .."], runs)
    decisions = sched.cycle(due, [x], 300.0).decisions
    assert decisions == [
        Preempt("S", "X", True),
        Allocate("X", nodes(due.topo, 0, range(16)), (0b1111,) * 16, 1300.0, False),
    ]
    assert "S" not in due.allocs and sched.lent == {}
    _assert_clean(due)


# A borrower stays on loan after the reservation it borrowed from has started elsewhere: a later reservation
# counts it as gone and takes its nodes back. (Before, it was owed only to its lender: Y would have been
# reserved at 1100 on d01, behind X, while S ran on in d00 for 1e5 s.)
#   t=0    d00 AAAAAABBBBBB SSSSSS   X reserved at 300 on d00; S borrows n12-17 from X
#          d01 DDDDDDDDD EEEEEEE ..
#   t=100  d00 ......BBBBBB SSSSSS   D and E ended early: X starts on d01 (S stays); Y (16 nodes) counts S
#          d01 XXXXXXXXXXXXXXXX..    as gone: reserved at 300 on d00, when B ends
#   t=300  d00 ............ SSSSSS   Y fits without S: Preempt S, Allocate Y on d00 n00-15
def test_a_borrower_stays_on_loan_after_its_lender_started_elsewhere() -> None:
    sched = Scheduler(CycleConfig(reservations=1, lend_checkpointable=True))
    x = job("X", 64, expected_runtime_s=1000.0)
    s = job("S", 24, expected_runtime_s=1e5, checkpointable=True, submit_time=1.0)
    y = job("Y", 64, expected_runtime_s=1000.0, submit_time=2.0)
    by = sched.cycle(fleet(RESV_ROWS, RESV_RUNS), [x, s], 0.0).by_job()
    assert isinstance(by["X"], Reserve) and isinstance(by["S"], Allocate)
    assert sched.lent == {"S": frozenset({"X"})}

    runs = {"B": Run(end=300.0), "S": Run(end=1e5, checkpointable=True)}
    later = fleet(["......BBBBBB SSSSSS", "................. ."], runs)
    by = sched.cycle(later, [x, y], 100.0).by_job()
    assert isinstance(by["X"], Allocate) and domains_of(later.topo, by["X"].nodes) == {"d01"}
    assert isinstance(by["Y"], Reserve) and by["Y"].start == 300.0
    assert domains_of(later.topo, by["Y"].nodes) == {"d00"}
    assert sched.lent == {"S": frozenset({"X"})} and sched.reserved == {"Y"}

    runs["X"] = Run(end=1100.0)
    due = fleet(["............ SSSSSS", "XXXXXXXXXXXXXXXX .."], runs)
    decisions = sched.cycle(due, [y], 300.0).decisions
    assert decisions == [
        Preempt("S", "Y", True),
        Allocate("Y", nodes(due.topo, 0, range(16)), (0b1111,) * 16, 1300.0, False),
    ]
    assert sched.lent == {}
    _assert_clean(due)


def test_jobs_under_the_node_floor_dont_borrow() -> None:
    # RESV fleet: d01 has 3 free nodes, so a 4-node job fits only on d00's, which X holds
    x = job("X", 64, expected_runtime_s=1000.0)
    four = job("F", 16, expected_runtime_s=1e5, checkpointable=True, submit_time=1.0)
    for floor, borrows in ((4, True), (5, False)):
        config = CycleConfig(reservations=1, lend_checkpointable=True, lend_min_nodes=floor)
        by = cycle(fleet(RESV_ROWS, RESV_RUNS), [x, four], config=config).by_job()
        assert isinstance(by["X"], Reserve)
        assert isinstance(by["F"], Allocate if borrows else Pending), (floor, by["F"])
    assert CycleConfig().lend_min_nodes == 4
    # a loan is given back by preemption: with preemption off nothing is lent
    assert not Scheduler(CycleConfig(lend_checkpointable=True, preemption=False)).lend


def test_without_lending_a_long_job_stays_off_reserved_nodes() -> None:
    state = fleet(RESV_ROWS, RESV_RUNS)
    x = job("X", 64, expected_runtime_s=1000.0)
    s = job("S", 24, expected_runtime_s=1e5, checkpointable=True, submit_time=1.0)
    by = cycle(state, [x, s], config=CycleConfig(reservations=1, lend_checkpointable=False)).by_job()
    assert isinstance(by["X"], Reserve)
    assert isinstance(by["S"], Pending)
    # the policy's default unless configured: rackscale lends, the baselines keep Slurm's rule
    assert Scheduler(CycleConfig(policy="rackscale")).lend
    assert not Scheduler(CycleConfig(policy="rackscale", lend_checkpointable=False)).lend
    assert not Scheduler(CycleConfig(policy="block")).lend
    assert Scheduler(CycleConfig(policy="block", lend_checkpointable=True)).lend
    # a job that can't checkpoint is never lent reserved nodes
    state = fleet(RESV_ROWS, RESV_RUNS)
    pinned = replace(s, checkpointable=False)
    by = cycle(state, [x, pinned], config=CycleConfig(reservations=1, lend_checkpointable=True)).by_job()
    assert isinstance(by["S"], Pending)


# ============================================================================ kicked cycles reuse forecasts
# d00 AAAAAAAAAAAAAAAAAA   A ends at 1000: X (16 nodes) is reserved on d00 at 1000 by a full cycle
# d01 BBBBBBBBBBBBBBBBBB   B ends at 2000
# Then B's nodes go to C, ending at 500: a fresh forecast puts X on d01 at 500 (block doesn't stick to its
# domains). A cycle that reuses forecasts keeps d00 at 1000 (it still holds: A ends by then), without
# replaying every running job's end; the next full cycle moves X to the sooner start.
def _x() -> JobSpec:
    return job("X", 64, expected_runtime_s=500.0)


def _reserve(sched: Scheduler, state, now: float, reuse: bool) -> Reserve:
    (d,) = sched.cycle(state, [_x()], now, reuse_forecasts=reuse).decisions
    assert isinstance(d, Reserve), d
    _assert_clean(state)
    return d


def test_a_cycle_reusing_forecasts_keeps_a_reservation_that_still_holds() -> None:
    sched = Scheduler(CycleConfig(policy="block"))
    first = _reserve(sched, fleet(["A" * 18, "B" * 18], {"A": Run(end=1000.0), "B": Run(end=2000.0)}), 0.0, False)
    assert first.start == 1000.0
    later = fleet(["A" * 18, "C" * 18], {"A": Run(end=1000.0), "C": Run(end=500.0)})
    kept = _reserve(sched, later, 100.0, True)
    assert (kept.start, kept.nodes) == (1000.0, first.nodes)
    kept = _reserve(sched, later, 200.0, True)  # kept again: the reuse is remembered as the last forecast
    assert (kept.start, kept.nodes) == (1000.0, first.nodes)
    fresh = _reserve(sched, later, 300.0, False)
    assert fresh.start == 500.0 and domains_of(later.topo, fresh.nodes) == {"d01"}


# After the same first cycle, something breaks the reservation on d00; a cycle reusing forecasts must then
# forecast anew, and gets what a full cycle gets.
@pytest.mark.parametrize(
    ("row", "runs", "now", "start"),
    [
        # A is now expected to end after the reserved start: X starts when A ends
        pytest.param("A" * 18, {"A": Run(end=1500.0)}, 100.0, 1500.0, id="a-job-on-the-layout-ends-later"),
        # a node of the layout went down: X waits for A on the 16 of d00's usable nodes, at the same time
        pytest.param("#" + "A" * 17, {"A": Run(end=1000.0)}, 100.0, 1000.0, id="a-node-of-the-layout-is-down"),
        # a job that ends after the start took a node of the layout (a borrower would be given back)
        pytest.param(
            "E" + "A" * 17, {"A": Run(end=1000.0), "E": Run(end=3000.0)}, 100.0, 1000.0, id="a-job-took-a-node"
        ),
        # the start passed and X still doesn't fit (A overran its estimate): X starts when A ends, now or later
        pytest.param("A" * 18, {"A": Run(end=1000.0)}, 1100.0, 1100.0, id="the-start-passed"),
    ],
)
def test_a_cycle_reusing_forecasts_forecasts_anew_when_the_reservation_broke(row, runs, now, start) -> None:
    sched = Scheduler(CycleConfig(policy="block"))
    first = _reserve(sched, fleet(["A" * 18, "B" * 18], {"A": Run(end=1000.0), "B": Run(end=2000.0)}), 0.0, False)
    assert first.start == 1000.0 and first.nodes == nodes(fleet(["." * 18] * 2).topo, 0, range(16))
    rows, all_runs = [row, "B" * 18], {**runs, "B": Run(end=2000.0)}
    reused = _reserve(sched, fleet(rows, all_runs), now, True)
    fresh = _reserve(Scheduler(CycleConfig(policy="block")), fleet(rows, all_runs), now, False)
    assert (reused.start, reused.nodes) == (fresh.start, fresh.nodes)
    assert reused.start == start and (reused.start, reused.nodes) != (first.start, first.nodes)


def test_a_reservation_made_on_another_topology_is_forecast_anew() -> None:
    # a new inventory generation may renumber nodes: last cycle's layout would name other nodes now
    sched = Scheduler(CycleConfig(policy="block"))
    first = fleet(["A" * 18, "B" * 18], {"A": Run(end=1000.0), "B": Run(end=2000.0)})
    _reserve(sched, first, 0.0, False)
    names = first.topo.node_names
    renumbered = Topology(["domain"], [NodeSpec(n, 4, (n[:3],)) for n in names[18:] + names[:18]])
    later = ClusterState(renumbered)
    # the same jobs on the same nodes, B now expected to end at 900: the old indices 0-15 are d01's nodes now,
    # all clear by 1000, so a kept reservation would look valid there; forecast anew, X starts on d01 at 900
    for job_id, (lo, end) in {"A": (18, 1000.0), "B": (0, 900.0)}.items():
        later.allocate(Allocation(job_id, tuple(range(lo, lo + 18)), (15,) * 18, expected_end=end))
    reused = _reserve(sched, later, 100.0, True)
    assert reused.start == 900.0 and {renumbered.node_names[n][:3] for n in reused.nodes} == {"d01"}
