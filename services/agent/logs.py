"""One attempt's output on this node, shipped to the log (the LOGS stream, `names.job_log`) as it comes.

The runner hands every line a process writes to `sink` (it never waits: lines queue in a bounded `Pending`
per process, shared/rank_log.py); one task publishes them as `LogChunk`s, a chunk as soon as one is full or
FLUSH_S after its first line. JetStream being away holds the lines back (the oldest dropped past the bound),
never the process. When the rank ends, `close` ships what is left before its exit is reported, so a job's
log is complete once the job has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from shared import launch
from shared.bus import Bus
from shared.names import LOG_CHUNK_BYTES
from shared.rank_log import Pending, split_line
from shared.schemas import LogChunk, StartRank

log = logging.getLogger("rackscale.agent.logs")

FLUSH_S = 0.25  # a line waits at most this long for more before it ships
RETRY_S = 0.5  # JetStream away: ask again this often
CLOSE_WAIT_S = 10.0  # at the rank's end, how long shipping what is left may hold back its exit report


Wait = Callable[[asyncio.Event, float], Awaitable[None]]


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Until `event` is set or `timeout` seconds pass (tests inject one on their own clock)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


class LogShipper:
    def __init__(self, bus: Bus, cmd: StartRank, clock: Callable[[], float], wait: Wait = wait_event) -> None:
        self.bus, self.cmd, self.clock, self.wait = bus, cmd, clock, wait
        self.pending: dict[int, Pending] = {}  # the process's RANK → its lines waiting to ship
        self._by_local: dict[int, Pending] = {}  # the same, by the process's LOCAL_RANK (what the runner says)
        self.shipped = 0  # chunks published
        self._wake = asyncio.Event()
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"logs:{cmd.job_id}:{cmd.attempt}:{cmd.rank}")

    def sink(self, local_rank: int, raw: bytes) -> None:
        """A line the node's `local_rank`th process wrote (the runner's `OutputSink`)."""
        pending = self._by_local.get(local_rank)
        if pending is None:  # a process's first line: its RANK, once (not for every line)
            rank = launch.global_rank(self.cmd, local_rank)
            pending = self._by_local[local_rank] = self.pending[rank] = Pending()
        for line in split_line(raw):
            pending.add(line)
        if pending.size >= LOG_CHUNK_BYTES:
            self._wake.set()

    async def close(self) -> None:
        """The processes ended: ship what is left (for CLOSE_WAIT_S at most), then stop."""
        self._closing = True
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), CLOSE_WAIT_S)
        except TimeoutError:
            log.warning("%s:%d: its last log lines could not be shipped in time", self.cmd.job_id, self.cmd.attempt)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.wait(self._wake, FLUSH_S)
            self._wake.clear()
            closing = self._closing
            await self._ship()
            if closing:
                return

    async def _ship(self) -> None:
        cmd = self.cmd
        for rank, pending in list(self.pending.items()):
            while pending:
                chunk = pending.take(cmd.job_id, cmd.attempt, rank, cmd.node, self.clock())
                await self._publish(chunk)

    async def _publish(self, chunk: LogChunk) -> None:
        subject = self.bus.names.job_log(chunk.job_id, chunk.attempt, chunk.rank)
        msg_id = f"{chunk.job_id}:{chunk.attempt}:{chunk.rank}:log:{chunk.n}"
        while True:
            try:
                await self.bus.publish(subject, chunk, msg_id=msg_id)
                self.shipped += 1
                return
            except Exception as e:  # JetStream away: the lines wait (their process doesn't)
                log.debug("%s: log chunk %d not shipped yet: %s", msg_id, chunk.n, e)
                await asyncio.sleep(RETRY_S)
