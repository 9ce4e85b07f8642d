"""The queue's side of `shared.core.eligibility`: which waiting jobs the cycle may consider, with the facts the
rules need gathered at the least cost.

Most cycles have no job with a dependency, a singleton or an array's `%N`: they pass everything through
without a look. Otherwise the jobs waited for are looked up in what the queue keeps first (its active records,
and the ends it has confirmed), and only the rest in Redis (one MGET; an id with no record may name an array:
one SMEMBERS, kept, since an array's tasks are fixed at its submit).

A job's end counts only once it is in the log: a record that says it ended is checked against the job's last
`JobEvent` (one direct get per job, once: an end is final and is kept). The record is written before its event
goes out, so without that check a dependant could start, and its `placed` event precede in the log the very end
it waited for (a cancel whose event a NATS outage held back). Likewise a job still holding an allocation counts
as running for singletons and `%N` caps: its end event goes out before the release of its GPUs, so the next one
starts after it in the log too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping

import nats.js.errors
from nats.js.client import JetStreamContext

from shared.core.arrays import ArraySyntaxError, parse_array
from shared.core.dependencies import Condition, DependencySyntaxError, parse_dependency
from shared.core.eligibility import Busy, Sifted, Status, Waiting, named_jobs, sift
from shared.jobs import submit_order
from shared.names import Names
from shared.schemas import EVENTS, HOLDING, JOB_RECORD, TERMINAL, JobEvent, JobRecord, JobState
from shared.store import Store

log = logging.getLogger("rackscale.queue.gate")

ENDS_KEPT = 100_000  # confirmed ends remembered (an evicted one is looked up again)
PARSED_KEPT = 10_000  # dependency and array texts kept parsed


def running(rec: JobRecord) -> bool:
    """Whether the job runs or is about to, as far as its record says (an allocation says so too)."""
    return (
        rec.state in HOLDING
        or rec.state is JobState.PREEMPTED
        or (rec.state is JobState.PENDING and rec.inflight_since is not None)
    )


class Gate:
    def __init__(self, store: Store, js: JetStreamContext, names: Names) -> None:
        self.store, self.js, self.names = store, js, names
        self.ends: OrderedDict[str, Status] = OrderedDict()  # job id → how it ended, as the log says
        self.arrays: dict[str, tuple[str, ...]] = {}  # array id → its task ids
        self._conditions: dict[str, tuple[Condition, ...]] = {}
        self._limits: dict[str, int | None] = {}

    # -- what the rules need of a waiting job ---------------------------------------------------------------
    def conditions(self, rec: JobRecord) -> tuple[Condition, ...]:
        text = rec.spec.dependency
        if not text:
            return ()
        got = self._conditions.get(text)
        if got is None:
            try:
                got = parse_dependency(text)
            except DependencySyntaxError as e:  # the gateway refuses one: a message from elsewhere
                log.error("job %s: dependency %r ignored: %s", rec.id, text, e)
                got = ()
            if len(self._conditions) >= PARSED_KEPT:
                self._conditions.clear()
            self._conditions[text] = got
        return got

    def limit(self, rec: JobRecord) -> int | None:
        text = rec.spec.array
        if not rec.array_id or text is None:
            return None
        if text not in self._limits:
            try:
                limit = parse_array(text).limit
            except ArraySyntaxError:
                limit = None
            if len(self._limits) >= PARSED_KEPT:
                self._limits.clear()
            self._limits[text] = limit
        return self._limits[text]

    def waiting(self, rec: JobRecord) -> Waiting:
        return Waiting(
            id=rec.id,
            tenant=rec.spec.tenant,
            name=rec.spec.name,
            order=submit_order(rec),
            conditions=self.conditions(rec),
            array_id=rec.array_id,
            limit=self.limit(rec),
        )

    def ruled(self, rec: JobRecord) -> bool:
        return bool(rec.spec.dependency) or self.limit(rec) is not None

    # -- the sift ---------------------------------------------------------------------------------------------
    async def sift(
        self, candidates: Mapping[str, JobRecord], active: Mapping[str, JobRecord], holders: Collection[str]
    ) -> Sifted:
        """The candidates (pending, no order out) sorted into eligible, held and doomed. `active`: the active
        records the queue keeps (read before anything here awaits); `holders`: the jobs holding allocations."""
        ruled = [r for r in candidates.values() if self.ruled(r)]
        if not ruled:
            return Sifted(eligible=list(candidates))
        # a singleton's turn depends on every waiting job of its name: those are looked at too, no other
        names = {(r.spec.tenant, r.spec.name) for r in ruled if any(c.kind == "singleton" for c in self.conditions(r))}
        waiting = [
            self.waiting(r) for r in candidates.values() if self.ruled(r) or (r.spec.tenant, r.spec.name) in names
        ]
        busy_ids = {j for j, r in active.items() if running(r)} | {j for j in holders if j not in candidates}
        busy = [Busy(r.id, r.spec.tenant, r.spec.name, r.array_id) for j in busy_ids if (r := active.get(j))]
        # pending, yet not decided this cycle (its order was just taken back, and placement may still commit it
        # late): it keeps its place in its name's line and its array's slots
        capped = {r.array_id for r in ruled if self.limit(r) is not None}
        aside = [
            self.waiting(r)
            for j, r in (active.items() if names or capped else ())  # (only afterok & co: no line, no slot)
            if r.state is JobState.PENDING
            and ((r.spec.tenant, r.spec.name) in names or (r.array_id and r.array_id in capped))
            and j not in candidates
            and j not in busy_ids
        ]
        # what the rules ask of the active records is taken now: the awaits below may change them
        live = {j for j, r in active.items() if r.state not in TERMINAL}
        unknown = [j for j in busy_ids if j not in active]
        named = named_jobs(waiting)
        states = await self._states(named, live)
        if unknown:  # ended jobs not yet released (their records have left what the queue keeps)
            for r in await self.store.get_jobs(sorted(unknown)):
                busy.append(Busy(r.id, r.spec.tenant, r.spec.name, r.array_id))
        arrays = {a: self.arrays[a] for a in named if a in self.arrays}
        out = sift(waiting, busy, states, arrays, aside)
        out.eligible = [j for j in candidates if j not in out.held and j not in out.doomed]
        return out

    async def _states(self, named: Collection[str], live: Collection[str]) -> dict[str, Status]:
        """What is known of each named job, and of each task of each named array."""
        states: dict[str, Status] = {}
        tasks_of = {a: self.arrays[a] for a in named if a in self.arrays}
        jobs = {j for j in named if j not in tasks_of} | {t for ts in tasks_of.values() for t in ts}
        missing = await self._look_up(jobs, live, states, tasks=set().union(*tasks_of.values()) if tasks_of else set())
        # a named id without a record may be an array's (its tasks are fixed from its submit on)
        found: dict[str, list[str]] = {}
        for job in sorted(missing):
            ids = await self.store.array_task_ids(job)
            if ids:
                self.arrays[job] = tuple(ids)
                found[job] = ids
            else:
                states[job] = "unknown"
        if found:
            await self.store.require_view()  # (a job missing from a view being rebuilt isn't "unknown")
            every = {t for ts in found.values() for t in ts}
            await self._look_up(every, live, states, tasks=every)
        elif missing:
            await self.store.require_view()
        return states

    async def _look_up(
        self, jobs: Collection[str], live: Collection[str], states: dict[str, Status], tasks: Collection[str]
    ) -> set[str]:
        """Fill `states` for `jobs`: from the ends kept, the active records, else Redis and (for an end) the log.
        Returns the ids with no record that aren't array tasks (a task not written yet waits)."""
        read: list[str] = []
        for job in jobs:
            if (end := self.ends.get(job)) is not None:
                states[job] = end
            elif job in live:
                states[job] = "waiting"
            else:
                read.append(job)
        if not read:
            return set()
        missing: set[str] = set()
        ended: dict[str, JobState] = {}
        for job, raw in zip(read, await self.store.job_bytes(read), strict=True):
            if raw is None:
                if job in tasks:
                    states[job] = "waiting"  # its array's submit is still being written
                else:
                    missing.add(job)
                continue
            rec = JOB_RECORD.decode(raw)
            if rec.state in TERMINAL:
                ended[job] = rec.state
            else:
                states[job] = "waiting"
        if ended:
            logged = await asyncio.gather(*(self._logged_end(j, s) for j, s in ended.items()))
            for job, end in zip(ended, logged, strict=True):
                if end is None:
                    states[job] = "waiting"  # its end's event isn't out yet
                    continue
                states[job] = self.ends[job] = end
                if len(self.ends) > ENDS_KEPT:
                    self.ends.popitem(last=False)
        return missing

    async def _logged_end(self, job_id: str, recorded: JobState) -> Status | None:
        """How the job ended as its last logged event says; None while that event doesn't say it ended. A log
        with no event of the job at all (dropped by the stream's limits) leaves the record's word."""
        subject = self.names.job_event(job_id)
        try:
            msg = await self.js.get_last_msg(self.names.stream_for(subject), subject)
        except nats.js.errors.NotFoundError:
            return _status(recorded)
        ev = EVENTS.decode(msg.data)
        if not isinstance(ev, JobEvent) or ev.state not in TERMINAL:
            return None
        return _status(ev.state)


def _status(state: JobState) -> Status:
    return "succeeded" if state is JobState.SUCCEEDED else "failed" if state is JobState.FAILED else "cancelled"
