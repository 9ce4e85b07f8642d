"""Launch and stop one rank of a job on this node.

A rank with a command is a real subprocess, started in its own session (so its own process group):
stopping it sends SIGTERM to the whole group (the command and everything it forked), then SIGKILL to the
group after a grace period. A rank with an empty command on a simulated node is a timer of `duration_s`
(no process). The rank's environment carries the placement: CUDA_VISIBLE_DEVICES, RANK, WORLD_SIZE,
MASTER_ADDR, LOCAL_RANK (one rank per node, so 0) and RACKSCALE_JOB_ID.

Exit codes follow asyncio's convention: the process's status, or `-N` when signal N ended it (so a
command that exits 143 by itself is not mistaken for one that SIGTERM killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Protocol

from shared.schemas import StartRank

# Exit codes for ranks that never ran (the shell's conventions).
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_NO_COMMAND = 2


def rank_env(cmd: StartRank, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a rank runs with: `base` (default: the agent's) plus the placement variables."""
    env = dict(os.environ if base is None else base)
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(str(g) for g in cmd.gpus),
        RANK=str(cmd.rank),
        WORLD_SIZE=str(cmd.world_size),
        MASTER_ADDR=cmd.master_addr,
        LOCAL_RANK="0",
        RACKSCALE_JOB_ID=cmd.job_id,
        RACKSCALE_ATTEMPT=str(cmd.attempt),
        RACKSCALE_NODE=cmd.node,
        RACKSCALE_RESTORE=cmd.restore,  # checkpoint ref to resume from; empty for a fresh start
    )
    return env


class Rank(Protocol):
    """A running rank."""

    @property
    def pid(self) -> int:
        """The process id (its process group id too); 0 for a timer."""
        ...

    async def wait(self) -> int:
        """Wait for the end; the exit code (`-N` for signal N)."""
        ...

    async def stop(self, grace_s: float) -> None:
        """SIGTERM, then SIGKILL after `grace_s` if still running. Safe to call after the end."""
        ...


class ProcessRank:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> int:
        return await self.proc.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        # The rank leads its own session, so its pgid is its pid. The group can outlive the leader (a
        # forked child), so signal it even after the leader exited; ESRCH means nothing is left.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def stop(self, grace_s: float) -> None:
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), timeout=grace_s)
        self._signal_group(signal.SIGKILL)  # also reaps stragglers the leader left behind
        await self.proc.wait()


class TimerRank:
    """A simulated rank: exits 0 after `duration_s`, or `-SIGTERM` when stopped first."""

    def __init__(self, duration_s: float) -> None:
        self._done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, duration_s), self._finish, 0)

    def _finish(self, code: int) -> None:
        if not self._done.done():
            self._done.set_result(code)

    @property
    def pid(self) -> int:
        return 0

    async def wait(self) -> int:
        return await asyncio.shield(self._done)

    async def stop(self, grace_s: float) -> None:
        self._timer.cancel()
        self._finish(-signal.SIGTERM)


class LaunchError(Exception):
    """The rank could not be started; `code` is the exit code to report."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


async def launch(
    cmd: StartRank,
    *,
    simulated: bool,
    base_env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
    cwd: Path | None = None,
) -> Rank:
    """Start the rank. Raises LaunchError (with the exit code to report) when it can't run at all.

    Output goes to `log_path` (appended: a retry of the same attempt keeps the first run's lines) or,
    without one, to the agent's own stdout/stderr.
    """
    if not cmd.command:
        if simulated:
            return TimerRank(cmd.duration_s)
        raise LaunchError(EXIT_NO_COMMAND, "empty command: only a simulated node runs a job without one")
    out: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = log_path.open("ab")
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd.command,
            env=rank_env(cmd, base_env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT if out is not None else None,
            start_new_session=True,
        )
    except FileNotFoundError as e:
        raise LaunchError(EXIT_NOT_FOUND, f"command not found: {e}") from e
    except PermissionError as e:
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"command not executable: {e}") from e
    except OSError as e:
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"command could not start: {e}") from e
    finally:
        if out is not None:
            out.close()  # the child holds its own copy
    return ProcessRank(proc)
