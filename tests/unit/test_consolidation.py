"""`plan_consolidation` (shared/core/consolidation.py) on sketched fleets: a flexible job X of 16 nodes that
prefers segments of 16 runs on two 8s; it is moved onto one domain when a free run of 16 is there and the
move pays. Domains of 18 nodes x 4 GPUs; `X` marks its nodes, other letters other jobs."""

from __future__ import annotations

import pytest

from shared.core import JobSpec, MigrationBudget, Movable, SlowdownModel, get_policy, plan_consolidation
from tests.unit.cycle_builders import Run, domains_of, fleet

SPLIT = ["XXXXXXXX AAAAAAAAAA", "XXXXXXXX BBBBBBBBBB", "..................", "CCCCCCCCCCCCCCCCCC"]
SPEC = JobSpec("X", 64, segment=8, checkpointable=True, expected_runtime_s=36_000.0)
MODEL = SlowdownModel()


def _plan(rows: list[str], end: float = 36_000.0, promised: dict[str, frozenset[int]] | None = None, **kw: object):
    state = fleet(rows, {"X": Run(end=end, checkpointable=True)})
    movable = {"X": Movable(SPEC, 60.0, 60.0, preferred=kw.pop("preferred", 16))}  # type: ignore[arg-type]
    budget = MigrationBudget(**kw)  # type: ignore[arg-type]
    mv = plan_consolidation(state, movable, get_policy("rackscale"), budget, 0.0, MODEL, promised)
    state.check()  # left as it was
    return state, mv


def test_moves_onto_a_free_run_of_its_preferred_size() -> None:
    state, mv = _plan(SPLIT)
    assert mv is not None and mv.job_id == "X" and mv.segment == 16
    assert len(mv.dst.nodes) == 16 and domains_of(state.topo, mv.dst.nodes) == {"d02"}
    assert "preferred segments of 16 nodes (ran on segments of 8)" in mv.reason
    assert mv.cost_gpu_s == 64 * 120.0


def test_not_when_the_rest_of_the_run_is_too_short_to_pay() -> None:
    """Gain: 64 GPUs x remaining x (1 - 1/1.0875); cost 64 x 120 s: pays only past ~1,500 s left."""
    assert _plan(SPLIT, end=1_000.0)[1] is None
    assert _plan(SPLIT, end=2_000.0)[1] is not None


def test_not_into_a_domain_a_reservation_holds() -> None:
    assert _plan(SPLIT, promised={"W": frozenset({2})})[1] is None


def test_not_without_room_for_the_preferred_layout() -> None:
    rows = [*SPLIT[:2], "DDDDDDDD ..........", SPLIT[3]]
    assert _plan(rows)[1] is None


def test_not_when_its_segments_share_a_domain_already() -> None:
    rows = ["XXXXXXXXXXXXXXXX AA", "BBBBBBBBBBBBBBBBBB", "..................", SPLIT[3]]
    assert _plan(rows)[1] is None


def test_not_for_a_job_on_its_preferred_layout() -> None:
    assert _plan(SPLIT, preferred=None)[1] is None


@pytest.mark.parametrize("kw", [{"max_moves": 1, "in_flight": 1}, {"gpu_s_per_hour": 100.0}])
def test_the_budget_holds(kw: dict[str, float]) -> None:
    assert _plan(SPLIT, **kw)[1] is None
