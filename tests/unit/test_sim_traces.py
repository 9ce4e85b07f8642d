"""Trace loaders: every format, every kind of bad row (counted with its reason), malformed files (line number)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.sim.fleet import FleetConfig
from shared.sim.mapping import MappingConfig, map_job, map_jobs, mix, offered_load, scale_to_load, window
from shared.sim.traces import (
    DATA_TRACES,
    DEFAULT_FILES,
    TRACES_ENV,
    TraceFormatError,
    TraceJob,
    load_trace,
    resolve_path,
    trace_folder,
    write_canonical,
)

FIXTURES = Path(__file__).parent / "sim_fixtures"
CARRIED = ("philly", "kalos")  # in the repository's data/traces
ALIBABA = ("alibaba-openb", "alibaba-spot")  # not carried: synthetic fixtures, real files only via $RACKSCALE_TRACES


def test_canonical_bad_rows_are_counted_with_reasons() -> None:
    t = load_trace(FIXTURES / "canonical_bad_rows.csv")
    assert t.fmt == "canonical"
    assert [j.job_id for j in t.jobs] == ["ok1", "dup"]
    assert t.rows == 6
    assert dict(t.skipped) == {
        "duplicate job_id": 1,
        "negative submit time": 1,
        "no GPUs": 1,
        "duration not positive": 1,
    }
    assert t.skipped_lines["duplicate job_id"] == [4]


@pytest.mark.parametrize(
    ("name", "line", "words"),
    [
        ("canonical_short_row.csv", 3, "4 fields, the header has 5"),
        ("canonical_bad_number.csv", 4, "column gpus: 'four' is not a number"),
        ("philly_bad_time.csv", 3, "column timestamp"),
        ("unknown_header.csv", 1, "unknown header"),
    ],
)
def test_malformed_files_name_the_line(name: str, line: int, words: str) -> None:
    with pytest.raises(TraceFormatError) as err:
        load_trace(FIXTURES / name)
    assert err.value.line == line
    assert words in str(err.value)
    assert f"{name}:{line}:" in str(err.value)


def test_forced_format_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="lacks columns"):
        load_trace(FIXTURES / "philly_small.csv", "kalos")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(TraceFormatError, match="empty file"):
        load_trace(empty)


def test_philly() -> None:
    t = load_trace(FIXTURES / "philly_small.csv")
    assert t.fmt == "philly"
    assert dict(t.skipped) == {"duration not positive": 1, "no GPUs": 1}
    # submit is relative to the earliest kept timestamp (06:13:03); rows sorted by submit
    assert [(j.job_id, j.submit_s, j.gpus, j.tenant) for j in t.jobs] == [
        ("philly-3", 0.0, 8, "6214e9"),
        ("philly-2", 48 * 60 + 52.0, 1, "11cb48"),
    ]


def test_kalos() -> None:
    t = load_trace(FIXTURES / "kalos_small.csv")
    assert t.fmt == "kalos"
    assert [(j.job_id, j.gpus, j.tenant, j.kind) for j in t.jobs] == [
        ("kalos-0", 64, "llm", "Other_or_SFT"),
        ("kalos-3", 1024, "llm", "Pretrain"),
    ]
    assert t.skipped["duration not positive"] == 1
    assert sum(v for k, v in t.skipped.items() if k.startswith("state FAILED")) == 1


def test_alibaba_openb() -> None:
    # the fixture is a folder like the real trace's: the loader picks openb_pod_list_default.csv in it
    t = load_trace(FIXTURES / "alibaba-openb")
    assert t.fmt == "alibaba-openb"
    assert t.rows == 8
    # submit = creation_time, duration = deletion - scheduled, tenant = QoS; sorted by submit
    assert [(j.job_id, j.submit_s, j.gpus, j.duration_s, j.tenant) for j in t.jobs] == [
        ("synth-pod-06", 40.0, 1, 710.0, "LS"),  # GPU-sharing (500 milli-GPU): a whole GPU
        ("synth-pod-01", 100.0, 1, 3540.0, "LS"),
        ("synth-pod-02", 200.0, 1, 1200.0, "BE"),  # GPU-sharing (250 milli-GPU): a whole GPU
        ("synth-pod-05", 1000.0, 8, 7700.0, "Burstable"),
    ]
    assert dict(t.notes) == {"GPU-sharing pod counted as 1 whole GPU": 2}
    assert dict(t.skipped) == {
        "no GPUs (CPU-only pod)": 2,  # a CPU-only pending pod counts as CPU-only
        "never ran (phase Pending, no scheduled_time)": 1,
        "duration not positive": 1,
    }
    assert t.skipped_lines == {
        "no GPUs (CPU-only pod)": [4, 9],
        "never ran (phase Pending, no scheduled_time)": [5],
        "duration not positive": [8],
    }


def test_alibaba_spot() -> None:
    t = load_trace(FIXTURES / "alibaba-spot")
    assert t.fmt == "alibaba-spot"
    assert t.rows == 8
    # gpus = gpu_request x worker_num; Spot jobs priority -1; tenant = organization; sorted by submit
    assert [(j.job_id, j.submit_s, j.gpus, j.duration_s, j.priority, j.tenant, j.kind) for j in t.jobs] == [
        ("spot-900001", 0.0, 32, 7200.0, 0, "org3", "HP"),
        ("spot-900007", 10.0, 8, 86400.0, 0, "org9", "HP"),
        ("spot-900003", 30.0, 64, 3600.0, -1, "org5", "Spot"),
        ("spot-900002", 60.0, 1, 1800.0, -1, "org5", "Spot"),
    ]
    assert dict(t.skipped) == {
        "duplicate job_name": 1,
        "fractional GPUs per worker": 1,
        "duration not positive": 1,
        "no GPUs": 1,
    }


def test_alibaba_fixtures_use_the_real_file_names() -> None:
    for name in ALIBABA:
        assert resolve_path(FIXTURES / name) == FIXTURES / name / DEFAULT_FILES[name]


def test_canonical_round_trip(tmp_path: Path) -> None:
    jobs = [
        TraceJob(
            "a", 0.0, 16, 10.0, "t", gpus_per_node=4, nvlink="required", segment=2, priority=3, checkpointable=True
        )
    ]
    write_canonical(jobs, tmp_path / "c.csv")
    back = load_trace(tmp_path / "c.csv").jobs
    assert [(j.job_id, j.gpus, j.gpus_per_node, j.nvlink, j.segment, j.priority, j.checkpointable) for j in back] == [
        ("a", 16, 4, "required", 2, 3, True)
    ]


@pytest.mark.parametrize(
    ("gpus", "nodes", "need", "segment", "unit"),
    [
        (1, 1, "none", None, 1),
        (2, 1, "none", None, 1),
        (8, 2, "required", None, 2),
        (12, 3, "required", None, 3),
        (32, 8, "required", 4, 4),
        (64, 16, "required", 4, 4),
        (128, 32, "required", 16, 16),
        (504, 128, "required", 16, 16),  # 16 doesn't divide 126 nodes: padded to 128, as users do
        (1024, 256, "required", 16, 16),
    ],
)
def test_mapping_to_nvl72(gpus: int, nodes: int, need: str, segment: int | None, unit: int) -> None:
    import random
    from collections import Counter

    job = map_job(TraceJob("j", 0.0, gpus, 100.0, "t"), MappingConfig(), random.Random(1), Counter())
    assert (job.nodes, str(job.spec.nvlink), job.spec.segment, job.unit_nodes) == (nodes, need, segment, unit)
    assert job.gpus * job.duration_s == pytest.approx(gpus * 100.0)  # padded or not: the same work
    assert job.large == (nodes >= 16)
    assert job.ckpt_cost_s == 30 + 0.5 * job.gpus  # the GPUs it holds (padding included)
    if nodes > 16:
        assert job.spec.checkpointable


def test_a_segment_that_doesnt_divide_the_job_pads_it_or_takes_the_largest_divisor() -> None:
    import random
    from collections import Counter

    notes: Counter[str] = Counter()
    row = TraceJob("j", 0.0, 504, 100.0, "t")  # 126 nodes, segment 16
    padded = map_job(row, MappingConfig(exact_estimates=True), random.Random(1), notes)
    assert (padded.nodes, padded.gpus, padded.spec.segment) == (128, 512, 16)
    assert padded.duration_s == pytest.approx(100.0 * 126 / 128) == padded.spec.expected_runtime_s
    old = map_job(row, MappingConfig(pad_segments=False), random.Random(1), notes)
    assert (old.nodes, old.spec.segment, old.duration_s) == (126, 14, 100.0)
    assert notes == {
        "padded to whole segments of 16 nodes": 1,
        "segment 16 doesn't divide the node count: largest divisor used": 1,
    }


def test_estimates_are_noisy_and_seeded() -> None:
    rows = [TraceJob(f"j{i}", float(i), 4, 1000.0, "t") for i in range(200)]
    topo = FleetConfig(domains=2).topology()
    a = map_jobs(rows, MappingConfig(), topo, seed=1).jobs
    b = map_jobs(rows, MappingConfig(), topo, seed=1).jobs
    c = map_jobs(rows, MappingConfig(), topo, seed=2).jobs
    est = [j.spec.expected_runtime_s for j in a]
    assert est == [j.spec.expected_runtime_s for j in b]
    assert est != [j.spec.expected_runtime_s for j in c]
    assert all(e != 1000.0 for e in est)
    assert 1200 < sorted(est)[100] < 1800  # median 1.5x
    exact = map_jobs(rows, MappingConfig(exact_estimates=True), topo, seed=1).jobs
    assert all(j.spec.expected_runtime_s == 1000.0 for j in exact)
    share = sum(j.spec.checkpointable for j in a) / len(a)
    assert 0.35 < share < 0.65


def test_jobs_too_big_for_the_fleet_are_skipped_with_reason() -> None:
    rows = [TraceJob("big", 0.0, 1024, 10.0, "t"), TraceJob("ok", 0.0, 8, 10.0, "t")]
    m = map_jobs(rows, MappingConfig(), FleetConfig(domains=2).topology(), seed=1)
    assert [j.id for j in m.jobs] == ["ok"]
    assert sum(m.skipped.values()) == 1 and "can't be placed on this fleet" in next(iter(m.skipped))


def test_load_scaling_window_and_mix() -> None:
    rows = [TraceJob(f"j{i}", i * 100.0, 4, 50.0, "t") for i in range(101)]
    scaled, factor = scale_to_load(rows, 8, 0.5)
    assert offered_load(scaled, 8) == pytest.approx(0.5, rel=1e-6)
    assert factor == pytest.approx(0.5)  # 4 GPUs x 50 s per 100 s on 8 GPUs is 0.25 as recorded
    with pytest.raises(ValueError, match="at most"):
        scale_to_load(rows, 8, 1000.0)
    w = window(rows, 1000.0, 2000.0)
    assert len(w) == 10 and w[0].submit_s == 0.0
    other = [TraceJob(f"k{i}", i * 10.0, 8, 5.0, "llm") for i in range(11)]
    merged = mix([rows, other])
    assert len(merged) == 112
    assert max(j.submit_s for j in merged if j.tenant == "llm") == pytest.approx(10000.0)


@pytest.mark.parametrize(("name", "jobs"), [("philly", 82_247), ("kalos", 319)])
def test_carried_traces_are_whole(name: str, jobs: int) -> None:
    """data/traces holds the real files, complete (not a Git LFS pointer, not cut short)."""
    t = load_trace(DATA_TRACES / name)
    assert t.fmt == name
    assert t.rows == len(t.jobs) == jobs
    assert not t.skipped


def _smoke_cases() -> list:
    """The carried traces and the Alibaba fixtures always; and whatever real trace folders $RACKSCALE_TRACES
    holds (e.g. the real Alibaba ones), only those that exist."""
    cases = [pytest.param(DATA_TRACES / n, n, id=f"data-{n}") for n in CARRIED]
    cases += [pytest.param(FIXTURES / n, n, id=f"fixture-{n}") for n in ALIBABA]
    env = os.environ.get(TRACES_ENV)
    if env:
        cases += [pytest.param(Path(env) / n, n, id=f"env-{n}") for n in DEFAULT_FILES if (Path(env) / n).is_dir()]
    return cases


@pytest.mark.parametrize(("folder", "fmt"), _smoke_cases())
def test_real_trace_smoke(folder: Path, fmt: str) -> None:
    file = resolve_path(folder)
    with file.open(encoding="utf-8") as fh:
        data_rows = sum(1 for line in fh if line.strip()) - 1
    t = load_trace(folder, limit=300)
    assert t.fmt == fmt
    assert t.rows == min(300, data_rows)
    assert len(t.jobs) + sum(t.skipped.values()) == t.rows
    assert t.jobs and all(j.gpus > 0 and j.duration_s > 0 for j in t.jobs)


def test_traces_env_names_a_folder() -> None:
    """$RACKSCALE_TRACES is optional; when set, a wrong path fails here instead of quietly adding no case."""
    env = os.environ.get(TRACES_ENV)
    if env:
        assert Path(env).is_dir(), f"{TRACES_ENV}={env} is not a folder"


def test_trace_folder_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACES_ENV, raising=False)
    assert trace_folder("philly") == DATA_TRACES / "philly"
    with pytest.raises(FileNotFoundError, match=TRACES_ENV):
        trace_folder("alibaba-openb")
    (tmp_path / "alibaba-openb").mkdir()
    monkeypatch.setenv(TRACES_ENV, str(tmp_path))
    assert trace_folder("alibaba-openb") == tmp_path / "alibaba-openb"
    assert trace_folder("philly") == DATA_TRACES / "philly"  # not in $RACKSCALE_TRACES: the carried copy
    # an explicit folder (e.g. bench --traces) is the only place looked
    assert trace_folder("alibaba-openb", tmp_path) == tmp_path / "alibaba-openb"
    with pytest.raises(FileNotFoundError):
        trace_folder("philly", tmp_path)
