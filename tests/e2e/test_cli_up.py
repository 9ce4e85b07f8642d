"""`rackscale up` as a user runs it: a real process with embedded servers, driven by the CLI, stopped by Ctrl-C.

1. `python -m services.cli up --domains 1 --port 0` prints the gateway URL (one NVL72 domain: 18 nodes).
2. `submit` a job against that URL; `job ID` shows it succeed; `cluster` draws the domain.
3. SIGINT the `up` process: it exits 0 and its nats-server and valkey-server children are gone.

And the README's own command, `python3 scripts/dev.py up`, stopped the way a terminal's Ctrl-C stops it (SIGINT
to the whole process group): the same clean stop, no traceback.

The servers are always embedded here (RACKSCALE_NATS_URL / REDIS_URL are removed from the child's
environment): what is under test is that `up` starts and stops them.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_S = 90.0  # bound on waiting; never an assertion
JOB_S = 60.0
SERVERS = ("nats-server", "valkey-server")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RACKSCALE_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Lines:
    """The `up` process's output, read by a thread so waiting for a line has a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: list[str] = []
        self._q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout:g}s; output:\n{self.text()}")
            try:
                line = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"`up` exited ({self.proc.wait()}) before {pattern!r}; output:\n{self.text()}")
            self.seen.append(line)
            m = rx.search(line)
            if m:
                return m

    def drain(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.1)
            except queue.Empty:
                continue
            if line is None:
                return
            self.seen.append(line)

    def text(self) -> str:
        return "\n".join(self.seen)


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli", *argv],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


def children(pid: int) -> dict[int, str]:
    """pid → command name of the direct children of `pid` (Linux /proc)."""
    out: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, so split after the last ')'
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out[int(entry.name)] = comm
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def descendants(pid: int) -> dict[int, str]:
    found = children(pid)
    for child in list(found):
        found.update(descendants(child))
    return found


def embedded_servers(proc: subprocess.Popen[str]) -> dict[int, str]:
    servers = {pid: name for pid, name in descendants(proc.pid).items() if name in SERVERS}
    assert sorted(servers.values()) == sorted(SERVERS), f"embedded servers of `up` (pid {proc.pid}): {servers}"
    return servers


def assert_stopped_cleanly(proc: subprocess.Popen[str], out: Lines, servers: dict[int, str]) -> None:
    code = proc.wait(timeout=60)
    out.drain()
    assert code == 0, out.text()
    assert "stopped" in out.seen, out.text()
    assert "Traceback" not in out.text(), out.text()
    left = [f"{name} ({pid})" for pid, name in servers.items() if alive(pid)]
    assert not left, f"still running after `up` exited: {left}"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the server processes through /proc")
@pytest.mark.parametrize(
    "more",
    [[], ["--fleet-processes", "1"]],  # the second: agents and gateway in child processes, as a large fleet runs
    ids=["one-process", "child-processes"],
)
def test_up_serves_the_cli_and_stops_cleanly_on_ctrl_c(more: list[str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli", "up", "--domains", "1", "--port", "0", *more],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = Lines(proc)
    try:
        url = out.wait_for(r"gateway\s+(http://127\.0\.0\.1:\d+)", START_S).group(1)
        out.wait_for(r"submit --gpus 64 --name demo --tenant me --duration 30", 5)
        servers = embedded_servers(proc) | descendants(proc.pid)  # and the child processes, when there are any
        assert len(servers) == len(SERVERS) + (2 if more else 0), servers

        sub = cli("submit", "--gpus", "8", "--name", "e2e", "--tenant", "test", "--duration", "0.5", "--url", url)
        assert sub.returncode == 0, sub.stderr
        job_id = re.fullmatch(r"([0-9a-f]{32}): submitted \(pending\)", sub.stdout.strip())
        assert job_id, sub.stdout
        jid = job_id.group(1)

        deadline = time.monotonic() + JOB_S
        state = ""
        while state != "succeeded":
            shown = cli("job", jid, "--json", "--url", url)
            if shown.returncode == 0:
                state = json.loads(shown.stdout)["state"]
                assert state not in ("failed", "cancelled"), shown.stdout
            else:
                assert "unknown job" in shown.stderr, shown.stderr  # not recorded by the queue yet
            if time.monotonic() > deadline:
                raise AssertionError(f"job {jid} not succeeded within {JOB_S:g}s: {shown.stdout or shown.stderr}")
            time.sleep(0.2)
        detail = cli("job", jid, "--url", url)
        assert detail.returncode == 0 and re.search(r"state\s+succeeded", detail.stdout), detail.stdout
        assert re.search(r"allocation\s+2 nodes in 1 domain\(s\)", detail.stdout), detail.stdout

        picture = cli("cluster", "--url", url)
        assert picture.returncode == 0, picture.stderr
        row = next((line for line in picture.stdout.splitlines() if line.startswith("d00 │")), None)
        assert row is not None, picture.stdout
        assert len(row.split("│")[1].split()) == 18  # 18 nodes of 4 cells

        proc.send_signal(signal.SIGINT)
        assert_stopped_cleanly(proc, out, servers)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the server processes through /proc")
def test_the_readme_up_command_stops_cleanly_on_a_terminal_ctrl_c() -> None:
    # scripts/dev.py must become the `up` process (not wait on it): a terminal's Ctrl-C signals the whole
    # group, and a waiting parent would kill `up` mid-shutdown, leaving its servers running
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "dev.py"), "up", "--domains", "1", "--port", "0"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    out = Lines(proc)
    servers: dict[int, str] = {}
    try:
        # bounded wait: dev.py installs first when .venv's install stamp doesn't match pyproject.toml
        out.wait_for(r"gateway\s+http://127\.0\.0\.1:\d+", 5 * START_S)
        servers = embedded_servers(proc)
        os.killpg(proc.pid, signal.SIGINT)
        assert_stopped_cleanly(proc, out, servers)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in servers:  # the servers run in sessions of their own: a failed stop must not leave them
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
