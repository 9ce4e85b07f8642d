"""`rackscale submit -f job.yaml` and `rackscale sbatch script.sh` against a canned gateway (test_cli.py's): what
they send, what they print, and how an error names the file's line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_cli import _Canned, api, run_cli

__all__ = ["api"]  # the fixture, shared with test_cli.py

API = tuple[str, type[_Canned]]
ACCEPTED = (202, b'{"id": "j1", "state": "pending"}')
YAML_JOB = """\
name: train
gpus: 8
topology:
  nvlink: preferred
env:
  A: "1"
"""
SCRIPT = """#!/bin/bash
#SBATCH --job-name=probe
#SBATCH --nodes=2 --gpus-per-node=4
#SBATCH --time=10
echo "$RANK $1"
"""


def sent(handler: type[_Canned]) -> tuple[str, dict[str, str], dict[str, object]]:
    ((method, path, headers, body),) = handler.seen
    assert method == "POST"
    return path, headers, json.loads(body)


@pytest.fixture(autouse=True)
def _tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACKSCALE_TENANT", "team-x")


def test_submit_f_sends_the_files_body_with_the_flags_over_it(api: API, tmp_path: Path) -> None:
    url, handler = api
    handler.routes[("POST", "/v1/jobs")] = ACCEPTED
    (tmp_path / "job.yaml").write_text(YAML_JOB)
    code, out, err = run_cli("submit", "-f", str(tmp_path / "job.yaml"), "--gpus", "16", "--env", "B=2",
                             "--nvlink", "none", "--url", url, "--", "python", "train.py")  # fmt: skip
    assert (code, out, err) == (0, "j1: submitted (pending)", "")
    _, headers, body = sent(handler)
    assert headers["Content-Type"] == "application/json"
    assert body == {
        "name": "train",
        "tenant": "team-x",  # the file has none: the CLI's, as for flags
        "gpus": 16,
        "topology": {"nvlink": "none"},
        "env": {"A": "1", "B": "2"},
        "command": ["python", "train.py"],
    }


def test_submit_f_errors_name_the_files_line(api: API, tmp_path: Path) -> None:
    url, handler = api
    job = tmp_path / "job.yaml"
    job.write_text("name: a\nname: b\n")
    code, out, err = run_cli("submit", "-f", str(job), "--url", url)
    assert (code, out) == (1, "") and err == f"error: {job}:2: name is given twice (first on line 1)"
    job.write_text(YAML_JOB.replace("gpus: 8", "gpus: 6"))
    handler.routes[("POST", "/v1/jobs")] = (422, b'{"error": "gpus: 6 GPUs need 2 nodes", "field": "gpus"}')
    code, _, err = run_cli("submit", "-f", str(job), "--url", url)
    assert code == 1 and err == f"error: {job}:2: field 'gpus': 6 GPUs need 2 nodes (HTTP 422)"
    code, _, err = run_cli("submit", "-f", str(job), "--gpus", "6", "--url", url)  # the flag's, not the file's
    assert code == 1 and err == "error: field 'gpus': 6 GPUs need 2 nodes (HTTP 422)"
    code, _, err = run_cli("submit", "-f", str(tmp_path / "missing.yaml"), "--url", url)
    assert code == 1 and err.startswith(f"error: cannot read {tmp_path / 'missing.yaml'}")


def test_submit_needs_gpus_or_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        run_cli("submit")
    assert e.value.code == 2 and "give --gpus N, or a job file with -f" in capsys.readouterr().err


def test_sbatch_sends_the_script_as_the_command_with_options_around_it(api: API, tmp_path: Path) -> None:
    url, handler = api
    handler.routes[("POST", "/v1/jobs")] = ACCEPTED
    script = tmp_path / "probe.sbatch"
    script.write_text(SCRIPT)
    code, out, err = run_cli("sbatch", "-N", "4", str(script), "--url", url, "--qos=high", "--", "arg one")
    assert (code, out, err) == (0, "j1: submitted (pending)", "")
    path, _, body = sent(handler)
    assert path == "/v1/jobs"
    assert body == {
        "name": "probe",
        "tenant": "team-x",
        "gpus": 16,  # -N 4 on the command line over the script's --nodes=2
        "gpus_per_node": 4,
        "time_limit_s": 600.0,
        "expected_runtime_s": 600.0,
        "priority": 100,
        "command": ["/bin/bash", "-c", SCRIPT, "probe.sbatch", "arg one"],
    }


def test_sbatch_test_only_asks_for_a_dry_run_and_parsable_prints_the_id(api: API, tmp_path: Path) -> None:
    url, handler = api
    alloc = [{"domain": "d00", "node": f"d00-n0{i}", "gpus": [0, 1, 2, 3]} for i in range(2)]
    answer = {"start": "now", "gpus": 8, "domains": ["d00"], "reason": "", "segment": None, "forecast_start": None}
    answer["allocation"] = alloc
    handler.routes[("POST", "/v1/jobs")] = (200, json.dumps(answer).encode())
    script = tmp_path / "s.sh"
    script.write_text(SCRIPT)
    code, out, _ = run_cli("sbatch", "--test-only", str(script), "--url", url)
    assert code == 0 and out.splitlines()[0] == "would start now on 8 GPUs (2 nodes) in d00", out
    assert "d00-n00[0-3] d00-n01[0-3]" in out and out.endswith("(a dry run: nothing was submitted)")
    assert handler.seen[-1][1] == "/v1/jobs?dry_run=true"
    code, out, _ = run_cli("sbatch", "--test-only", "--json", str(script), "--url", url)
    assert code == 0 and json.loads(out) == answer
    job = tmp_path / "job.yaml"
    job.write_text(YAML_JOB)
    code, out, _ = run_cli("submit", "-f", str(job), "--test-only", "--url", url)
    assert code == 0 and out.startswith("would start now") and handler.seen[-1][1] == "/v1/jobs?dry_run=true"
    handler.routes[("POST", "/v1/jobs")] = ACCEPTED
    code, out, _ = run_cli("sbatch", "--parsable", f"--url={url}", str(script), "--idempotency-key", "k1")
    assert (code, out) == (0, "j1") and handler.seen[-1][2]["Idempotency-Key"] == "k1"


@pytest.mark.parametrize(
    ("lines", "words", "error"),
    [
        ("#SBATCH --mem=64G\n", [], "{script}:5: --mem=64G is not supported: Rackscale schedules whole GPUs"),
        ("", ["--partition", "gpu"], "command line: --partition is not supported"),
        ("", ["--nodes=x"], "command line: --nodes=x: 'x' is not a node count (1 or more)"),
        ("", ["extra"], "command line: 'extra': one script only; arguments for it go after --"),
    ],
)
def test_sbatch_errors_name_the_line_or_the_command_line(
    api: API, tmp_path: Path, lines: str, words: list[str], error: str
) -> None:
    url, handler = api
    script = tmp_path / "s.sh"
    script.write_text(SCRIPT.replace('echo "$RANK $1"\n', lines + "true\n"))
    code, out, err = run_cli("sbatch", str(script), *words, "--url", url)
    assert (code, out) == (1, "") and err.startswith("error: " + error.format(script=script))
    assert handler.seen == []  # nothing sent


def test_sbatch_names_the_line_of_a_field_the_gateway_refuses(api: API, tmp_path: Path) -> None:
    url, handler = api
    handler.routes[("POST", "/v1/jobs")] = (
        422,
        b'{"error": "gpus: 8 GPUs need 2 nodes; the cluster has 1", "field": "gpus"}',
    )
    script = tmp_path / "s.sh"
    script.write_text(SCRIPT)
    code, _, err = run_cli("sbatch", str(script), "--url", url)
    assert code == 1 and err == f"error: {script}:3: field 'gpus': 8 GPUs need 2 nodes; the cluster has 1 (HTTP 422)"


def test_sbatch_help_and_a_missing_script() -> None:
    code, out, _ = run_cli("sbatch", "--help")
    assert code == 0 and out.startswith("usage: rackscale sbatch [OPTIONS] SCRIPT")
    code, _, err = run_cli("sbatch", "-N", "2")
    assert code == 1 and err.startswith("error: give the script to submit")
    code, _, err = run_cli("sbatch", "/nonexistent/s.sh")
    assert code == 1 and err.startswith("error: cannot read /nonexistent/s.sh")
