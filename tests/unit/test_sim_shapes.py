"""Flexible segments and elastic gangs in the simulator, on real traces: every large job flexible
(`--flexible-share 1`) or elastic (`--elastic-share 1`). Each attempt runs with one of the job's segment
sizes and, for an elastic job, a size in its range in whole segments, each segment inside one NVLink domain;
a smaller layout is charged the communication model's outer term; the baselines use the first-listed size
and never resize; GPU-seconds are conserved; with shares of 0 nothing changes."""

from __future__ import annotations

import itertools

import pytest

from shared.core import segments
from shared.sim.engine import SimConfig, SimResult, simulate
from shared.sim.mapping import MappingConfig, map_jobs, mix, scale_to_load
from shared.sim.metrics import compute, finished_work, gpu_seconds_balance
from shared.sim.traces import DATA_TRACES, load_trace
from tests.unit.test_sim_conservation import FAILS, FLEET

FLEXIBLE = MappingConfig(flexible_share=1.0)


def workload() -> list:
    """Philly's first 300 jobs as background and Kalos's jobs of 96-256 GPUs (24-64 nodes): the large ones."""
    philly = load_trace(DATA_TRACES / "philly", limit=300).jobs
    kalos = [j for j in load_trace(DATA_TRACES / "kalos").jobs if 64 < j.gpus <= 256][:16]
    jobs, _ = scale_to_load(mix([philly, kalos]), FLEET.gpus, 0.9)
    return jobs


@pytest.fixture(scope="module")
def jobs() -> list:
    mapped = map_jobs(workload(), FLEXIBLE, FLEET.topology(), seed=3)
    assert mapped.notes["flexible segments"] > 0
    return mapped.jobs


def _run(jobs: list, policy: str, migration: bool = False) -> SimResult:
    cfg = SimConfig(
        policy=policy,
        seed=3,
        fleet=FLEET,
        failures=FAILS,
        check_state=True,
        cycle_interval_s=10.0,
        queue_depth=50,
        migration=migration,
    )
    return simulate(jobs, cfg)


def _check_layouts(res: SimResult, smaller_allowed: bool) -> int:
    """Every attempt inside its job's declared shapes; returns how many ran on a smaller segment."""
    topo = FLEET.topology()
    dom = topo.node_group[topo.domain]
    model = res.config.slowdown
    smaller = 0
    for a in res.attempts:
        job = res.jobs[a.job].job
        spec = job.spec
        if spec.segment is None:
            continue
        assert a.segment in segments(spec), (spec.id, a.segment)
        for i in range(0, len(a.nodes), a.segment):
            assert len({dom[n] for n in a.nodes[i : i + a.segment]}) == 1, (spec.id, "a segment spans domains")
        if a.segment != spec.segment:
            smaller += 1
            assert smaller_allowed, (spec.id, res.config.policy)
            outer = model.cross_share([dom[n] for n in a.nodes], spec.segment)
            assert a.slowdown == pytest.approx(model.factor(0.0, outer))
            assert a.slowdown <= model.layout_factor(spec.segment, a.segment) + 1e-12
    return smaller


@pytest.mark.parametrize("migration", [False, True], ids=["plain", "migration"])
def test_rackscale_runs_flexible_jobs_inside_their_shapes(jobs: list, migration: bool) -> None:
    res = _run(jobs, "rackscale", migration)
    smaller = _check_layouts(res, smaller_allowed=True)
    assert smaller > 0  # the workload reaches the case
    if migration:
        # consolidation moved flexible jobs off their smaller layouts onto their first-listed segments
        assert res.migration is not None and res.migration.consolidations > 0
        by_job: dict[int, list] = {}
        for a in sorted(res.attempts, key=lambda a: a.start):
            by_job.setdefault(a.job, []).append(a)
        onto = 0
        for i, atts in by_job.items():
            first = res.jobs[i].job.spec.segment
            for a, b in itertools.pairwise(atts):
                if a.outcome == "moved" and a.segment != first and b.segment == first and a.end == b.start:
                    onto += 1
        assert onto > 0
    m = compute(res)
    assert 0.0 < m["smaller_layout_share"] < 1.0
    bal = gpu_seconds_balance(res)
    assert bal["allocated"] == pytest.approx(bal["useful"] + bal["lost"] + bal["overhead"] + bal["slowdown"], rel=1e-9)
    assert res.state_checks == res.batches


