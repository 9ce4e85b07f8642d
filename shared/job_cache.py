"""The job records one process last read or wrote, kept for its next decision without a round trip.

The queue (the jobs' writer) decides on these and the store's compare-and-set checks each is still the
stored one, so an update is one round trip unless another replica wrote in between; its timer's full read
decodes only the records that changed. Migration reads the same way. Terminal jobs leave the cache, so it
holds the active jobs at most.

The store (`shared.store.Store`, the Redis adapter) tells the cache of every record it writes or finds on a
failed compare-and-set (`Store.watch_jobs`); the cache's own reads take in what they found unless a write
came in while they were on their way (that is newer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType

from shared.schemas import JOB_RECORD, TERMINAL, JobRecord, JobState
from shared.store import Store

CHANGES_LISTED = 50_000  # past this many changed ids unread, "anything may have changed" is cheaper to keep


class JobCache:
    """Active job records as this process last saw them (raw bytes; decoded once, on the next ask)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._raw: dict[str, bytes] = {}
        self._decoded: dict[str, JobRecord] = {}
        self._view: Mapping[str, JobRecord] = MappingProxyType(self._decoded)
        self._undecoded: set[str] = set()  # seen, not yet in `_decoded` (decoded on the next ask)
        self._pending: set[str] = set()  # seen as pending: a kicked cycle with none left has nothing to decide
        # ids whose record changed, came or went since `take_changed` (None: too many to list)
        self._changed: set[str] | None = set()
        self._writes = 0  # counts what `seen` took in: a read that overlapped a write mustn't undo it
        self._written_at: dict[str, int] = {}
        store.watch_jobs(self.seen)

    # -- writes, through the store ---------------------------------------------------------------------
    async def update(
        self, job_id: str, change: Callable[[JobRecord], JobRecord | None]
    ) -> tuple[JobRecord | None, bool]:
        """`Store.update_job`, deciding first on the record kept here (the store checks it is still current)."""
        return await self.store.update_job(job_id, change, known=self._raw.get(job_id))

    async def create(self, rec: JobRecord) -> tuple[JobRecord, bool]:
        return await self.store.create_job(rec)

    # -- reads ---------------------------------------------------------------------------------------------
    async def read(self, ids: Iterable[str]) -> None:
        """Read these jobs' records into the cache."""
        ids = list(ids)
        if not ids:
            return
        since = self._writes
        for job_id, raw in zip(ids, await self.store.job_bytes(ids), strict=True):
            self._take(job_id, raw, since)

    async def read_active(self) -> None:
        """Make the cache exactly the active jobs (a full read), decoding only the records that changed since
        they were last seen (the queue's timer reads every active job each period; most haven't changed)."""
        since = self._writes
        ids = await self.store.active_job_ids()
        present: set[str] = set()
        for job_id, raw in zip(ids, await self.store.job_bytes(ids), strict=True):
            if raw is not None:
                present.add(job_id)
                self._take(job_id, raw, since)
        for gone in set(self._raw) - present:  # ended (or deleted) since last seen
            self._take(gone, None, since)
        # marks older than this read guard nothing any more: keep the table to the writes since
        self._written_at = {j: n for j, n in self._written_at.items() if n > since}

    def forget(self) -> None:
        """Drop every record (the view was rebuilt: they may not be the stored ones)."""
        self._raw.clear()
        self._decoded.clear()
        self._undecoded.clear()
        self._pending.clear()
        self._changed = None
        self._written_at.clear()

    # -- what is kept ------------------------------------------------------------------------------------
    def record(self, job_id: str) -> JobRecord | None:
        """The record kept for an active job: may be stale."""
        raw = self._raw.get(job_id)
        return JOB_RECORD.decode(raw) if raw is not None else None

    def records(self) -> dict[str, JobRecord]:
        """Every active job's record as last seen. Complete after `read_active()` as long as this process is
        the only writer; may be stale otherwise. The records are shared and stay the same objects until they
        change: read them, don't change them."""
        self._decode()
        return dict(self._decoded)

    def view(self) -> Mapping[str, JobRecord]:
        """`records` without the copy: a read-only view, complete until the next read or write (a changed record
        leaves it until decoded on the next ask). For a pass that doesn't await (the queue's `HeldState.sync`)."""
        self._decode()
        return self._view

    def pending(self) -> dict[str, JobRecord]:
        """The records of pending jobs (a kicked cycle's candidates), without a pass over the rest."""
        self._decode()
        decoded = self._decoded
        return {job_id: decoded[job_id] for job_id in self._pending}

    def ids(self) -> set[str]:
        """The ids `records` holds, without decoding any record."""
        return set(self._raw)

    def has_pending(self) -> bool:
        """Whether a kept job is pending: when none is, a kicked cycle has nothing to decide."""
        return bool(self._pending)

    def take_changed(self) -> set[str] | None:
        """The ids of the jobs whose record changed, came or went since the last call; None when there were
        too many to list (anything may have changed). For one reader: the queue's `HeldState`."""
        changed, self._changed = self._changed, set()
        return changed

    # -- taking records in -----------------------------------------------------------------------------
    def seen(self, job_id: str, data: bytes | None, state: JobState | None) -> None:
        """A record the store wrote or found stored (None: the job doesn't exist)."""
        self._mark(job_id)
        if data is None or state in TERMINAL:
            if self._raw.pop(job_id, None) is not None:
                self._note_change(job_id)
            self._decoded.pop(job_id, None)
            self._undecoded.discard(job_id)
            self._pending.discard(job_id)
            return
        if self._raw.get(job_id) != data:
            self._raw[job_id] = data
            self._decoded.pop(job_id, None)
            self._undecoded.add(job_id)
            self._note_change(job_id)
        # else the same bytes: the decoded record stays the same object (the queue's HeldState compares
        # records by identity)
        if state is JobState.PENDING:
            self._pending.add(job_id)
        else:
            self._pending.discard(job_id)

    def _take(self, job_id: str, raw: bytes | None, since: int) -> None:
        """Take in what a read begun at write count `since` found for a job (None: it doesn't exist), unless a
        write came in meanwhile (that is newer). A record with the bytes already kept isn't decoded again."""
        if self._written_at.get(job_id, 0) > since:
            return
        if raw is not None and self._raw.get(job_id) == raw:
            self._mark(job_id)
            return
        rec = JOB_RECORD.decode(raw) if raw is not None else None
        self.seen(job_id, raw, rec.state if rec is not None else None)
        if rec is not None and job_id in self._undecoded:  # decoded already: not again on the next ask
            self._decoded[job_id] = rec
            self._undecoded.discard(job_id)

    def _mark(self, job_id: str) -> None:
        """Count a record taken in: a read begun before it mustn't undo it (`_take`)."""
        self._writes += 1
        self._written_at[job_id] = self._writes

    def _note_change(self, job_id: str) -> None:
        changed = self._changed
        if changed is not None:
            changed.add(job_id)
            if len(changed) > CHANGES_LISTED:
                self._changed = None

    def _decode(self) -> None:
        if self._undecoded:
            decoded, raw = self._decoded, self._raw
            for job_id in self._undecoded:
                decoded[job_id] = JOB_RECORD.decode(raw[job_id])
            self._undecoded.clear()
