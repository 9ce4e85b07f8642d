"""The log read back: a stream's messages from a position on, in stream order, for a rebuild of the view.

JetStream is the truth (DESIGN.md, "State and durability"); Redis a view of it that remembers up to which
stream sequence it is complete (`Store.view`). Reading from there through the same transitions that wrote
the view brings it up to date: from 1 when Redis came back empty, from its recorded position when it came
back behind (a replica promoted before it caught up). Reading is an ephemeral consumer without acks: it
changes nothing on the server, and stops at the stream's last sequence as of the start of the read.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

BATCH = 1024
FETCH_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class LogEntry:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


async def read_log(
    js: JetStreamContext, stream: str, subject: str, after: int = 0, upto: int | None = None
) -> AsyncIterator[LogEntry]:
    """The messages of `stream` on `subject` (a wildcard too) with a sequence above `after`, in order, up to
    `upto` (default: the stream's last sequence when the read begins)."""
    last = (await js.stream_info(stream)).state.last_seq if upto is None else upto
    if last <= after:
        return
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,  # an explicit-ack consumer would stop after max_ack_pending
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=after + 1,
    )
    sub = await js.pull_subscribe(subject, stream=stream, config=config)
    # nats-py's fetch of n waits until n came or it times out: ask for what the consumer says is pending
    want = 1
    try:
        while want:
            try:
                msgs = await sub.fetch(want, timeout=FETCH_TIMEOUT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                return  # nothing (more) on this subject up to `last`
            for m in msgs:
                seq = m.metadata.sequence.stream
                if seq > last:
                    return
                yield LogEntry(seq, m.subject, m.data, dict(m.headers or {}))
                if seq == last:
                    return
            want = min(BATCH, msgs[-1].metadata.num_pending)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
