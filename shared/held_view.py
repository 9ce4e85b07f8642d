"""A running view of who holds which GPUs, so that a kicked cycle (the queue) or `/v1/cluster` (the gateway) needs
no full read of them.

Full reads now and then (`replace`: the queue's timer cycles, the gateway every few seconds); between them
placement's events keep the view: a Committed adds the allocation, a Released drops it. Both come in order on one
stream, so every commit's release follows it. A view that lags costs the queue at most a rejected order (the
commit script checks every GPU again) or a job waiting for the next event or timer cycle; it can never hand out
a GPU twice. The gateway's shows a lost event until its next full read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from shared.schemas import AllocationRecord, Committed, Released


class HeldView:
    def __init__(self) -> None:
        self._allocs: dict[str, AllocationRecord] = {}
        self.complete = False  # False until the first full read: kicked cycles read everything until then
        self._tick = 0  # counts the events applied
        self._changed_at: dict[str, int] = {}  # job → tick of its last event
        self._dirty: set[str] = set()  # jobs whose allocation changed since `take_dirty`

    def mark(self) -> int:
        """Call before a full read; pass the result to `replace`."""
        return self._tick

    def replace(self, allocs: Iterable[AllocationRecord], since: int) -> None:
        """The full read, except for jobs whose events came while it was on its way: their events are newer."""
        # a record equal to the one held is kept as it is: the cycle's HeldState compares them by identity
        old = self._allocs
        fresh = {a.job_id: a if (o := old.get(a.job_id)) is None or o != a else o for a in allocs}
        for job, tick in self._changed_at.items():
            if tick > since:
                if job in self._allocs:
                    fresh[job] = self._allocs[job]
                else:
                    fresh.pop(job, None)
        self._dirty.update(j for j, a in fresh.items() if old.get(j) is not a)
        self._dirty.update(j for j in old if j not in fresh)
        self._allocs = fresh
        self._changed_at = {job: tick for job, tick in self._changed_at.items() if tick > since}
        self.complete = True

    def _changed(self, job: str) -> None:
        self._tick += 1
        self._changed_at[job] = self._tick
        self._dirty.add(job)

    def committed(self, ev: Committed) -> None:
        held = self._allocs.get(ev.job_id)
        if held is None or held.attempt <= ev.attempt:
            self._allocs[ev.job_id] = AllocationRecord(
                job_id=ev.job_id, attempt=ev.attempt, nodes=list(ev.nodes), committed_at=ev.at
            )
        self._changed(ev.job_id)

    def released(self, ev: Released) -> None:
        held = self._allocs.get(ev.job_id)
        if held is not None and (not ev.attempt or held.attempt <= ev.attempt):
            del self._allocs[ev.job_id]
        self._changed(ev.job_id)

    def by_job(self) -> Mapping[str, AllocationRecord]:
        """The allocations by job id (read-only: the view's own)."""
        return MappingProxyType(self._allocs)

    def take_dirty(self) -> set[str]:
        """The jobs whose allocation came, went or changed since the last call (for the cycle's HeldState)."""
        dirty, self._dirty = self._dirty, set()
        return dirty