def test_block_uses_only_the_first_listed_segment(jobs: list) -> None:
    res = _run(jobs, "block")
    assert _check_layouts(res, smaller_allowed=False) == 0
    assert compute(res)["smaller_layout_share"] == 0.0


def test_a_share_of_zero_changes_nothing() -> None:
    rows = workload()
    rigid = map_jobs(rows, MappingConfig(), FLEET.topology(), seed=3).jobs
    zero = map_jobs(rows, MappingConfig(flexible_share=0.0), FLEET.topology(), seed=3).jobs
    assert rigid == zero
    assert not any(j.spec.fallback_segments for j in zero)


def test_flexible_jobs_are_the_same_whatever_else_the_share_changes() -> None:
    """A job flexible at 25% is flexible at 50%; the other draws (estimates, checkpoints) stay the same."""
    rows = workload()
    topo = FLEET.topology()
    quarter = map_jobs(rows, MappingConfig(flexible_share=0.25), topo, seed=3).jobs
    half = map_jobs(rows, MappingConfig(flexible_share=0.5), topo, seed=3).jobs
    flex_q = {j.id for j in quarter if j.spec.fallback_segments}
    flex_h = {j.id for j in half if j.spec.fallback_segments}
    assert flex_q < flex_h
    for a, b in zip(quarter, half, strict=True):
        assert a.spec.expected_runtime_s == b.spec.expected_runtime_s
        assert a.spec.checkpointable == b.spec.checkpointable


ELASTIC = MappingConfig(elastic_share=1.0)


@pytest.fixture(scope="module")
def elastic_jobs() -> list:
    mapped = map_jobs(workload(), ELASTIC, FLEET.topology(), seed=3)
    assert mapped.notes["elastic"] > 0 and not mapped.notes["flexible segments"]
    return mapped.jobs


def _check_sizes(res: SimResult) -> dict[str, int]:
    """Every elastic attempt inside its range, whole segments each in one domain; outcomes counted."""
    topo = FLEET.topology()
    dom = topo.node_group[topo.domain]
    outcomes: dict[str, int] = {}
    for a in res.attempts:
        spec = res.jobs[a.job].job.spec
        if spec.elastic is None:
            continue
        per_node = spec.gpus // res.jobs[a.job].job.nodes
        least, most = spec.elastic
        assert least <= a.gpus <= most and a.gpus == len(a.nodes) * per_node, (spec.id, a.gpus)
        seg = spec.segment or 1
        assert len(a.nodes) % seg == 0
        for i in range(0, len(a.nodes), seg):
            assert len({dom[n] for n in a.nodes[i : i + seg]}) == 1, (spec.id, "a segment spans domains")
        assert a.rate == pytest.approx(len(a.nodes) * per_node / most)
        outcomes[a.outcome] = outcomes.get(a.outcome, 0) + 1
    return outcomes


def test_rackscale_grows_and_shrinks_elastic_jobs_inside_their_ranges(elastic_jobs: list) -> None:
    res = _run(elastic_jobs, "rackscale", migration=True)
    outcomes = _check_sizes(res)
    assert res.grows > 0, outcomes  # the workload reaches the case
    bal = gpu_seconds_balance(res)
    assert bal["allocated"] == pytest.approx(bal["useful"] + bal["lost"] + bal["overhead"] + bal["slowdown"], rel=1e-9)
    for job_id, kept, duration in finished_work(res):
        assert kept == pytest.approx(duration, abs=1e-6), job_id
    assert res.state_checks == res.batches


def test_block_never_resizes(elastic_jobs: list) -> None:
    res = _run(elastic_jobs, "block", migration=True)
    outcomes = _check_sizes(res)
    assert res.grows == res.shrinks == 0 and "resized" not in outcomes
