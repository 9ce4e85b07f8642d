"""The running jobs' expected ends played forward on copies of the state, kept between forecasts. Pure.

A reservation forecast (`cycle._Cycle._earliest_start`) asks, at each time its cheap gate passes, whether the
policy can place the job once every running job expected to end by then is gone. Built from the live state
each time, that copy released a few hundred nodes' jobs per forecast: up to 8 forecasts a cycle (4
reservations, two searches for a sticky one), every 30 simulated seconds, each replaying the same ends.

A `Timeline` keeps snapshots: `at(t)` is the live state's running jobs less those that end by `t` (a borrower
of reserved nodes at once, as the forecast counts it), without reservation holds, nodes' usability as live.
A later `t` starts from the latest snapshot at or before it and releases only the jobs ending in between.
Before use the snapshots learn what changed in the live state since (jobs started, ended, preempted, shrunk,
moved, borrowers lent): the difference of its running jobs, each applied to every snapshot it touches. A
change of health (usable nodes, GPUs up) or of the state object itself starts over.

A snapshot holds the same allocations as a copy built from scratch, so every count the policies read (free
GPUs, free-node counts, usability, pins) is the same; only the order of its dicts may differ, which no
policy reads. Snapshots before `now` are dropped: a job's replayed end is max(its expected end, now), so a
snapshot at or after `now` stays right as `now` moves on.
"""

from __future__ import annotations

import bisect
from collections.abc import Container

from shared.core.policies import Context, Placement, Policy
from shared.core.shape import Request
from shared.core.state import INF, Allocation, ClusterState

MAX_SNAPSHOTS = 16  # each costs a copy of the state's tables and an update per live change


class Timeline:
    """Snapshots of one live state with its running jobs' ends played up to given times (see module doc)."""

    def __init__(self) -> None:
        self.live: ClusterState | None = None
        self.topo: object = None
        self.usable: list[bool] = []
        self.full: list[int] = []
        # running job -> (its allocation, when the replay ends it: -inf for a borrower, else its expected end)
        self.seen: dict[str, tuple[Allocation, float]] = {}
        self.times: list[float] = []  # the snapshots' times, ascending
        self.snaps: list[ClusterState] = []  # aligned with times
        # per snapshot, the policy's answers on it: (request id, the context's fields, nodes out of play) ->
        # (request, answer); forgotten when the snapshot changes. A reserved job is forecast again every cycle,
        # mostly to the same time with nothing it reads changed
        self.memos: list[dict[tuple[object, ...], tuple[Request, Placement | None]]] = []

    def place(
        self,
        policy: Policy,
        req: Request,
        ctx: Context,
        out: set[int],
        live: ClusterState,
        lent: Container[str],
        now: float,
    ) -> Placement | None:
        """The policy's placement on the state at `ctx.now` (see `at`) with the `out` nodes out of play."""
        i = self._index(live, lent, now, ctx.now)
        snap, memo = self.snaps[i], self.memos[i]
        gone = frozenset(out)
        key = (id(req), ctx.job_end, ctx.demand, ctx.within, gone)  # ctx.now: the snapshot's time
        got = memo.get(key)
        if got is not None and got[0] is req:
            return got[1]
        snap.set_usable_many(gone, False)
        try:
            placement = policy.place(snap, req, ctx)
        finally:
            snap.set_usable_many(gone, True)
        memo[key] = (req, placement)
        return placement

    def at(self, live: ClusterState, lent: Container[str], now: float, t: float) -> ClusterState:
        """The state at `t` (>= now): live less its holds and the running jobs that end by `t`. The caller may
        change the nodes' usability to look, but must restore it before the next call."""
        i = self._index(live, lent, now, t)  # first: it may start the lists over
        return self.snaps[i]

    def _index(self, live: ClusterState, lent: Container[str], now: float, t: float) -> int:
        """The position of the snapshot at `t`, made if there is none."""
        self._sync(live, lent, now)
        i = bisect.bisect_right(self.times, t)
        if i and self.times[i - 1] == t:
            return i - 1
        if i:
            since, snap = self.times[i - 1], self.snaps[i - 1].copy()
            snap.release_many([j for j, (_, end) in self.seen.items() if since < end <= t])
        else:  # from the live state: borrowers (ending at -inf) go too
            snap = self._base(live)
            snap.release_many([j for j, (_, end) in self.seen.items() if end <= t])
        self.times.insert(i, t)
        self.snaps.insert(i, snap)
        self.memos.insert(i, {})
        if len(self.snaps) > MAX_SNAPSHOTS:  # the earliest other than this one goes
            drop = 1 if i == 0 else 0
            del self.times[drop], self.snaps[drop], self.memos[drop]
            i -= drop == 0
        return i

    def _base(self, live: ClusterState) -> ClusterState:
        """Live less its reservation holds (a forecast counts their layouts out of play by itself)."""
        base = live.copy()
        base.release_many([j for j, a in live.allocs.items() if a.hold])
        return base

    def _sync(self, live: ClusterState, lent: Container[str], now: float) -> None:
        """Bring every snapshot up to the live state's running jobs; drop those before `now`."""
        if live is not self.live or live.topo is not self.topo or live.usable != self.usable or live.full != self.full:
            self.live, self.topo, self.usable, self.full = live, live.topo, live.usable[:], live.full[:]
            self.seen, self.times, self.snaps, self.memos = {}, [], [], []
        cur = {j: (a, -INF if j in lent else a.expected_end) for j, a in live.allocs.items() if not a.hold}
        seen = self.seen
        gone = [(j, end) for j, (a, end) in seen.items() if (c := cur.get(j)) is None or c[0] is not a or c[1] != end]
        new = [(a, end) for j, (a, end) in cur.items() if (s := seen.get(j)) is None or s[0] is not a or s[1] != end]
        self.seen = cur
        keep = bisect.bisect_left(self.times, now)
        if keep:
            del self.times[:keep], self.snaps[:keep], self.memos[:keep]
        if not gone and not new:
            return
        for t, snap, memo in zip(self.times, self.snaps, self.memos, strict=True):
            ended = [j for j, end in gone if end > t]  # still there: not yet ended at t
            started = [a for a, end in new if end > t]
            if ended or started:
                memo.clear()
            snap.release_many(ended)
            for a in started:
                snap.allocate(a)
