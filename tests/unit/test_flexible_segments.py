"""Flexible segments in the cycle (shared/core/cycle.py, step 5): a job lists segment sizes, preferred first.

Fleets are sketches (`cycle_builders.fleet`): one row per NVL72 domain of 18 nodes x 4 GPUs, a letter a
running job on the whole node. The job under test, X, is 16 nodes (64 GPUs) with segments [16, 8] unless a
case says otherwise; with the default model a layout of 8s runs at most 1 + 0.005 x 0.5 x 35 = 1.0875x slower.
"""

from __future__ import annotations

import pytest

from shared.core import Allocate, CycleConfig, Pending, Reserve, ShapeError, SlowdownModel, request
from shared.core.topology import Topology
from tests.unit.cycle_builders import INF, Run, cycle, fleet, job

# two domains of 10 busy nodes and 8 free: no run of 16, two runs of 8
TWO_EIGHTS = ["AAAAAAAAAA ........", "BBBBBBBBBB ........"]


def _runs(end: float) -> dict[str, Run]:
    return {"A": Run(end=end), "B": Run(end=end)}


def _x(runtime: float, segment: tuple[int, ...] = (16, 8), gpus: int = 64) -> object:
    return job("X", gpus, segment=segment[0], fallback_segments=segment[1:], expected_runtime_s=runtime)


def _per_domain(topo: Topology, d: Allocate, segment: int) -> list[int]:
    """Each consecutive segment's domains (one per segment when every segment is whole)."""
    dom = topo.node_group[topo.domain]
    chunks = [d.nodes[i : i + segment] for i in range(0, len(d.nodes), segment)]
    return [len({dom[n] for n in c}) for c in chunks]


CASES = [
    # no expected end for A and B: the preferred layout has no forecast start, the 8s start now
    pytest.param(TWO_EIGHTS, _runs(INF), 10_000.0, 8, id="preferred-never-forecast"),
    # A and B end in 5,000 s; 8s cost 10,000 x 0.0875 = 875 s more: start now
    pytest.param(TWO_EIGHTS, _runs(5_000.0), 10_000.0, 8, id="smaller-ends-sooner"),
    # A and B end in 50 s: waiting 50 s beats 875 s of slowdown; reserve the 16
    pytest.param(TWO_EIGHTS, _runs(50.0), 10_000.0, None, id="waiting-ends-sooner"),
    # the preferred layout fits now: it is taken
    pytest.param(["AA ................", "BBBBBBBBBB ........"], _runs(INF), 10_000.0, 16, id="preferred-fits"),
]


@pytest.mark.parametrize(("rows", "runs", "runtime", "segment"), CASES)
def test_layout_choice(rows: list[str], runs: dict[str, Run], runtime: float, segment: int | None) -> None:
    state = fleet(rows, runs)
    result = cycle(state, [_x(runtime)])
    (d,) = result.decisions
    if segment is None:
        assert isinstance(d, Reserve)
        assert "segments of 8 nodes fit now, but at 1.09x the runtime they would end later" in d.reason
        assert len(d.nodes) == 16
        return
    assert isinstance(d, Allocate)
    assert d.segment == segment
    assert _per_domain(state.topo, d, segment) == [1] * (16 // segment)
    # the scheduler's expected end counts the smaller layout's slowdown
    factor = SlowdownModel().layout_factor(16, segment)
    assert d.expected_end == pytest.approx(runtime * factor)
    state.check()


def test_largest_smaller_segment_that_fits_is_taken() -> None:
    """[16, 8, 4] with only runs of 4 free: the 4s, never the 8s."""
    rows = ["AAAAAAAAAAAAAA ....", "BBBBBBBBBBBBBB ....", "CCCCCCCCCCCCCC ....", "DDDDDDDDDDDDDD ...."]
    state = fleet(rows)
    (d,) = cycle(state, [_x(1000.0, (16, 8, 4))]).decisions
    assert isinstance(d, Allocate) and d.segment == 4
    assert _per_domain(state.topo, d, 4) == [1, 1, 1, 1]


@pytest.mark.parametrize("policy", ["block", "ceiling"])
def test_baselines_wait_for_the_first_listed_segment(policy: str) -> None:
    """Slurm's --segment takes one size: block (and the yardstick) never use the others."""
    state = fleet(TWO_EIGHTS, _runs(5_000.0))
    (d,) = cycle(state, [_x(10_000.0)], config=CycleConfig(policy=policy)).decisions
    assert not isinstance(d, Allocate) or d.segment == 16


def test_a_model_without_outer_cost_always_takes_what_fits_now() -> None:
    """With no traffic between segments (c_outer 0) a smaller layout costs nothing: never wait."""
    state = fleet(TWO_EIGHTS, _runs(1.0))
    config = CycleConfig(comm=SlowdownModel(outer_share=0.0))
    (d,) = cycle(state, [_x(10_000.0)], config=config).decisions
    assert isinstance(d, Allocate) and d.segment == 8


def test_nothing_fits_reserves_the_preferred_layout() -> None:
    state = fleet(["AAAAAAAAAAAAAAAAAA", "BBBBBBBBBBBBBBBBBB"], _runs(100.0))
    (d,) = cycle(state, [_x(1000.0)]).decisions
    assert isinstance(d, Reserve) and d.start == 100.0 and len(d.nodes) == 16


def test_rigid_jobs_carry_their_segment() -> None:
    state = fleet(["." * 18, "." * 18])
    a, b = cycle(state, [job("R", 64, segment=8), job("S", 8)]).decisions
    assert isinstance(a, Allocate) and a.segment == 8
    assert isinstance(b, Allocate) and b.segment is None


SHAPE_ERRORS = [
    pytest.param((8, 16), "largest (preferred) first, each once: 16 after 8", id="increasing"),
    pytest.param((8, 8), "each once: 8 after 8", id="repeated"),
    pytest.param((16, 3), "16 nodes is not a multiple of segment 3", id="fallback-does-not-divide"),
    pytest.param((16, 0), "must be a whole number of at least 1", id="zero"),
]


@pytest.mark.parametrize(("segments", "phrase"), SHAPE_ERRORS)
def test_shape_errors(segments: tuple[int, ...], phrase: str) -> None:
    topo = fleet(["." * 18]).topo
    with pytest.raises(ShapeError, match="segment") as e:
        request(_x(100.0, segments), topo)  # type: ignore[arg-type]
    assert phrase in str(e.value)


def test_fallbacks_without_a_preferred_segment_are_refused() -> None:
    topo = fleet(["." * 18]).topo
    with pytest.raises(ShapeError, match="only after a preferred segment"):
        request(job("X", 64, fallback_segments=(8,)), topo)


def test_pending_flexible_job_is_one_decision() -> None:
    """Whatever it tries, a flexible job gets one final decision per cycle."""
    state = fleet(["AAAAAAAAAAAAAAAAAA"], _runs(INF))
    result = cycle(state, [_x(1000.0)])
    assert [type(d) for d in result.decisions] == [Pending]
