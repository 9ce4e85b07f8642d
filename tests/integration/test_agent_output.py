"""The agent honours a job's `output` pattern and runs an sbatch script as the job's command (real NATS, real
subprocesses; the harness and helpers of test_agent.py).

- each process's output is also appended to the file its pattern names on the node (`%t` its rank, `%x` the
  name, `%j` the job, `%N` the node), besides the job's log;
- processes sharing one file never split each other's lines; a later attempt's output follows the earlier's;
- a file whose directory isn't there fails the rank before it starts, saying which file, in its exit and its log;
- a script read by the sbatch reader runs as `bash -c SCRIPT NAME ARGS` under the launch contract.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.agent.backends import SimBackend
from shared.jobfile import parse_script
from shared.rank_log import render
from shared.schemas import Launch, RankExited, RankStarted
from tests.integration.test_agent import NODE, _log_chunks, command, harness, py, start, wait_exit
from tests.integration.test_inventory import Harness

pytestmark = pytest.mark.asyncio
__all__ = ["harness"]  # the fixture, shared with test_agent.py


async def test_each_process_appends_its_output_to_the_file_its_pattern_names(harness: Harness, tmp_path: Path) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    pattern = str(tmp_path / "%x-%j.%N.%t.out")
    code = "import os, sys; print('hello from', os.environ['RANK']); print('err', file=sys.stderr); print('end')"
    launch = Launch(processes="per_gpu", output=pattern, job_name="train")
    await command(h, start(py(code), launch=launch))  # 2 GPUs here, node rank 2: RANKs 4 and 5
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and exited.exit_code == 0
    for rank in (4, 5):
        text = (tmp_path / f"train-job-1.{NODE}.{rank}.out").read_text()
        assert text == f"hello from {rank}\nerr\nend\n" or sorted(text.splitlines()) == sorted(
            [f"hello from {rank}", "err", "end"]
        )  # stdout and stderr share the pipe; their order is the process's
    assert sorted(render(await _log_chunks(h, "job-1"), prefix=False)) == sorted(
        ["hello from 4\n", "hello from 5\n", "err\n", "err\n", "end\n", "end\n"]
    )  # and the job's log has it all, as before


async def test_a_shared_file_keeps_lines_whole_and_a_later_attempt_appends(harness: Harness, tmp_path: Path) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    shared = tmp_path / "all.out"
    # two processes, many lines each, written in small pieces: a line is never split by the other's
    code = (
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "for i in range(2000):\n"
        "    sys.stdout.write(f'{r}:{i:05d}:'); sys.stdout.flush(); sys.stdout.write('x' * 50 + '\\n')\n"
        "sys.stdout.write(f'{r}:tail-without-newline')\n"
    )
    launch = Launch(processes="per_gpu", output=str(shared), job_name="train")
    await command(h, start(py(code), launch=launch))
    await wait_exit(h, "job-1")
    lines = shared.read_text().split("\n")
    for line in lines:
        assert line.endswith("x" * 50) or line.endswith("tail-without-newline") or line == "", line
    body = [line for line in lines if line.endswith("x" * 50)]
    assert len(body) == 4000 and {line.split(":")[0] for line in body} == {"4", "5"}

    await command(h, start(py("print('attempt 2')"), attempt=2, launch=Launch(output=str(shared))))
    await wait_exit(h, "job-1", count=2)
    assert shared.read_text().endswith("attempt 2\n") and shared.read_text().count("x" * 50) == 4000


async def test_an_output_file_that_cant_be_opened_fails_the_rank_saying_so(harness: Harness, tmp_path: Path) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    missing = tmp_path / "no-such-dir"
    ran = tmp_path / "ran"
    await command(h, start(py(f"open({str(ran)!r}, 'w')"), launch=Launch(output=f"{missing}/%j.out")))
    (only,) = await wait_exit(h, "job-1")  # never started: the exit alone
    assert isinstance(only, RankExited) and only.exit_code == 126 and only.cause == "failed"
    assert only.reason == f"output {missing}/job-1.out: no directory {missing} on {NODE}"
    assert not ran.exists()
    lines = render(await _log_chunks(h, "job-1"), prefix=False)
    assert lines == [f"[rackscale: could not start: {only.reason}]\n"]  # what `rackscale logs` shows


async def test_an_sbatch_script_runs_as_the_command_under_the_launch_contract(harness: Harness, tmp_path: Path) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    script = f"""#!/bin/bash
#SBATCH --account=alice --nodes=4 --gpus-per-node=2 --output={tmp_path}/%x.%t.out
#SBATCH --job-name=probe
set -eu
echo "script=$0 args=$* rank=$RANK world=$WORLD_SIZE node_rank=$NODE_RANK" \
  "master=$MASTER_ADDR gpus=$CUDA_VISIBLE_DEVICES"
"""
    job = parse_script(script, filename="probe.sbatch", args=["--lr", "0.1"])
    launch = Launch(output=job.body["output"], job_name=job.body["name"])
    await command(h, start(job.body["command"], launch=launch))
    started, exited = await wait_exit(h, "job-1")
    assert isinstance(started, RankStarted) and isinstance(exited, RankExited) and exited.exit_code == 0
    expected = "script=probe.sbatch args=--lr 0.1 rank=2 world=4 node_rank=2 master=d00-n07 gpus=1,3\n"
    assert (tmp_path / "probe.2.out").read_text() == expected
    assert render(await _log_chunks(h, "job-1"), prefix=False) == [expected]
