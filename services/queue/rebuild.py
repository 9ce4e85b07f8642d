"""The queue's view rebuilt from the log: every job record, and the allocations the records hold.

Redis is a view of the log that remembers up to which stream sequences it is complete (`Store.view`). When it
comes back empty (a restart without persistence, an operator's FLUSHALL) the view is rebuilt from the start of
the log; when it comes back behind (a replica promoted before it caught up) from the position it remembers.
Either way the view is closed meanwhile (`Store.close_view`): commits and job writes are refused, so handlers
have their messages redelivered after, the gateway answers 503, and no GPU is handed out on a view that
doesn't know who holds it.

The fold is the handlers' own transitions (`shared.lifecycle.replayed`) over each job's log in stream order:
its submit (JOBS), then its events and inbox (EVENTS: the queue's decisions as JobEvents, placement's and the
agents' messages as they came). A job holding GPUs holds its record's allocation; placement's commit and
release script semantics are restored as that (the writer of `alloc:*` is placement, but nothing commits
while the view is closed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from shared import lifecycle
from shared.bus import Bus, Outgoing
from shared.joblog import read_log
from shared.schemas import (
    EVENTS,
    HOLDING,
    JOB_INTAKE,
    AllocationRecord,
    Committed,
    JobEvent,
    JobRecord,
    JobState,
    JobSubmitted,
    RankExited,
    RankStarted,
    Rejected,
    Released,
)
from shared.store import Store, ViewMark

log = logging.getLogger("rackscale.queue.rebuild")

INBOX_TYPES = (JobEvent, Committed, Rejected, Released, RankStarted, RankExited)


@dataclass(slots=True)
class LogFold:
    """Job records folded from the log; pure (messages in, records out)."""

    records: dict[str, JobRecord]  # as they stand: read from the view for a catch-up, empty for a full rebuild
    domain_of: Mapping[str, str] = field(default_factory=dict)  # node → NVLink domain (a commit's domains)
    touched: set[str] = field(default_factory=set)  # jobs whose record the fold changed
    committed_at: dict[tuple[str, int], float] = field(default_factory=dict)  # (job, attempt) → commit time
    skipped: int = 0  # messages of jobs the log never submitted (or submitted before the position read from)
    logged_as: dict[str, tuple[JobState, int]] = field(default_factory=dict)  # job → its last JobEvent's state

    def submitted(self, msg: JobSubmitted, trace: str, now: float) -> None:
        # an array's submit is its tasks' (`lifecycle.submitted_jobs`), as the queue's intake expands it
        for rec in lifecycle.submitted_jobs(msg, now, trace):
            if rec.id not in self.records:
                self.records[rec.id] = rec
                self.touched.add(rec.id)

    def logged(self, msg: lifecycle.Logged) -> None:
        if isinstance(msg, Committed):
            self.committed_at[(msg.job_id, msg.attempt)] = msg.at
        rec = self.records.get(msg.job_id)
        if rec is None:
            self.skipped += 1
            return
        if isinstance(msg, JobEvent):
            self.logged_as[msg.job_id] = (msg.state, msg.attempt)
        domains = None
        if isinstance(msg, Committed):
            domains = list(dict.fromkeys(d for ng in msg.nodes if (d := self.domain_of.get(ng.node))))
        new = lifecycle.replayed(rec, msg, domains)
        if new is not None:
            self.records[msg.job_id] = new
            self.touched.add(msg.job_id)

    def unlogged(self) -> list[JobEvent]:
        """The events the handlers would have published for what the fold applied from the inbox alone (an
        input whose handler was cut short by the outage: its redelivery finds the record changed already and
        publishes nothing), so the log keeps telling who held which GPU when: a holding attempt's placed event
        first, then the state it is in."""
        out: list[JobEvent] = []
        for job in sorted(self.touched):
            rec = self.records[job]
            last = self.logged_as.get(job)
            if last == (rec.state, rec.attempt) or (last is None and rec.state is JobState.PENDING):
                continue
            held = rec.state in HOLDING or bool(rec.started_ranks or rec.exit_codes)
            if held and rec.allocation and (last is None or last[1] != rec.attempt or last[0] is JobState.PENDING):
                out.append(lifecycle.event_of(msgspec.structs.replace(rec, state=JobState.PLACED)))
            if rec.state is not JobState.PLACED or not held:
                out.append(lifecycle.event_of(rec))
        return out

    def allocations(self) -> dict[str, AllocationRecord]:
        """What every job holding GPUs holds: its record's allocation, committed when its commit says."""
        out: dict[str, AllocationRecord] = {}
        for rec in self.records.values():
            if rec.state in HOLDING and rec.allocation:
                at = self.committed_at.get((rec.id, rec.attempt), rec.updated_at)
                out[rec.id] = AllocationRecord(
                    job_id=rec.id, attempt=rec.attempt, nodes=rec.allocation, committed_at=at
                )
        return out


