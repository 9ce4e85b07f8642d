"""Inventory's side of the reconciliation of agents and job records (the verdicts: `shared.reconcile`).

Every registration and heartbeat says which ranks its agent holds; every round (a few heartbeats apart) the
reports are compared with the job records. A rank the records expect that its agent has left out past the
grace is lost: inventory reports its exit as the agent would have (`RankExited` with `lost`, the same msg id,
so a real exit already stored wins), and the queue requeues or fails the job by its `on_node_failure`, as
for a node that went down. A rank whose attempt is over is stopped (`StopRank` for that attempt only). An
agent restarted at once thus ends its jobs the way a slow restart (a node gone down) does, only sooner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from shared.bus import Bus, Outgoing
from shared.reconcile import Reconciler
from shared.schemas import RankExited, RunningRank, StopRank
from shared.store import Store

log = logging.getLogger("rackscale.inventory.ranks")

GRACE_HEARTBEATS = 3  # a rank may be left out of this many heartbeat periods before it is lost...
GRACE_MIN_S = 5.0  # ...and for this long at least (a loaded agent)
START_GRACE_S = 30.0  # a rank no report named yet: its StartRank may be held by a JetStream leader election
LOST_EXIT_CODE = -9  # what a lost rank's exit reads as (killed with its node)


class RankWatch:
    def __init__(self, store: Store, bus: Bus, heartbeat_s: float, clock: Callable[[], float]) -> None:
        self.store, self.bus, self.clock = store, bus, clock
        self.reconciler = Reconciler(
            grace_s=max(GRACE_HEARTBEATS * heartbeat_s, GRACE_MIN_S), start_grace_s=START_GRACE_S
        )
        self.lost = 0  # ranks reported lost (count, for tests and metrics)
        self.stopped = 0  # stray ranks stopped
        self._told: set[tuple[str, str, int, int]] = set()  # verdicts published, while they still stand

    def observe(self, node: str, ranks: list[RunningRank], at: float) -> None:
        self.reconciler.observe(node, ranks, at)

    def forget(self, node: str) -> None:
        self.reconciler.forget(node)

    async def round(self) -> None:
        """Compare the latest reports with the records; report the lost ranks and stop the stray ones."""
        if not self.reconciler.reported:
            return
        named = {job for _, held in self.reconciler.reported.values() for job, _, _ in held}
        jobs = {r.id: r for r in await self.store.active_jobs()}
        jobs.update({r.id: r for r in await self.store.get_jobs(named - set(jobs))})
        now = self.clock()
        lost, stray = self.reconciler.verdicts(jobs, now)
        standing = set(self.reconciler.missing) | set(self.reconciler.extra)
        self._told &= standing  # a verdict that no longer stands may be given again should it come back
        lost = [x for x in lost if (x.node, x.job_id, x.attempt, x.rank) not in self._told]
        stray = [y for y in stray if (y.node, y.job_id, y.attempt, y.rank) not in self._told]
        names = self.bus.names
        out: list[Outgoing] = []
        for x in lost:
            log.warning("%s:%d rank %d on %s is lost: %s", x.job_id, x.attempt, x.rank, x.node, x.reason)
            exited = RankExited(
                job_id=x.job_id,
                attempt=x.attempt,
                node=x.node,
                rank=x.rank,
                exit_code=LOST_EXIT_CODE,
                at=now,
                reason=x.reason,
                lost=True,
            )
            out.append(Outgoing(names.agent_events, exited, f"{x.job_id}:{x.attempt}:{x.rank}:exit"))
        for y in stray:
            log.warning("%s:%d rank %d on %s is stopped: %s", y.job_id, y.attempt, y.rank, y.node, y.reason)
            stop = StopRank(job_id=y.job_id, node=y.node, reason=y.reason, attempt=y.attempt)
            out.append(Outgoing(names.agent_cmd(y.node), stop, f"{y.job_id}:{y.attempt}:stray:{y.node}"))
        if out:
            await self.bus.publish_all(out)
            self._told |= {(v.node, v.job_id, v.attempt, v.rank) for v in (*lost, *stray)}
            self.lost += len(lost)
            self.stopped += len(stray)
