"""The log read back: a stream's messages from a position on, in stream order, for a rebuild of the view.

JetStream is the truth (DESIGN.md, "State and durability"); Redis a view of it that remembers up to which
stream sequence it is complete (`Store.view`). Reading from there through the same transitions that wrote
the view brings it up to date: from 1 when Redis came back empty, from its recorded position when it came
back behind (a replica promoted before it caught up). Reading is an ephemeral consumer without acks: it
changes nothing on the server, and stops at the stream's last sequence as of the start of the read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

QUIET_S = 2.0  # no message for this long: the read is over (what is left of the stream is on other subjects)


@dataclass(frozen=True, slots=True)
class LogEntry:
    seq: int
    at: float  # when the stream stored it (Unix seconds)
    subject: str
    data: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class _End:
    """Where a read is complete, found before it starts: at sequence `seq`, or after `count` messages; neither
    known (a wildcard on part of a stream, read from a position): when the server says nothing is pending."""

    seq: int | None = None
    count: int | None = None


async def _end(
    js: JetStreamContext, stream: str, subject: str, after: int, upto: int | None
) -> tuple[int, _End] | None:
    """(the last sequence to read, where the read is complete); None when there is nothing to read. Not from
    the delivered messages' `num_pending`: nats-server 2.9 reports 0 there before a filtered consumer's end
    (a catch-up of the view read 423 of 434 messages and stopped)."""
    wild = "*" in subject or ">" in subject
    info = await js.stream_info(stream, subjects_filter=subject if wild else None)
    last = info.state.last_seq if upto is None else upto
    if last <= after:
        return None
    if list(info.config.subjects or []) == [subject]:
        return last, _End(seq=last)  # every message of the stream is on the subject: each sequence comes
    if not wild:
        try:
            on_subject = (await js.get_last_msg(stream, subject)).seq or 0
        except NotFoundError:
            return None
        if on_subject <= after:
            return None
        # a later one than `last` on the subject: a message at or past `last` comes, and ends the read
        return last, _End(seq=min(on_subject, last))
    if after == 0 and upto is None:
        count = sum((info.state.subjects or {}).values())  # as of the same answer as `last`
        return (last, _End(count=count)) if count else None
    return last, _End()


async def read_log(
    js: JetStreamContext, stream: str, subject: str, after: int = 0, upto: int | None = None
) -> AsyncIterator[LogEntry]:
    """The messages of `stream` on `subject` (a wildcard too) with a sequence above `after`, in order, up to
    `upto` (default: the stream's last sequence when the read begins). An ordered push consumer hands them
    over as they come (a pull consumer's fetch waits for each message on its own: three times slower)."""
    found = await _end(js, stream, subject, after, upto)
    if found is None:
        return
    last, end = found
    came: list[LogEntry] = []
    more = asyncio.Event()
    done = False
    got = 0

    async def on_msg(m: Msg) -> None:
        nonlocal done, got
        md = m.metadata
        seq = md.sequence.stream
        if seq <= last and not done:
            came.append(LogEntry(seq, md.timestamp.timestamp(), m.subject, m.data, dict(m.headers or {})))
            got += 1
        if end.seq is not None:
            done = done or seq >= end.seq
        elif end.count is not None:
            done = done or got >= end.count or seq >= last
        elif seq >= last or md.num_pending == 0:
            done = True
        more.set()

    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
    sub = await js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True, config=config)
    try:
        if end.seq is None and end.count is None:
            info = await sub.consumer_info()
            # num_pending counts what the server hasn't sent yet: messages sent but not yet through `on_msg`
            # show in `delivered` only (a busy machine returned an empty read of a full stream on that race)
            if info.num_pending == 0 and (info.delivered.stream_seq or 0) <= after and not came:
                return  # nothing on this subject past `after`
        while True:
            try:
                await asyncio.wait_for(more.wait(), QUIET_S)
            except TimeoutError:
                return  # nothing more came: the rest of the stream is on other subjects
            more.clear()
            batch = came[:]
            del came[: len(batch)]
            for entry in batch:
                yield entry
            if done and not came:
                return
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
