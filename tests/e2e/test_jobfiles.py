"""Job files on the running system: `rackscale sbatch` and a YAML body over HTTP, through the queue, placement and
the simulated agents, whose ranks are real processes here. The script runs on every node under the launch contract,
each rank's output also lands in the file the `output` pattern names, and a directory that isn't there fails the job
saying so."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.cli.main import main as cli_main
from tests.e2e.conftest import StackFactory

pytestmark = pytest.mark.asyncio


async def sbatch(url: str, script: Path, *options: str) -> str:
    out: list[str] = []
    argv = ["sbatch", "--parsable", "--url", url, str(script), *options]  # options may end with `-- ARGS`
    code = await asyncio.to_thread(cli_main, argv, out.append, out.append)
    assert code == 0, out
    return out[-1]


async def test_an_sbatch_script_runs_on_every_node_and_writes_its_output_files(
    open_stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RACKSCALE_TENANT", "alice")
    e2e = await open_stack(domains=1)
    logs = tmp_path / "logs"
    logs.mkdir()
    script = tmp_path / "hello.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --nodes=2 --gpus-per-node=4 --ntasks-per-node=1 --time=5\n"
        f"#SBATCH --chdir={tmp_path} --output=logs/%x-%j.%t.out\n"
        "#RACKSCALE --nvlink=required\n"
        'echo "rank $RANK of $WORLD_SIZE node $NODE_RANK/$NNODES arg $1 in $PWD"\n'
    )
    job = await sbatch(e2e.url, script, "--", "x")
    done = (await e2e.wait_terminal([job]))[job]
    assert (done["state"], done["name"], done["tenant"]) == ("succeeded", "hello.sbatch", "alice"), done
    for rank in (0, 1):
        text = (logs / f"hello.sbatch-{job}.{rank}.out").read_text()
        assert text == f"rank {rank} of 2 node {rank}/2 arg x in {tmp_path}\n"
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs") as r:
        assert sorted((await r.text()).splitlines()) == [
            f"{rank}: rank {rank} of 2 node {rank}/2 arg x in {tmp_path}" for rank in (0, 1)
        ]

    # the output's directory isn't there: the job fails before anything runs, and says which file
    job = await sbatch(e2e.url, script, "--output=/nonexistent-rackscale-dir/%j.out", "--job-name=lost")
    done = (await e2e.wait_terminal([job]))[job]
    assert done["state"] == "failed" and "no directory /nonexistent-rackscale-dir" in done["reason"], done


async def test_a_yaml_body_over_http_is_a_job(open_stack: StackFactory, tmp_path: Path) -> None:
    e2e = await open_stack(domains=1)
    body = f"name: from-yaml\ntenant: a\ngpus: 4\ncommand: [sh, -c, 'echo yaml $RANK']\noutput: {tmp_path}/%x.out\n"
    async with e2e.http.post(f"{e2e.url}/v1/jobs", data=body, headers={"Content-Type": "application/yaml"}) as r:
        assert r.status == 202, await r.text()
        job = (await r.json())["id"]
    done = (await e2e.wait_terminal([job]))[job]
    assert done["state"] == "succeeded", done
    assert (tmp_path / "from-yaml.out").read_text() == "yaml 0\n"