def _trace(fold: LogFold, ev: JobEvent) -> dict[str, str] | None:
    trace = fold.records[ev.job_id].trace
    return {"traceparent": trace} if trace else None


class LogReadShort(RuntimeError):
    """The log came back shorter than the stream: nothing is written, and the next cycle reads it again."""


@dataclass(frozen=True, slots=True)
class Rebuilt:
    full: bool
    jobs: int  # records written
    allocations: int
    messages: int  # log messages read
    mark: ViewMark  # the position the view is complete up to now
    seconds: float


async def rebuild_view(bus: Bus, store: Store, since: ViewMark | None, now: float) -> Rebuilt:
    """Bring the view up to the log: from the start (`since` None: Redis came back empty) or from the position
    the view recorded. The caller holds the rebuild lock and has closed the view; this opens it again at the
    position it read up to."""
    started = time.monotonic()
    names = bus.names
    full = since is None
    after = since or ViewMark()
    records = {} if full else {r.id: r for r in await store.active_jobs()}
    fold = LogFold(records, {n.name: n.domain for n in await store.nodes()})
    messages = 0
    jobs_stream, events_stream = names.stream_for(names.job_submit), names.stream_for(names.events_all)
    # complete up to the streams' ends as of now: what comes later is handled as it comes, once the view opens
    jobs_seq = (await bus.js.stream_info(jobs_stream)).state.last_seq
    events_seq = (await bus.js.stream_info(events_stream)).state.last_seq
    async for entry in read_log(bus.js, jobs_stream, names.job_submit, after.jobs_seq, jobs_seq):
        messages += 1
        try:
            msg = JOB_INTAKE.decode(entry.data)
        except msgspec.DecodeError:
            continue  # dead-lettered when it came
        if isinstance(msg, JobSubmitted):
            fold.submitted(msg, entry.headers.get("traceparent", ""), now)
    read_to = after.events_seq
    async for entry in read_log(bus.js, events_stream, names.events_all, after.events_seq, events_seq):
        messages += 1
        read_to = entry.seq
        try:
            ev = EVENTS.decode(entry.data)
        except msgspec.DecodeError:
            continue
        if isinstance(ev, INBOX_TYPES):
            fold.logged(ev)
    if read_to < events_seq:  # the filter is the stream's one subject: every sequence up to the end is there
        raise LogReadShort(f"the events log read stopped at {read_to} of {events_seq}: the view stays closed")
    changed = [fold.records[j] for j in sorted(fold.touched)]
    await store.restore_jobs(changed)
    events = fold.unlogged()
    if events:  # before anything can be handed out again (the view is still closed)
        await bus.publish_all(
            [
                Outgoing(names.job_event(ev.job_id), ev, f"{ev.job_id}:{ev.state}:{ev.attempt}", _trace(fold, ev))
                for ev in events
            ]
        )
    held = fold.allocations()
    await store.restore_allocations(held, {r.id: r.floor for r in fold.records.values() if r.id in fold.touched})
    new_mark = ViewMark(jobs_seq=max(jobs_seq, after.jobs_seq), events_seq=max(events_seq, after.events_seq))
    await store.open_view(new_mark, now)
    took = time.monotonic() - started
    log.warning(
        "view %s from the log in %.2fs: %d messages read, %d job records and %d allocations written, %d events "
        "published for what only the inbox said%s",
        "rebuilt" if full else f"caught up from {after}",
        took,
        messages,
        len(changed),
        len(held),
        len(events),
        f"; {fold.skipped} messages of jobs not submitted in the log read" if fold.skipped else "",
    )
    return Rebuilt(full, len(changed), len(held), messages, new_mark, took)
