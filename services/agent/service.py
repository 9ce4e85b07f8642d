"""agent: one per node. Reports the node and runs the ranks it is told to run; never decides anything.

- At start and every `register_every` heartbeats it publishes its `AgentRegister` (so a restarted
  inventory, or a wiped Redis, learns the node again); in between a `Heartbeat` every `heartbeat_s`, with
  the GPUs' health. Both are core NATS: a lost one is replaced by the next. Both carry the ranks the agent
  holds (running, or ended with the exit not yet stored: `held_ranks`), which inventory reconciles with the
  job records (`shared.reconcile`), and a `boot_id` new at every start (a registration with a new one
  clears latched GPU faults).
- Every `telemetry_s` a `Telemetry` sample of every GPU (`backend.telemetry`) on `names.telemetry(node)`,
  core NATS too. Before each report the backend's clock advances (a sim's fault plan, seconds since the
  agent started on the injected clock); while the backend is `silent` the agent sends nothing at all.
- Commands come from JetStream, `names.agent_cmd(node)`, through the durable consumer
  `names.consumer("agent", node)` (so none is lost while the agent restarts). `StartRank` launches the
  rank (`runner.launch`) and a watcher publishes `RankStarted` then, at its end, `RankExited` on
  `names.agent_events` with msg ids `{job}:{attempt}:{rank}:start|exit`. `StopRank` stops every rank of
  the job here (SIGTERM to the process group, SIGKILL after `stop_grace_s`); the exit is reported as
  usual, with the stop's reason.
- Idempotent: a StartRank for a job attempt this agent already runs is ignored; one that already
  finished is answered by publishing its exit again (the msg id makes that a no-op in the stream).
- On shutdown the agent stops its ranks and reports their exits ("agent stopped", `lost=True`): the queue
  handles them like a node loss — requeued, or failed when the job asked for `on_node_failure: fail`.
- Tracing: a command's `traceparent` continues in an `agent.start_rank` / `agent.stop_rank` span, and the
  rank's RankStarted/RankExited carry that span's context, so the job's trace reaches the agent.

Several agents can share one `Deps` (one NATS connection, e.g. a simulated fleet in one process): an
agent never closes the bus, and `handle()` is public so one consumer can dispatch to many agents
(`services.agent.fleet.AgentFleet`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from services.agent.backends import GpuBackend
from services.agent.logs import LogShipper
from services.agent.runner import LaunchError, Rank, launch
from shared.lifecycle import TIME_LIMIT, exit_cause
from shared.runtime import Deps, Service
from shared.schemas import (
    AGENT_COMMANDS,
    AgentCommand,
    AgentRegister,
    Heartbeat,
    RankExited,
    RankStarted,
    RunningRank,
    StartRank,
    StopRank,
    Telemetry,
)

log = logging.getLogger("rackscale.agent")

RunKey = tuple[str, int]  # (job id, attempt)
TRACEPARENT = "traceparent"  # W3C trace context header (shared.tracing)


@dataclass(slots=True)
class RankRun:
    """One StartRank this agent accepted, from launch to its reported exit."""

    cmd: StartRank
    rank: Rank | None = None
    exit_code: int | None = None
    reason: str = ""
    stop_reason: str | None = None
    lost: bool = False  # stopped by the agent's own shutdown
    checkpointed: bool = False  # stopped by a checkpoint stop (a move): its exit acknowledges the checkpoint
    time_limit: bool = False  # stopped here at the job's time limit
    stop_cause: str = ""  # why it was stopped (StopRank.cause)
    logs: LogShipper | None = None  # its processes' output on its way to the log
    started_at: float = 0.0
    ended_at: float = 0.0
    exit_stored: bool = False  # its RankExited is in JetStream: the reports may leave it out
    trace: dict[str, str] = field(default_factory=dict)  # headers carrying the StartRank's trace context
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.exit_code is None


def _cause(run: RankRun) -> str:
    """Why the rank exited (shared.lifecycle CAUSES)."""
    assert run.exit_code is not None
    stopped_for = run.stop_cause if run.stop_reason is not None else None
    return exit_cause(run.exit_code, time_limit=run.time_limit, lost=run.lost, stopped_for=stopped_for)


def exit_reason(code: int, stop_reason: str | None) -> str:
    """Words for an exit: how it ended, and why when it was stopped."""
    if code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = "exited 0" if code == 0 else f"exited with code {code}"
    return f"stopped ({stop_reason}): {how}" if stop_reason else how


def phase(node: str) -> float:
    """Where in each period a node reports, as a fraction fixed by its name: agents started together don't all
    report in the same instant (bursts that stall the receivers' event loops and every job event behind them)."""
    return zlib.crc32(node.encode()) / 2**32


class AgentService(Service):
    name = "agent"

    def __init__(
        self,
        deps: Deps,
        backend: GpuBackend,
        *,
        register_every: int = 10,
        stop_grace_s: float = 10.0,
        log_dir: Path | None = None,
        consume: bool = True,
        periodic: bool = True,
        keep_finished: int = 4096,
        relabel: Callable[[AgentRegister], AgentRegister] | None = None,
    ) -> None:
        """`consume=False` leaves command intake to the caller (a fleet dispatching to `handle`), `periodic=False`
        the reports and samples (a fleet sending its agents' `next_report` and `next_sample` in batches);
        `relabel` rewrites the backend's registration (topology from Kubernetes node labels)."""
        super().__init__(deps)
        if register_every < 1:
            raise ValueError(f"register_every must be >= 1, got {register_every}")
        self.backend = backend
        self.node = backend.node
        self.register_every = register_every
        self.stop_grace_s = stop_grace_s
        self.log_dir = log_dir
        self.consume = consume
        self.periodic = periodic
        self.keep_finished = keep_finished
        self.relabel = relabel
        self.ready = asyncio.Event()  # set once the command consumer is bound (or at start without one)
        self.runs: OrderedDict[RunKey, RankRun] = OrderedDict()
        self._watchers: set[asyncio.Task[None]] = set()
        self._stoppers: set[asyncio.Task[None]] = set()
        self.beats = 0
        self.samples = 0
        self.boot_id = uuid.uuid4().hex
        self.started_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.started_at = self.now()
        if self.periodic:
            await self.report()  # register before anything else
            self.spawn(self._every(self.deps.settings.heartbeat_s, self.report), "heartbeats")
            self.spawn(self._every(self.deps.settings.telemetry_s, self.send_telemetry), "telemetry")
        if self.consume:
            self.spawn(
                self.bus.consume(
                    self.names.agent_cmd(self.node),
                    self.names.consumer(self.name, self.node),
                    AGENT_COMMANDS,
                    self.handle,
                    self.stop_event,
                    ready=self.ready,
                ),
                "commands",
            )
        else:
            self.ready.set()

    async def on_stop(self) -> None:
        for run in self.runs.values():
            if run.running and run.stop_reason is None:
                run.stop_reason, run.lost = "agent stopped", True
        await asyncio.gather(*(self._stop_run(r) for r in list(self.runs.values()) if r.running))
        pending = self._watchers | self._stoppers
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.stop_grace_s + 5.0)
            for t in late:
                t.cancel()

    # -- reports -----------------------------------------------------------------------------------------
    def held_ranks(self) -> list[RunningRank]:
        """The ranks this agent holds, for the reports: running, or ended with the exit not stored yet (a rank
        whose exit is on its way is not lost)."""
        return [
            RunningRank(r.cmd.job_id, r.cmd.attempt, r.cmd.rank, list(r.cmd.gpus))
            for r in self.runs.values()
            if r.running or not r.exit_stored
        ]

    def _quiet(self) -> bool:
        """Advance the backend's clock; True while it plays a silent node."""
        self.backend.advance(self.now() - self.started_at)
        return self.backend.silent

    def busy_gpus(self) -> frozenset[int]:
        return frozenset(g for r in self.runs.values() if r.running for g in r.cmd.gpus)

    def next_report(self) -> AgentRegister | Heartbeat | None:
        """This beat's report: the registration on every `register_every`-th beat (the first included), else a
        heartbeat; None while the node plays silent. Counts the beat."""
        try:
            if self._quiet():
                return None
            if self.beats % self.register_every == 0:
                described = self.backend.describe()
                if self.relabel is not None:
                    described = self.relabel(described)
                return msgspec.structs.replace(described, at=self.now(), boot_id=self.boot_id, ranks=self.held_ranks())
            return Heartbeat(
                node=self.node, at=self.now(), gpus=self.backend.health(), ranks=self.held_ranks(), boot_id=self.boot_id
            )
        finally:
            self.beats += 1

    def next_sample(self) -> Telemetry | None:
        """One telemetry sample of every GPU; None while the node plays silent. Counts the sample."""
        if self._quiet():
            return None
        sample = Telemetry(
            node=self.node, at=self.now(), seq=self.samples, gpus=self.backend.telemetry(self.busy_gpus())
        )
        self.samples += 1
        return sample

    async def report(self) -> None:
        """Send this beat's report (`next_report`)."""
        try:
            rep = self.next_report()
            if rep is not None:
                subject = self.names.agent_register if isinstance(rep, AgentRegister) else self.names.agent_heartbeat
                await self.bus.publish_core(subject, rep)
        except Exception:
            log.exception("%s: heartbeat not sent; the next one will be", self.node)

    async def send_telemetry(self) -> Telemetry | None:
        """Send one sample (`next_sample`); None (nothing sent) while the node is silent."""
        try:
            sample = self.next_sample()
            if sample is not None:
                await self.bus.publish_core(self.names.telemetry(self.node), sample)
        except Exception:
            log.exception("%s: telemetry not sent; the next sample will be", self.node)
            return None
        return sample

    async def _every(self, period: float, action: Callable[[], Awaitable[object]]) -> None:
        """Run `action` every `period` until stopped, first at the node's `phase` of the period."""
        wait = period * phase(self.node)
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=wait)
            wait = period
            if not self.stop_event.is_set():
                await action()

    # -- commands ----------------------------------------------------------------------------------------
    async def handle(self, cmd: AgentCommand, headers: Mapping[str, str]) -> None:
        if cmd.node != self.node:
            log.warning("%s: ignoring a command for node %s: %s", self.node, cmd.node, cmd)
            return
        attrs = {"rackscale.job_id": cmd.job_id, "rackscale.node": self.node}
        if isinstance(cmd, StartRank):
            with self.tracer.span("agent.start_rank", headers, attrs | {"rackscale.rank": cmd.rank}):
                await self.start_rank(cmd, self.tracer.headers())
        else:
            # A stop without trace context continues the trace of the job's rank here, so it doesn't start a
            # stray trace of its own; with neither, there is nothing to continue and no span.
            trace = headers if TRACEPARENT in headers else self.job_trace(cmd.job_id)
            if trace:
                with self.tracer.span("agent.stop_rank", trace, attrs):
                    self.stop_rank(cmd)
            else:
                self.stop_rank(cmd)

    def job_trace(self, job_id: str) -> dict[str, str]:
        """Trace headers of the job's latest rank on this node ({} when none is known)."""
        for (job, _), run in reversed(self.runs.items()):
            if job == job_id and run.trace:
                return run.trace
        return {}

    async def start_rank(self, cmd: StartRank, trace: Mapping[str, str] | None = None) -> RankRun:
        """Launch the rank unless this attempt is already known here; `trace` rides on its events."""
        key = (cmd.job_id, cmd.attempt)
        run = self.runs.get(key)
        if run is not None:
            if run.running:
                log.info("%s: %s:%d already running: StartRank ignored", self.node, *key)
            else:
                log.info("%s: %s:%d already ended: exit reported again", self.node, *key)
                self._watch(self._publish_exit(run))
            return run
        run = RankRun(cmd=cmd, started_at=self.now(), trace=dict(trace or {}))
        self.runs[key] = run
        self._forget_old()
        log_path = self.log_dir / f"{cmd.job_id}.{cmd.attempt}.{cmd.rank}.log" if self.log_dir else None
        run.logs = LogShipper(self.bus, cmd, self.now) if cmd.command else None
        try:
            run.rank = await launch(
                cmd,
                simulated=self.backend.simulated,
                log_path=log_path,
                stop_grace_s=self.stop_grace_s,
                output=run.logs.sink if run.logs is not None else None,
            )
        except LaunchError as e:
            log.warning("%s: %s:%d could not start: %s", self.node, *key, e)
            if run.logs is not None:
                run.logs.sink(0, f"[rackscale: could not start: {e}]".encode())
                await run.logs.close()
            self._finish(run, e.code, str(e))
            self._watch(self._publish_exit(run))
            return run
        log.info("%s: started %s:%d rank %d pid %d", self.node, *key, cmd.rank, run.rank.pid)
        self._watch(self._supervise(run))
        return run

    def stop_rank(self, cmd: StopRank) -> list[RankRun]:
        """Stop every running rank of the job here, in the background (the consumer keeps going)."""
        runs = [
            r
            for (job, attempt), r in self.runs.items()
            if job == cmd.job_id and r.running and (not cmd.attempt or attempt <= cmd.attempt)
        ]
        for run in runs:
            if run.stop_reason is None:
                run.stop_reason = cmd.reason + (" (checkpoint)" if cmd.checkpoint else "")
                run.checkpointed = cmd.checkpoint and cmd.ack
                run.stop_cause = cmd.cause
            # a move's simulated rank takes `checkpoint_s` to write its checkpoint (its GPUs are still held); a
            # real one gets SIGTERM and checkpoints within the stop grace
            delay = self.deps.settings.checkpoint_s if cmd.ack and self.backend.simulated else 0.0
            task = asyncio.create_task(self._stop_run(run, delay), name=f"agent:{self.node}:stop:{cmd.job_id}")
            self._stoppers.add(task)
            task.add_done_callback(self._stoppers.discard)
        if not runs:
            log.info("%s: StopRank for %s: nothing of it runs here", self.node, cmd.job_id)
        return runs

    async def _stop_run(self, run: RankRun, delay_s: float = 0.0) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        if run.rank is not None and run.running:
            try:
                await run.rank.stop(self.stop_grace_s)
            except Exception:
                log.exception("%s: stopping %s failed", self.node, run.cmd.job_id)

    # -- supervision -------------------------------------------------------------------------------------
    def _watch(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro, name=f"agent:{self.node}:watch")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _supervise(self, run: RankRun) -> None:
        cmd = run.cmd
        assert run.rank is not None
        started = RankStarted(
            job_id=cmd.job_id, attempt=cmd.attempt, node=self.node, rank=cmd.rank, pid=run.rank.pid, at=run.started_at
        )
        await self._publish(started, f"{cmd.job_id}:{cmd.attempt}:{cmd.rank}:start", run.trace)
        code = await self._wait_within_limit(run)
        if run.logs is not None:
            await run.logs.close()  # the log is whole before the exit is told
        self._finish(run, code, exit_reason(code, run.stop_reason))
        log.info("%s: %s:%d rank %d %s", self.node, cmd.job_id, cmd.attempt, cmd.rank, run.reason)
        await self._publish_exit(run)

    async def _wait_within_limit(self, run: RankRun) -> int:
        """The rank's exit code; past the job's time limit (counted from this attempt's start here) it is
        stopped as a cancel stops it: SIGTERM, SIGKILL after the stop grace."""
        assert run.rank is not None
        limit = run.cmd.launch.time_limit_s
        if limit is None:
            return await run.rank.wait()
        try:
            return await asyncio.wait_for(asyncio.shield(run.rank.wait()), timeout=limit)
        except TimeoutError:
            if run.stop_reason is None:
                run.stop_reason, run.time_limit = TIME_LIMIT, True
                log.info("%s: %s:%d reached its time limit of %gs", self.node, run.cmd.job_id, run.cmd.attempt, limit)
            await run.rank.stop(self.stop_grace_s)
            return await run.rank.wait()

    def _finish(self, run: RankRun, code: int, reason: str) -> None:
        run.exit_code, run.reason, run.ended_at = code, reason, self.now()
        run.ended.set()

    async def _publish_exit(self, run: RankRun) -> None:
        cmd = run.cmd
        assert run.exit_code is not None
        exited = RankExited(
            job_id=cmd.job_id,
            attempt=cmd.attempt,
            node=self.node,
            rank=cmd.rank,
            exit_code=run.exit_code,
            at=self.now(),
            reason=run.reason,
            lost=run.lost,
            checkpointed=run.checkpointed and not run.lost,
            ran_s=max(0.0, run.ended_at - run.started_at),
            time_limit=run.time_limit,
            cause=_cause(run),
        )
        if await self._publish(exited, f"{cmd.job_id}:{cmd.attempt}:{cmd.rank}:exit", run.trace):
            run.exit_stored = True

    async def _publish(self, event: RankStarted | RankExited, msg_id: str, headers: Mapping[str, str]) -> bool:
        """Publish until JetStream has it (True); after shutdown began, give up after a few tries."""
        delay, tries = 0.1, 0
        while True:
            try:
                await self.bus.publish(self.names.agent_events, event, msg_id=msg_id, headers=headers)
                return True
            except Exception as e:
                tries += 1
                if self.stop_event.is_set() and tries >= 3:
                    log.error("%s: %s lost at shutdown: %s", self.node, msg_id, e)
                    return False
                log.warning("%s: publishing %s failed (%s); retrying", self.node, msg_id, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _forget_old(self) -> None:
        finished = [k for k, r in self.runs.items() if not r.running and r.exit_stored]
        for key in finished[: max(0, len(finished) - self.keep_finished)]:
            del self.runs[key]
