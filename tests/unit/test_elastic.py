"""Elastic gangs in the cycle (shared/core/cycle.py, step 6): a job with a GPU range starts at the largest
size that fits, goes on at its least when none does, and under rackscale running elastic jobs are shrunk by
whole units (a `Resize`) before anything is preempted. Sketches: one row per NVL72 domain of 18 nodes x 4
GPUs, a letter a running job on the whole node (`Run(elastic=(least nodes, unit))` marks an elastic one)."""

from __future__ import annotations

import pytest

from shared.core import (
    Allocate,
    CycleConfig,
    Preempt,
    Reserve,
    Resize,
    Scheduler,
    ShapeError,
    request,
    with_size,
)
from tests.unit.cycle_builders import INF, Run, cycle, domains_of, fleet, job


def elastic(job_id: str, least: int, most: int, **kw: object) -> object:
    kw.setdefault("checkpointable", True)
    return job(job_id, most, elastic=(least, most), **kw)


@pytest.mark.parametrize("policy", ["rackscale", "block"])
@pytest.mark.parametrize(
    ("segment", "nodes"),
    [pytest.param(None, 10, id="by-node"), pytest.param(4, 8, id="by-segment-of-4")],
)
def test_starts_at_the_largest_size_that_fits(policy: str, segment: int | None, nodes: int) -> None:
    """10 free nodes, a job of 4-16 nodes: 10 by node, 8 in segments of 4; every policy (Slurm's MIN-MAX)."""
    state = fleet(["AAAAAAAA .........."])
    spec = elastic("E", 16, 64, segment=segment, expected_runtime_s=1000.0)
    (d,) = cycle(state, [spec], config=CycleConfig(policy=policy)).decisions
    assert isinstance(d, Allocate) and len(d.nodes) == nodes
    assert d.expected_end == pytest.approx(1000.0 * 16 / nodes)  # the same work on fewer GPUs
    assert state.allocs["E"].elastic == (4, segment or 1)
    state.check()


def test_nothing_fits_reserves_at_its_least_size() -> None:
    state = fleet(["AAAAAAAAAAAAAAAAA ."], {"A": Run(end=100.0)})
    (d,) = cycle(state, [elastic("E", 16, 64, expected_runtime_s=1000.0)]).decisions
    assert isinstance(d, Reserve) and len(d.nodes) == 4 and d.start == 100.0
    assert "needs 4 nodes in one NVLink domain" in d.reason
    assert "elastic 16-64 GPUs: no size fits now, it waits at its least" in d.reason


def test_a_higher_priority_job_shrinks_an_elastic_one_instead_of_preempting_it() -> None:
    """E holds all 18 nodes (least 4, by node); H (8 nodes, priority 5) makes E give up its last 8 nodes."""
    state = fleet(["E" * 18], {"E": Run(end=10_000.0, checkpointable=True, elastic=(4, 1))})
    e_nodes = state.allocs["E"].nodes
    result = cycle(state, [job("H", 32, priority=5, expected_runtime_s=100.0)])
    resize, alloc = result.decisions
    assert isinstance(resize, Resize) and resize.job_id == "E" and resize.for_job == "H"
    assert resize.nodes == e_nodes[:10]  # a prefix: its first ranks keep their places
    assert resize.expected_end == pytest.approx(10_000.0 * 18 / 10)
    assert "shrunk from 18 to 10 nodes to make room for job H" in resize.reason
    assert isinstance(alloc, Allocate) and set(alloc.nodes) == set(e_nodes[10:])
    assert not result.of(Preempt)
    assert len(state.allocs["E"].nodes) == 10
    state.check()


def test_block_preempts_the_elastic_job_instead() -> None:
    state = fleet(["E" * 18], {"E": Run(end=10_000.0, checkpointable=True, elastic=(4, 1))})
    result = cycle(state, [job("H", 32, priority=5)], config=CycleConfig(policy="block"))
    assert [type(d) for d in result.decisions] == [Preempt, Allocate]


def test_shrinks_by_whole_segments_and_never_below_the_least() -> None:
    """E: 16 nodes in segments of 8, least 8. H needs 12 nodes: E at 8 leaves 10 free -- not enough, so
    nothing is shrunk and H waits (or preempts: H is higher priority; preemption is off here)."""
    state = fleet(["EEEEEEEEEEEEEEEE .."], {"E": Run(end=INF, checkpointable=True, elastic=(8, 8))})
    result = cycle(state, [job("H", 48, priority=5)], config=CycleConfig(preemption=False))
    assert not result.of(Resize) and not result.of(Allocate)
    assert len(state.allocs["E"].nodes) == 16
    state.check()
    # 10 nodes are enough: one segment goes
    result = cycle(state, [job("H2", 40, priority=5)], config=CycleConfig(preemption=False))
    (resize,) = result.of(Resize)
    assert len(resize.nodes) == 8


def test_an_equal_priority_job_shrinks_it_only_once_reserved() -> None:
    """R (8 nodes) reserved in the first cycle; in the next it takes the room from E by shrinking it."""
    state = fleet(["E" * 18], {"E": Run(end=50_000.0, checkpointable=True, elastic=(4, 1))})
    sched = Scheduler(CycleConfig())
    first = sched.cycle(state, [job("R", 32, expected_runtime_s=100.0)], 0.0)
    assert [type(d) for d in first.decisions] == [Reserve]
    second = sched.cycle(state, [job("R", 32, expected_runtime_s=100.0)], 10.0)
    assert [type(d) for d in second.decisions] == [Resize, Allocate]
    assert domains_of(state.topo, second.decisions[1].nodes) == {"d00"}


SHAPE_ERRORS = [
    pytest.param({"checkpointable": False}, "min_gpus", "must be checkpointable", id="not-checkpointable"),
    pytest.param({"least": 18}, "min_gpus", "not a whole number of nodes", id="least-not-whole-nodes"),
    pytest.param({"segment": 8, "least": 16}, "min_gpus", "not a whole number of segments of 8", id="least-segments"),
    pytest.param({"least": 128}, "min_gpus", "more than gpus 64", id="least-above-most"),
    pytest.param({"segment": 8, "fallback_segments": (4,)}, "min_gpus", "one segment size", id="with-flexible"),
]


@pytest.mark.parametrize(("kw", "field", "phrase"), SHAPE_ERRORS)
def test_shape_errors(kw: dict[str, object], field: str, phrase: str) -> None:
    least = kw.pop("least", 16)
    spec = elastic("E", least, 64, **kw)  # type: ignore[arg-type]
    with pytest.raises(ShapeError) as e:
        request(spec, fleet(["." * 18]).topo)  # type: ignore[arg-type]
    assert (e.value.field, phrase in e.value.message) == (field, True), str(e.value)


def test_sizes_run_largest_first_down_to_the_least() -> None:
    spec = elastic("E", 16, 64, segment=4, expected_runtime_s=600.0)
    req = request(spec, fleet(["." * 18]).topo)  # type: ignore[arg-type]
    assert [r.nodes for r in req.sizes] == [12, 8, 4]
    assert [r.job.expected_runtime_s for r in req.sizes] == [800.0, 1200.0, 2400.0]
    assert with_size(spec, 64) is spec  # type: ignore[arg-type]
