"""`rackscale sim` end to end on a fixture: report.json (means + spreads with --seeds), report.md, plots,
identical numbers for the same seeds, and errors for malformed traces."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from services.cli import sim_cmd
from shared.sim.metrics import HEADLINE

FIXTURES = Path(__file__).parent / "sim_fixtures"


def run_cli(out: Path, *extra: str) -> int:
    return sim_cmd.main(
        [
            "--trace",
            str(FIXTURES / "backfill.csv"),
            "--domains",
            "2",
            "--nodes-per-domain",
            "4",
            "--policy",
            "flat,tree,block,rackscale",
            "--out",
            str(out),
            "--quiet",
            *extra,
        ]
    )


def test_seeds_give_means_and_spreads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(tmp_path / "a", "--seeds", "1,2,3", "--load", "0.5", "--cycle-interval", "0") == 0
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert set(report["policies"]) == {"flat", "tree", "block", "rackscale"}
    for pol, metrics in report["policies"].items():
        assert set(HEADLINE) <= set(metrics)
        assert report["spread"][pol]["occupancy"]["n"] == 3
        assert set(report["per_seed"][pol]) == {"1", "2", "3"}
    assert report["parameters"]["load"] == 0.5 and report["parameters"]["seeds"] == [1, 2, 3]
    assert report["parameters"]["lend_reserved"] == "auto" and report["parameters"]["lend_min_nodes"] == 4
    md = (tmp_path / "a" / "report.md").read_text()
    assert "| metric | flat | tree | block | rackscale |" in md and "±" in md
    for png in ("occupancy.png", "wait_cdf.png", "free_runs.png"):
        assert (tmp_path / "a" / png).read_bytes()[:4] == b"\x89PNG"
    assert "occupancy" in capsys.readouterr().out


def test_same_seed_identical_report(tmp_path: Path) -> None:
    for d in ("x", "y"):
        assert run_cli(tmp_path / d, "--seed", "7", "--no-plots") == 0
    x, y = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("x", "y"))
    x.pop("timing"), y.pop("timing")
    assert x == y


def test_malformed_trace_is_an_error_with_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = sim_cmd.main(["--trace", str(FIXTURES / "canonical_bad_number.csv"), "--out", str(tmp_path), "--quiet"])
    assert rc == 2
    assert "canonical_bad_number.csv:4:" in capsys.readouterr().err


def test_add_parser_wires_a_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="rackscale")
    sub = parser.add_subparsers(dest="command")
    sim_cmd.add_parser(sub)
    args = parser.parse_args(["sim", "--trace", "t.csv", "--out", "o", "--seeds", "1,2", "--policy", "block"])
    assert args.command == "sim" and args.seeds == (1, 2) and args.policy == "block"
    assert sim_cmd.run is not None


def test_lending_flags_reach_the_core() -> None:
    parser = argparse.ArgumentParser(prog="rackscale")
    sim_cmd.add_arguments(parser)
    base = ["--trace", "t.csv", "--out", "o", "--policy", "rackscale"]
    exp = sim_cmd.build_experiment(parser.parse_args(base))
    cfg = exp.sim.cycle_config()
    assert cfg.lend_checkpointable is None and cfg.lend_min_nodes == 4  # rackscale's choice: lends from 4 nodes
    exp = sim_cmd.build_experiment(parser.parse_args([*base, "--lend-reserved", "off", "--lend-min-nodes", "2"]))
    assert exp.sim.cycle_config().lend_checkpointable is False and exp.sim.cycle_config().lend_min_nodes == 2
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--lend-min-nodes", "0"])


def test_a_standard_workload_names_its_traces_and_windows(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="rackscale")
    sim_cmd.add_arguments(parser)
    exp = sim_cmd.build_experiment(parser.parse_args(["--workload", "heavy", "--out", "o", "--limit", "10"]))
    assert [(Path(t.path).name, t.window_days, t.limit) for t in exp.traces] == [
        ("kalos", (0, 91), 10),
        ("philly", (14, 104), 10),
    ]
    for bad in (["--out", "o"], ["--workload", "light", "--trace", "t.csv", "--out", "o"]):
        with pytest.raises(SystemExit, match="either --workload or --trace"):
            sim_cmd.build_experiment(parser.parse_args(bad))
    with pytest.raises(SystemExit, match="no --format or --window-days"):
        sim_cmd.build_experiment(parser.parse_args(["--workload", "philly", "--window-days", "1:2", "--out", "o"]))
    # the repository's traces are found from any directory; the yardstick runs beside the others
    rc = sim_cmd.main(["--workload", "philly", "--limit", "200", "--domains", "2", "--policy", "block,ceiling",
                       "--seeds", "1,2", "--out", str(tmp_path), "--quiet", "--no-plots"])  # fmt: skip
    report = json.loads((tmp_path / "report.json").read_text())
    assert rc == 0 and all(v == 1.0 for v in report["headroom"]["ceiling"]["captured_per_seed"].values())
    assert "work_jct_mean" in report["policies"]["block"]
    assert "goodput / block's" in (tmp_path / "report.md").read_text()


def test_a_policy_with_the_migration_planner_beside_ones_without(tmp_path: Path) -> None:
    """`rackscale+migration` runs that policy with the planner; block and ceiling beside it run without, so the
    headroom compares rackscale's whole stack with Slurm's block in one report."""
    extra = ("--policy", "block,ceiling,rackscale+migration", "--seed", "3", "--no-plots")
    assert run_cli(tmp_path / "m", *extra) == 0
    report = json.loads((tmp_path / "m" / "report.json").read_text())
    assert set(report["policies"]) == {"block", "ceiling", "rackscale+migration"}
    assert "moves_per_day" in report["policies"]["rackscale+migration"]
    assert "moves_per_day" not in report["policies"]["block"]
    assert set(report["headroom"]) == {"block", "ceiling", "rackscale+migration"}
    assert "| defragmentation moves |" in (tmp_path / "m" / "report.md").read_text()


@pytest.mark.parametrize("bad", ["rackscale+defrag", "nope+migration"])
def test_an_unknown_policy_variant_is_refused(bad: str, tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown policy"):
        run_cli(tmp_path / "u", "--policy", bad)
