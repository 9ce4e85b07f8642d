"""The job files users copy from: every example in examples/ is read and accepted (the real-world-style scripts: a
multi-node torchrun, an array of single-GPU evaluations, a chain with afterok), and docs/jobs.md and
docs/job.schema.json say what the code does (their tables and the schema are the code's, generated)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.cli.jobfiles import sbatch_args
from services.gateway.validation import ApiError, check_job, decode_job
from shared.jobfile import JobFile, command_line_words, parse_script, parse_yaml
from shared.jobfile.options import directive_table, refusal_table
from shared.jobfile.qos import QOS
from shared.jobfile.schema import FIELD_DOCS, body_fields, field_table, job_schema
from shared.output_path import expand_output
from shared.schemas import JobBody

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
JOBS_DOC = (ROOT / "docs" / "jobs.md").read_text()


def accepted(job: JobFile) -> JobBody:
    """The body as the gateway takes it: decoded strictly, launch settings and static shape rules checked."""
    body = decode_job(msgspec.json.encode(job.body))
    assert not isinstance(body, ApiError), body
    checked = check_job(body, "id", None)
    assert not isinstance(checked, ApiError), checked
    return body


def script(name: str, **kw: Any) -> JobFile:
    return parse_script((EXAMPLES / name).read_text(), filename=name, **kw)


def test_the_yaml_example_is_a_job() -> None:
    text = (EXAMPLES / "job.yaml").read_text()
    assert text.startswith("# yaml-language-server: $schema=../docs/job.schema.json\n")
    assert (EXAMPLES / "../docs/job.schema.json").resolve().is_file()
    body = accepted(parse_yaml(text))
    assert (body.gpus, body.gpus_per_node, body.topology.segment, body.checkpointable) == (64, 4, 16, True)
    assert body.command[:2] == ["bash", "-c"] and "--node_rank=$NODE_RANK" in body.command[2]


def test_multi_node_torchrun() -> None:
    job = script("torchrun.sbatch")
    body = accepted(job)
    assert (body.name, body.tenant, body.gpus, body.gpus_per_node, body.processes) == (
        "llama-pretrain", "alice", 32, 4, "per_node"
    )  # fmt: skip
    assert body.topology.nvlink == "required" and body.checkpointable and body.slurm_env
    assert (body.time_limit_s, body.priority, body.on_node_failure) == (2 * 86400, QOS["high"], "requeue")
    assert body.workdir == "/shared/llama" and body.env == {"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN"}
    assert body.output == "/shared/llama/logs/%x-%j.%N.out"
    assert body.command[:2] == ["/bin/bash", "-c"] and body.command[3] == "torchrun.sbatch"
    assert expand_output(body.output, job_id="ab12", name=body.name, rank=3, node="d00-n03") == (
        "/shared/llama/logs/llama-pretrain-ab12.d00-n03.out"
    )
    # options on the command line win: half the nodes
    assert accepted(script("torchrun.sbatch", options=["--nodes=4"])).gpus == 16


def test_an_array_of_single_gpu_evals() -> None:
    body = accepted(script("evals-array.sbatch"))
    assert (body.gpus, body.gpus_per_node, body.array, body.topology.nvlink) == (1, 1, "0-49%8", "none")
    assert (body.priority, body.on_node_failure, body.time_limit_s) == (QOS["low"], "fail", 1800)
    assert expand_output(body.output, job_id="ab12_7", name=body.name, rank=0, node="n") == (
        "/shared/evals/logs/evals-ab12_7.out"
    )


def test_a_chain_with_afterok() -> None:
    """examples/chain-afterok.sh submits each step with `rackscale sbatch`: each of those command lines, with the
    job ids the earlier ones printed, reads as the CLI reads it."""
    lines = [line for line in (EXAMPLES / "chain-afterok.sh").read_text().splitlines() if "rackscale sbatch" in line]
    assert len(lines) == 2
    ids = {"$here": str(EXAMPLES), "$train": "aaaa1111"}
    jobs = []
    for line in lines:
        words = shlex.split(line.split("$(", 1)[1].rstrip(")"))
        assert words[:2] == ["rackscale", "sbatch"]
        words = [_substitute(w, ids) for w in words[2:]]
        cmd = sbatch_args(words)
        assert cmd.parsable
        options, path, args = command_line_words(cmd.words)
        assert path is not None and not args
        jobs.append(accepted(parse_script(Path(path).read_text(), filename=Path(path).name, options=options)))
    train, evals = jobs
    assert train.name == "llama-pretrain" and train.dependency == ""
    assert evals.name == "evals" and evals.dependency == "afterok:aaaa1111"


def _substitute(word: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        word = word.replace(name, value)
    return word


def test_every_example_is_read_by_a_test_and_is_valid_shell() -> None:
    assert sorted(p.name for p in EXAMPLES.iterdir()) == [
        "chain-afterok.sh", "evals-array.sbatch", "job.yaml", "torchrun.sbatch",
    ]  # fmt: skip
    if shutil.which("bash") is None:
        pytest.skip("no bash to check the scripts' syntax")
    for name in ("chain-afterok.sh", "evals-array.sbatch", "torchrun.sbatch"):
        result = subprocess.run(["bash", "-n", str(EXAMPLES / name)], capture_output=True, text=True, check=False)
        assert result.returncode == 0, (name, result.stderr)


# -- the docs are the code's ----------------------------------------------------------------------------------------


def test_every_body_field_is_documented_and_no_other() -> None:
    assert set(FIELD_DOCS) == set(body_fields())


@pytest.mark.parametrize("table", [field_table, directive_table, refusal_table], ids=lambda f: f.__name__)
def test_the_jobs_doc_carries_the_generated_tables(table: Any) -> None:
    assert table() in JOBS_DOC, f"docs/jobs.md lacks {table.__name__}() as generated"


def test_the_jobs_doc_carries_the_qos_table() -> None:
    for name, priority in QOS.items():
        assert f"| `{name}` | {priority} |" in JOBS_DOC


def test_the_checked_in_schema_is_the_codes() -> None:
    checked_in = json.loads((ROOT / "docs" / "job.schema.json").read_text())
    assert checked_in == job_schema(), "regenerate: python -m shared.jobfile.schema > docs/job.schema.json"


def test_the_yaml_in_the_jobs_doc_is_a_job() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", JOBS_DOC, re.S)
    assert blocks
    for block in blocks:
        accepted(parse_yaml(block))
