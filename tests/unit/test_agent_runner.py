"""The agent's rank runner: environment, real subprocesses in their own process group, stop, timers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from services.agent.runner import (
    EXIT_NO_COMMAND,
    EXIT_NOT_FOUND,
    GroupRank,
    LaunchError,
    ProcessRank,
    TimerRank,
    launch,
    rank_env,
)
from services.agent.service import exit_reason
from shared.schemas import Launch, StartRank

PLACEMENT_VARS = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK", "RACKSCALE_JOB_ID")
WAIT_S = 10.0  # only a bound on waiting for an event; nothing asserts on elapsed time


def start_cmd(
    command: list[str], *, gpus: list[int] | None = None, duration_s: float = 0.0, launch: Launch | None = None
) -> StartRank:
    return StartRank(
        launch=launch or Launch(),
        job_id="job-1",
        attempt=2,
        node="d00-n01",
        gpus=[0, 2, 3] if gpus is None else gpus,
        rank=1,
        world_size=3,
        master_addr="d00-n00",
        command=command,
        duration_s=duration_s,
    )


async def wait_for_file(path: Path, text: str = "") -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if path.exists() and text in (content := path.read_text()):
            return content
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never contained {text!r}")


def test_rank_env_carries_the_placement() -> None:
    env = rank_env(start_cmd(["true"]), base={"PATH": "/bin", "RANK": "stale"})
    assert {k: env[k] for k in PLACEMENT_VARS} == {
        "CUDA_VISIBLE_DEVICES": "0,2,3",
        "RANK": "1",
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "d00-n00",
        "LOCAL_RANK": "0",
        "RACKSCALE_JOB_ID": "job-1",
    }
    assert env["PATH"] == "/bin"  # the base environment is kept, placement variables override it


@pytest.mark.asyncio
async def test_subprocess_sees_the_placement_env_and_exits_0(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = f"import json, os; json.dump({{k: os.environ[k] for k in {PLACEMENT_VARS!r}}}, open({str(out)!r}, 'w'))"
    rank = await launch(start_cmd([sys.executable, "-c", script]), simulated=False)
    assert isinstance(rank, ProcessRank) and rank.pid > 0
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0
    assert json.loads(out.read_text()) == {
        "CUDA_VISIBLE_DEVICES": "0,2,3",
        "RANK": "1",
        "WORLD_SIZE": "3",
        "MASTER_ADDR": "d00-n00",
        "LOCAL_RANK": "0",
        "RACKSCALE_JOB_ID": "job-1",
    }


@pytest.mark.asyncio
async def test_rank_runs_in_its_own_process_group(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    rank = await launch(
        start_cmd([sys.executable, "-c", "import os; print(os.getpgid(0))"]), simulated=False, log_path=log
    )
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0
    assert int(log.read_text().strip()) == rank.pid != os.getpgid(0)


@pytest.mark.asyncio
async def test_failing_command_reports_its_code() -> None:
    rank = await launch(start_cmd([sys.executable, "-c", "raise SystemExit(3)"]), simulated=False)
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 3


@pytest.mark.asyncio
async def test_stop_kills_sleep_with_sigterm() -> None:
    rank = await launch(start_cmd(["sleep", "30"]), simulated=False)
    await rank.stop(grace_s=WAIT_S)
    assert await rank.wait() == -signal.SIGTERM
    assert exit_reason(-signal.SIGTERM, "cancelled") == "stopped (cancelled): killed by SIGTERM"


@pytest.mark.asyncio
async def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(30)"
    )
    rank = await launch(start_cmd([sys.executable, "-c", script]), simulated=False, log_path=log)
    await wait_for_file(log, "ready")
    await rank.stop(grace_s=0.2)
    assert await rank.wait() == -signal.SIGKILL


@pytest.mark.asyncio
async def test_stop_kills_the_whole_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    rank = await launch(start_cmd(["sh", "-c", f"sleep 30 & echo $! > {pid_file}; wait"]), simulated=False)
    child = int((await wait_for_file(pid_file, "\n")).strip())
    await rank.stop(grace_s=WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and _alive(child):
        await asyncio.sleep(0.02)
    assert not _alive(child), "the command's own child outlived the stop"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); /proc tells it apart
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.asyncio
async def test_stop_after_exit_is_harmless() -> None:
    rank = await launch(start_cmd(["true"]), simulated=False)
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0
    await rank.stop(grace_s=0.1)
    assert await rank.wait() == 0


@pytest.mark.asyncio
async def test_empty_command_on_a_simulated_node_is_a_timer() -> None:
    rank = await launch(start_cmd([], duration_s=0.01), simulated=True)
    assert isinstance(rank, TimerRank) and rank.pid == 0
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0

    long = await launch(start_cmd([], duration_s=3600), simulated=True)
    await long.stop(grace_s=1.0)
    assert await asyncio.wait_for(long.wait(), WAIT_S) == -signal.SIGTERM


@pytest.mark.asyncio
async def test_empty_command_on_a_real_node_cannot_start() -> None:
    with pytest.raises(LaunchError) as info:
        await launch(start_cmd([]), simulated=False)
    assert info.value.code == EXIT_NO_COMMAND


@pytest.mark.asyncio
async def test_missing_executable_exits_127() -> None:
    with pytest.raises(LaunchError, match="command not found") as info:
        await launch(start_cmd(["/nonexistent/rackscale-no-such-binary"]), simulated=False)
    assert info.value.code == EXIT_NOT_FOUND


def test_exit_reasons() -> None:
    assert exit_reason(0, None) == "exited 0"
    assert exit_reason(3, None) == "exited with code 3"
    assert exit_reason(-signal.SIGKILL, None) == "killed by SIGKILL"
    assert exit_reason(-200, "x") == "stopped (x): killed by signal 200"


@pytest.mark.asyncio
async def test_one_process_per_gpu_each_with_its_rank(tmp_path: Path) -> None:
    script = (
        "import json, os, sys; e = os.environ; keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE'); "
        f"json.dump({{k: e[k] for k in keys}}, open({str(tmp_path)!r} + '/' + e['LOCAL_RANK'], 'w'))"
    )
    cmd = start_cmd([sys.executable, "-c", script], launch=Launch(processes="per_gpu"))
    rank = await launch(cmd, simulated=False)
    assert isinstance(rank, GroupRank) and len(rank.ranks) == 3
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0
    seen = [json.loads((tmp_path / str(i)).read_text()) for i in range(3)]
    # node rank 1 of a world of 3 nodes with 3 GPUs each (an old StartRank without the whole allocation)
    assert seen == [{"RANK": str(3 + r), "LOCAL_RANK": str(r), "WORLD_SIZE": "9"} for r in range(3)]


@pytest.mark.asyncio
async def test_the_first_failing_process_of_a_node_stops_the_others() -> None:
    script = "import os, sys, time; sys.exit(3) if os.environ['LOCAL_RANK'] == '1' else time.sleep(60)"
    rank = await launch(start_cmd([sys.executable, "-c", script], launch=Launch(processes="per_gpu")), simulated=False)
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 3  # not the siblings' SIGTERM


@pytest.mark.asyncio
async def test_processes_start_in_the_jobs_workdir(tmp_path: Path) -> None:
    log = tmp_path / "rank.log"
    work = tmp_path / "work"
    work.mkdir()
    cmd = start_cmd([sys.executable, "-c", "import os; print(os.getcwd())"], launch=Launch(workdir=str(work)))
    rank = await launch(cmd, simulated=False, log_path=log)
    assert await asyncio.wait_for(rank.wait(), WAIT_S) == 0
    assert log.read_text().strip() == str(work)
    missing = start_cmd(["true"], launch=Launch(workdir=str(tmp_path / "nowhere")))
    with pytest.raises(LaunchError, match="is not a directory") as e:
        await launch(missing, simulated=False)
    assert e.value.code == 126
