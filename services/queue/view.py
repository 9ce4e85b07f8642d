"""The queue's running view of who holds which GPUs, so that a kicked cycle needs no full read of them.

The timer's cycles read every allocation (`replace`); between them placement's events keep the view: a
Committed adds the allocation, a Released drops it. Both come in order on one stream, so every commit's
release follows it. A view that lags costs at most a rejected order (the commit script checks every GPU
again) or a job waiting for the next event or timer cycle; it can never hand out a GPU twice.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.schemas import AllocationRecord, Committed, Released


class HeldView:
    def __init__(self) -> None:
        self._allocs: dict[str, AllocationRecord] = {}
        self.complete = False  # False until the first full read: kicked cycles read everything until then

    def replace(self, allocs: Iterable[AllocationRecord]) -> None:
        self._allocs = {a.job_id: a for a in allocs}
        self.complete = True

    def committed(self, ev: Committed) -> None:
        held = self._allocs.get(ev.job_id)
        if held is None or held.attempt <= ev.attempt:
            self._allocs[ev.job_id] = AllocationRecord(
                job_id=ev.job_id, attempt=ev.attempt, nodes=list(ev.nodes), committed_at=ev.at
            )

    def released(self, ev: Released) -> None:
        held = self._allocs.get(ev.job_id)
        if held is not None and (not ev.attempt or held.attempt <= ev.attempt):
            del self._allocs[ev.job_id]

    def allocations(self) -> list[AllocationRecord]:
        return list(self._allocs.values())
