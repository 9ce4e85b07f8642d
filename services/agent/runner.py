"""Launch and stop one rank of a job on this node.

A rank with a command is a real subprocess, started in its own session (so its own process group):
stopping it sends SIGTERM to the whole group (the command and everything it forked), then SIGKILL to the
group after a grace period. A rank with an empty command on a simulated node is a timer of `duration_s`
(no process). A job asking for one process per GPU (`processes: per_gpu`) starts one per allocated GPU
here, supervised as one rank (the node's share): it ends when they all have, failed with the first that
fails (the others are stopped then, as torchrun's agent does). Every process's environment is the launch
contract (shared/launch.py); it starts in the job's `workdir` when it names one. When the job names an `output`
pattern (shared/output_path.py), each process's output is also appended to the file the pattern names for it on
this node; a file that can't be opened (its directory isn't there) fails the rank before it starts, saying which.

Exit codes follow asyncio's convention: the process's status, or `-N` when signal N ended it (so a
command that exits 143 by itself is not mistaken for one that SIGTERM killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from shared import launch as launch_contract
from shared.output_path import expand_output
from shared.rank_log import LINE_MAX_BYTES
from shared.schemas import StartRank

log = logging.getLogger("rackscale.agent.runner")

# Exit codes for ranks that never ran (the shell's conventions).
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
EXIT_NO_COMMAND = 2


def rank_env(cmd: StartRank, base: Mapping[str, str] | None = None, local_rank: int = 0) -> dict[str, str]:
    """The environment a process runs with: `base` (default: the agent's) with the launch contract's
    variables over it (shared/launch.py)."""
    return launch_contract.merged_env(os.environ if base is None else base, cmd, local_rank)


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


OutputSink = Callable[[int, bytes], None]  # (the process's local rank, one line as it wrote it, no newline)
READ_CHUNK = 1 << 16
OUTPUT_TAIL_S = 2.0  # after the process exits, how long its output may still drain (a child holding the pipe)


class ProcessRank:
    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.Task[None] | None = None) -> None:
        self.proc = proc
        self.reader = reader  # the task reading its output, when captured

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def wait(self) -> int:
        """The exit code, once the process's output is read too (or OUTPUT_TAIL_S after it exited)."""
        code = await self.proc.wait()
        if self.reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.reader), OUTPUT_TAIL_S)
        return code

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


class GroupRank:
    """The processes one node starts for a `per_gpu` job, as one rank: the first to fail stops the others."""

    def __init__(self, ranks: list[ProcessRank], grace_s: float) -> None:
        self.ranks, self.grace_s = ranks, grace_s

    @property
    def pid(self) -> int:
        return self.ranks[0].pid

    async def wait(self) -> int:
        waits = {asyncio.ensure_future(r.wait()): r for r in self.ranks}
        first_failure: int | None = None
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                code = task.result()
                if code != 0 and first_failure is None:
                    first_failure = code
                    await asyncio.gather(*(waits[t].stop(self.grace_s) for t in pending))
        return first_failure or 0

    async def stop(self, grace_s: float) -> None:
        await asyncio.gather(*(r.stop(grace_s) for r in self.ranks))


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
    stop_grace_s: float = 10.0,
    output: OutputSink | None = None,
) -> Rank:
    """Start the rank: one process, or one per GPU (`per_gpu`). Raises LaunchError (with the exit code to
    report) when it can't run at all; a `per_gpu` group whose later process can't start stops those started.

    Output (stdout and stderr, one pipe) goes to `output` line by line, read as fast as the process writes it,
    to `log_path` too (appended: a retry of the same attempt keeps the first run's lines) and to the job's own
    output file when its body names one (appended: a requeued attempt's lines follow the last one's); with none
    of them, to the agent's own stdout/stderr. The job's `workdir`, when it names one, is the cwd.
    """
    if not cmd.command:
        if simulated:
            return TimerRank(cmd.duration_s)
        raise LaunchError(EXIT_NO_COMMAND, "empty command: only a simulated node runs a job without one")
    workdir = Path(cmd.launch.workdir) if cmd.launch.workdir else cwd
    if workdir is not None and not workdir.is_dir():
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"workdir {workdir} is not a directory on {cmd.node}")
    started: list[ProcessRank] = []
    try:
        for local_rank in range(launch_contract.processes_on(cmd)):
            env = rank_env(cmd, base_env, local_rank)
            started.append(await _start_process(cmd, env, workdir, log_path, output, local_rank))
    except LaunchError:
        await asyncio.gather(*(r.stop(0.0) for r in started))
        raise
    return started[0] if len(started) == 1 else GroupRank(started, stop_grace_s)


