"""A process's output on its way to the log, and the log read back. Pure: lines in, chunks out; chunks in, text out.

The agent reads a process's stdout and stderr (one pipe) as fast as it writes, so a process never waits on its
log. Lines wait here, bounded (`PENDING_MAX_BYTES`), until they ship as `LogChunk`s of up to `LOG_CHUNK_BYTES`;
when a process writes faster than they ship, the OLDEST waiting lines are dropped (the newest are what a
reader wants) and the next chunk says how many. The stream then keeps the newest `LOG_CHUNKS_PER_RANK` chunks
of each process (shared/names.py); a reader that finds the first chunks gone is told so too (`render`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.api import LogLine
from shared.names import LOG_CHUNK_BYTES
from shared.schemas import LogChunk

PENDING_MAX_BYTES = 4 * 1024 * 1024  # lines waiting to ship, per process
LINE_MAX_BYTES = 8 * 1024  # a longer line is cut into lines of this size


def split_line(raw: bytes) -> list[str]:
    """One line as a process wrote it (bytes, maybe without its newline, maybe longer than a chunk): text lines
    of at most LINE_MAX_BYTES, each ending in a newline (invalid UTF-8 replaced)."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    parts = [body[i : i + LINE_MAX_BYTES] for i in range(0, len(body), LINE_MAX_BYTES)] or [b""]
    return [p.decode("utf-8", "replace") + "\n" for p in parts]


@dataclass(slots=True)
class Pending:
    """The lines of one process not yet shipped."""

    limit: int = PENDING_MAX_BYTES
    lines: deque[str] = field(default_factory=deque)
    size: int = 0
    next_line: int = 0  # the index of the first waiting line in everything the process wrote
    dropped: int = 0  # lines dropped since the last chunk
    chunks: int = 0  # chunks taken so far (the next one's index)

    def add(self, line: str) -> None:
        self.lines.append(line)
        self.size += len(line)
        while self.size > self.limit and len(self.lines) > 1:
            self.size -= len(self.lines.popleft())
            self.next_line += 1
            self.dropped += 1

    def __bool__(self) -> bool:
        return bool(self.lines) or self.dropped > 0

    def take(self, job_id: str, attempt: int, rank: int, node: str, at: float) -> LogChunk:
        """The next chunk: waiting lines up to LOG_CHUNK_BYTES (at least one), with the drop count before them."""
        out: list[str] = []
        size = 0
        while self.lines and (not out or size + len(self.lines[0]) <= LOG_CHUNK_BYTES):
            line = self.lines.popleft()
            out.append(line)
            size += len(line)
        self.size -= size
        chunk = LogChunk(
            job_id=job_id,
            attempt=attempt,
            rank=rank,
            node=node,
            n=self.chunks,
            first_line=self.next_line,
            text="".join(out),
            dropped=self.dropped,
            at=at,
        )
        self.chunks += 1
        self.next_line += len(out)
        self.dropped = 0
        return chunk


def dropped_marker(lines: int, why: str) -> str:
    return f"[rackscale: {lines} line{'s' if lines != 1 else ''} dropped: {why}]"


@dataclass(slots=True)
class LogReader:
    """Chunks in stream order (several processes' interleaved as they shipped) to lines, with a marker line wherever
    a process's lines are missing: dropped by its agent, or older chunks the log's cap let go. Kept between calls:
    a follower adds chunks as they come. `resumed`: the reader starts where an earlier one left off (a follower
    reconnecting after an event id), so a process's first chunk here is not a gap."""

    resumed: bool = False
    expect: dict[int, int] = field(default_factory=dict)  # rank → the line index its next chunk should start at

    def add(self, c: LogChunk) -> list[LogLine]:
        out: list[LogLine] = []
        start = self.expect.get(c.rank)
        missing = 0 if start is None and self.resumed else c.first_line - (start or 0) - c.dropped
        if missing > 0:  # chunks no longer held
            out.append(LogLine(rank=c.rank, text=dropped_marker(missing, CAPPED), dropped=missing))
        if c.dropped:
            out.append(LogLine(rank=c.rank, text=dropped_marker(c.dropped, TOO_FAST), dropped=c.dropped))
        # split on newlines alone: a carriage return (a progress bar's) stays inside its line
        out += [LogLine(rank=c.rank, text=line) for line in c.text.split("\n")[:-1]]
        self.expect[c.rank] = c.first_line + c.text.count("\n")
        return out


CAPPED = "the oldest, past the log's size cap"
TOO_FAST = "the process wrote faster than its log shipped"


def as_text(line: LogLine, *, prefix: bool) -> str:
    """A line as plain text answers carry it: with its newline, after "<rank>: " for a reader of several ranks."""
    return f"{line.rank}: {line.text}\n" if prefix else line.text + "\n"


def render(chunks: Iterable[LogChunk], *, prefix: bool) -> list[str]:
    reader = LogReader()
    return [as_text(line, prefix=prefix) for c in chunks for line in reader.add(c)]
