"""Agents reconciled against the job records, both ways. Pure: reports, records and `now` in, verdicts out.

An agent reports, in every registration and heartbeat, the ranks it holds: running, or ended with the exit
not yet stored in JetStream (so a rank whose exit is on its way is never missed). Against the job records:

- **lost**: a rank the records say holds GPUs on a node (its job placed, running or migrating on that node,
  the rank neither exited nor acknowledged a checkpoint) that the node's reports have left out for `grace_s`,
  across at least `MIN_REPORTS` reports, is lost there; one no report ever named (its start may still be on
  its way: a JetStream leader election holds commands for seconds) only after `start_grace_s`. An agent
  that restarted at once (a new process, its ranks gone) reports none of them, so its jobs end the way a
  node that went down ends them (requeued, or failed by `on_node_failure`), only sooner than the node-down
  limit.
- **stray**: a rank an agent reports whose attempt is over (the job ended, or moved on to a later attempt
  after this one was placed and given up) is stopped, once it has outlived the same grace (its own stop may
  be on its way).

Nothing is judged from silence: absence counts only from reports that came (a node that reports nothing is
inventory's node-down rule's, and a bus outage is nobody's fault). The grace covers a rank's start on its
way to the agent (a commit comes before the agent hears of the attempt) and an exit on its way to the queue
(the queue's inbox has the agent's exit before the lost verdict, so a rank that ended is never lost as well).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from shared.schemas import HOLDING, TERMINAL, JobRecord, JobState, RunningRank

MIN_REPORTS = 2  # reports that must leave a rank out before it is lost (one can race the rank's start)

RankKey = tuple[str, str, int, int]  # (node, job id, attempt, rank)


@dataclass(frozen=True, slots=True)
class LostRank:
    node: str
    job_id: str
    attempt: int
    rank: int
    reason: str


@dataclass(frozen=True, slots=True)
class StrayRank:
    node: str
    job_id: str
    attempt: int
    rank: int
    reason: str


@dataclass(slots=True)
class _Doubt:
    since: float  # the first report that disagreed
    reports: int  # reports in a row that disagreed


@dataclass(slots=True)
class Reconciler:
    """What disagreed so far, per (node, job, attempt, rank): `observe` each report as it comes, ask for
    `verdicts` every round (a doubt counts one more report only when its node reported since the last)."""

    grace_s: float
    # a rank no report ever named: its StartRank may still be on its way (a JetStream leader election holds
    # commands for seconds), so it is lost only after this much longer grace
    start_grace_s: float = 0.0
    missing: dict[RankKey, _Doubt] = field(default_factory=dict)  # expected, left out of the reports
    extra: dict[RankKey, _Doubt] = field(default_factory=dict)  # reported, its attempt over
    reported: dict[str, tuple[float, frozenset[tuple[str, int, int]]]] = field(default_factory=dict)
    counted: dict[str, float] = field(default_factory=dict)  # node → time of its report the last round counted
    named: set[RankKey] = field(default_factory=set)  # expected ranks some report named (pruned with them)

    def observe(self, node: str, ranks: Iterable[RunningRank], at: float) -> None:
        """A node's report, received at `at` (inventory's clock): the ranks its agent holds."""
        self.reported[node] = (at, frozenset((r.job_id, r.attempt, r.rank) for r in ranks))

    def forget(self, node: str) -> None:
        """A node gone down: the node-down rule has its jobs; a report after it starts afresh."""
        self.reported.pop(node, None)
        self.counted.pop(node, None)
        for doubts in (self.missing, self.extra):
            for key in [k for k in doubts if k[0] == node]:
                del doubts[key]

    def verdicts(self, jobs: Mapping[str, JobRecord], now: float) -> tuple[list[LostRank], list[StrayRank]]:
        """Compare every node's latest report with `jobs`: the active job records, and the records of the jobs
        the reports name."""
        expected = expected_ranks(jobs.values())
        lost: list[LostRank] = []
        stray: list[StrayRank] = []
        now_missing: dict[RankKey, _Doubt] = {}
        now_extra: dict[RankKey, _Doubt] = {}
        named: set[RankKey] = set()
        for node, (at, held) in self.reported.items():
            fresh = self.counted.get(node, -1.0) < at
            self.counted[node] = at
            for job_id, attempt, rank in expected.get(node, ()):
                key = (node, job_id, attempt, rank)
                if (job_id, attempt, rank) in held:
                    named.add(key)
                    continue
                if key in self.named:
                    named.add(key)
                grace = self.grace_s if key in named else max(self.grace_s, self.start_grace_s)
                doubt = now_missing[key] = _carry(self.missing.get(key), at, fresh)
                if doubt.reports >= MIN_REPORTS and now - doubt.since >= grace:
                    lost.append(LostRank(node, job_id, attempt, rank, f"its agent on {node} no longer runs it"))
            for job_id, attempt, rank in held:
                rec = jobs.get(job_id)
                if rec is None or not attempt_over(rec, attempt):
                    continue
                key = (node, job_id, attempt, rank)
                doubt = now_extra[key] = _carry(self.extra.get(key), at, fresh)
                if doubt.reports >= MIN_REPORTS and now - doubt.since >= self.grace_s:
                    why = f"job {job_id} is {rec.state.value}" if rec.state in TERMINAL else "its attempt is over"
                    stray.append(StrayRank(node, job_id, attempt, rank, why))
        self.missing, self.extra, self.named = now_missing, now_extra, named
        return lost, stray


def _carry(doubt: _Doubt | None, at: float, fresh: bool) -> _Doubt:
    if doubt is None:
        return _Doubt(since=at, reports=1)
    return _Doubt(since=doubt.since, reports=doubt.reports + (1 if fresh else 0))


def expected_ranks(jobs: Iterable[JobRecord]) -> dict[str, set[tuple[str, int, int]]]:
    """node → (job, attempt, rank) the records say hold GPUs there and are alive: ranks are numbered by the
    allocation's nodes (one rank per node, as placement starts them); a rank that exited, or acknowledged its
    move's checkpoint, is no longer expected."""
    out: dict[str, set[tuple[str, int, int]]] = {}
    for rec in jobs:
        if rec.state not in HOLDING:
            continue
        acked = set(rec.move.acked) if rec.state is JobState.MIGRATING and rec.move is not None else set()
        for rank, ng in enumerate(rec.allocation):
            if f"{ng.node}/{rank}" in rec.exit_codes or rank in acked:
                continue
            out.setdefault(ng.node, set()).add((rec.id, rec.attempt, rank))
    return out


def attempt_over(rec: JobRecord, attempt: int) -> bool:
    """The job's attempt can never run (again): the job ended, or went past it (an attempt up to `floor`)."""
    return rec.state in TERMINAL or attempt <= rec.floor