async def _start_process(
    cmd: StartRank,
    env: Mapping[str, str],
    cwd: Path | None,
    log_path: Path | None,
    output: OutputSink | None = None,
    local_rank: int = 0,
) -> ProcessRank:
    # the job's own output file first: a directory that isn't there fails the rank before anything runs
    job_file = open_output_file(cmd, local_rank)
    out: IO[bytes] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = log_path.open("ab")
    piped = output is not None or job_file is not None
    try:
        proc = await asyncio.create_subprocess_exec(
            *cmd.command,
            env=dict(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if piped else out,
            stderr=asyncio.subprocess.STDOUT if piped or out is not None else None,
            start_new_session=True,
        )
    except OSError as e:
        for f in (out, job_file):
            if f is not None:
                f.close()
        if isinstance(e, FileNotFoundError):
            raise LaunchError(EXIT_NOT_FOUND, f"command not found: {e}") from e
        if isinstance(e, PermissionError):
            raise LaunchError(EXIT_CANNOT_EXECUTE, f"command not executable: {e}") from e
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"command could not start: {e}") from e
    if out is not None and not piped:
        out.close()  # the child holds its own copy
    if not piped or proc.stdout is None:
        return ProcessRank(proc)
    files = Files(log=out, job=job_file, sink=output)
    reader = asyncio.create_task(_pump(proc.stdout, local_rank, files), name=f"rank-output:{cmd.job_id}")
    return ProcessRank(proc, reader)


def open_output_file(cmd: StartRank, local_rank: int) -> IO[bytes] | None:
    """The file the job's `output` pattern names for this process, opened to append (unbuffered: whole lines go
    out as they come); None without a pattern. Raises LaunchError, naming the file, when it can't be opened."""
    if not cmd.launch.output:
        return None
    rank = launch_contract.global_rank(cmd, local_rank)
    path = Path(expand_output(cmd.launch.output, job_id=cmd.job_id, name=cmd.launch.job_name, rank=rank, node=cmd.node))
    if not path.parent.is_dir():
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"output {path}: no directory {path.parent} on {cmd.node}")
    try:
        return path.open("ab", buffering=0)
    except OSError as e:
        raise LaunchError(EXIT_CANNOT_EXECUTE, f"output {path} could not be opened on {cmd.node}: {e}") from e


@dataclass(slots=True)
class Files:
    """Where a piped process's output goes besides nothing: the agent's rank log (`log`, as written), the job's
    output file (`job`, whole lines: processes sharing a file don't split each other's lines), and `sink`."""

    log: IO[bytes] | None
    job: IO[bytes] | None
    sink: OutputSink | None

    def raw(self, data: bytes) -> None:
        self.log = _write(self.log, data)

    def lines(self, data: bytes, local_rank: int, lines: list[bytes]) -> None:
        self.job = _write(self.job, data)
        if self.sink is not None:
            for line in lines:
                self.sink(local_rank, line)

    def close(self) -> None:
        for f in (self.log, self.job):
            if f is not None:
                f.close()


def _write(file: IO[bytes] | None, data: bytes) -> IO[bytes] | None:
    """`file` after writing `data` to it; None once it failed (a full disk): the process and its log go on."""
    if file is None or not data:
        return file
    try:
        file.write(data)
        return file
    except OSError as e:
        log.warning("%s: writing a rank's output failed, no more is written there: %s", file.name, e)
        with contextlib.suppress(OSError):
            file.close()
        return None


async def _pump(stream: asyncio.StreamReader, local_rank: int, files: Files) -> None:
    """Read the process's output until it closes: as written into the rank log, and line by line into the output
    file and the sink (a line longer than LINE_MAX_BYTES is handed over in parts as it comes)."""
    carry = b""
    try:
        while data := await stream.read(READ_CHUNK):
            files.raw(data)
            buf = carry + data
            *lines, carry = buf.split(b"\n")
            files.lines(buf[: len(buf) - len(carry)], local_rank, lines)
            if len(carry) >= LINE_MAX_BYTES:
                files.lines(carry, local_rank, [carry])
                carry = b""
        if carry:
            files.lines(carry, local_rank, [carry])
    finally:
        files.close()
