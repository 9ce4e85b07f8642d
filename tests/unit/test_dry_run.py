"""The dry run (shared/core/dry_run.py) is the cycle's own decision: over random fleets and queues, a dry run of a job
followed by the same submit, with nothing else changing, decides the same for it, and the dry run changes nothing.

The scenarios are test_properties.py's (seeded fleets, running jobs, pending mixes, configurations and policies), run
for a few cycles so the scheduler carries memory between them (sticky domains, reservations, borrowers, forecasts).
Every cycle, the last job that arrives is first dry-run against the cycle's inputs, then submitted: the cycle's
decision for it must be the dry run's. A failure names `seed=S policy=P cycle=C`.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from shared.core import Allocate, ClusterState, JobSpec, Pending, PendingCode, Preempt, Reserve, Resize, Scheduler
from shared.core.cycle import CycleConfig
from shared.core.dry_run import NEVER_CODES, DryRun, Start, dry_run
from tests.unit.cycle_builders import Run, fleet, job
from tests.unit.test_properties import (
    POLICIES,
    TENANTS,
    add_running,
    elastic,
    flexible,
    random_config,
    random_job,
    random_state,
    settle,
)

SEEDS = range(100)
CYCLES = 4


def fingerprint(state: ClusterState) -> tuple[Any, ...]:
    """Everything a cycle reads of a state (a dry run must leave all of it as it was)."""
    return (
        dict(state.allocs),
        state.free[:],
        state.nfree[:],
        state.usable[:],
        [[row[:] for row in level] for level in state.count],
        dict(state.tenant_gpus),
        dict(state.priorities),
        state.pins[:],
    )


def memory(sched: Scheduler) -> tuple[Any, ...]:
    """What a scheduler keeps between cycles, as values (and its timeline's snapshots, by identity)."""
    tl = sched.timeline
    return (
        dict(sched.promised),
        dict(sched.lent),
        sched.reserved,
        dict(sched.forecasts),
        dict(sched.requests),
        sched.config,
        (tl.live, tl.times[:], [id(s) for s in tl.snaps], dict(tl.seen)),
    )


def check_same(dry: DryRun, result_decisions: list[Any], job_id: str) -> str | None:
    """Why the cycle's decision for `job_id` differs from the dry run's, or None."""
    final = {d.job_id: d for d in result_decisions if not isinstance(d, Preempt | Resize)}
    decided = final[job_id]
    if decided != dry.decision:
        return f"the cycle decided {decided}, the dry run {dry.decision}"
    preempts = tuple(d.job_id for d in result_decisions if isinstance(d, Preempt) and d.for_job == job_id)
    shrinks = tuple(d.job_id for d in result_decisions if isinstance(d, Resize) and d.for_job == job_id)
    if (preempts, shrinks) != (dry.preempts, dry.shrinks):
        return f"the cycle preempted {preempts} and shrank {shrinks}, the dry run {dry.preempts} and {dry.shrinks}"
    if isinstance(decided, Allocate):
        if (decided.nodes, decided.masks, decided.segment) != (dry.nodes, dry.masks, dry.segment) or dry.start != "now":
            return f"allocated {decided}, the dry run says {dry}"
    elif isinstance(decided, Reserve):
        if decided.nodes != dry.nodes or dry.forecast_start != decided.start or not dry.reserved:
            return f"reserved {decided}, the dry run says {dry}"
    elif dry.reserved or dry.start == "now" or (decided.code in NEVER_CODES and dry.start != "never"):
        return f"pending {decided}, the dry run says {dry}"  # (never with no_fit: a deeper cycle's verdict)
    return None


def scenario(seed: int, policy: str) -> tuple[list[str], Counter[str]]:
    """Run CYCLES cycles, dry-running then submitting one job in each; the failures and the outcomes seen."""
    rng = random.Random(seed)
    state, _ = random_state(rng)
    config = random_config(rng, policy)
    now = 1000.0
    add_running(rng, state, now)
    short = rng.choice((0.0, 0.3, 0.6))
    sched = Scheduler(config)
    pending: dict[str, JobSpec] = {}
    known: dict[str, JobSpec] = {}
    failures: list[str] = []
    seen: Counter[str] = Counter()
    reuse_rng = random.Random(seed * 7919 + 1)
    flex_rng = random.Random(seed * 7919 + 2)
    elastic_rng = random.Random(seed * 7919 + 3)
    next_id = 0
    for c in range(CYCLES):
        arrivals = rng.randint(3, 12) if c == 0 else rng.randint(1, 6)
        for _ in range(arrivals):
            spec = flexible(flex_rng, random_job(rng, state.topo, f"j{next_id}", now, short), state.topo)
            spec = elastic(elastic_rng, spec, state.topo)
            next_id += 1
            pending[spec.id] = spec
            known[spec.id] = spec
        candidate = pending.pop(spec.id)  # the last arrival: dry-run first, then submitted
        usage = {t: rng.uniform(0, 200) for t in TENANTS} if rng.random() < 0.3 else None
        reuse = reuse_rng.random() < 0.5
        before_state, before_memory = fingerprint(state), memory(sched)
        dry = dry_run(sched, state, list(pending.values()), candidate, now, usage, reuse_forecasts=reuse)
        where = f"seed={seed} policy={policy} cycle={c} job={candidate.id}"
        if fingerprint(state) != before_state:
            failures.append(f"{where}: the dry run changed the state")
        if memory(sched) != before_memory:
            failures.append(f"{where}: the dry run changed the scheduler's memory")
        seen[dry.start + (" reserved" if dry.reserved else " estimated" if dry.forecast_start else "")] += 1
        pending[candidate.id] = candidate
        result = sched.cycle(state, list(pending.values()), now, usage, reuse_forecasts=reuse)
        if (why := check_same(dry, result.decisions, candidate.id)) is not None:
            failures.append(f"{where}: {why}")
        now = settle(state, pending, known, result.decisions, now, rng)
    return failures, seen


def test_a_dry_run_decides_what_the_cycle_then_decides_for_the_submitted_job() -> None:
    failures: list[str] = []
    seen: Counter[str] = Counter()
    for policy in POLICIES:
        for seed in SEEDS:
            f, s = scenario(seed, policy)
            failures += f
            seen += s
    assert not failures, "\n".join(failures[:10])
    # every outcome came up, so each comparison above was made
    for outcome in ("now", "later reserved", "later estimated", "later", "never"):
        assert seen[outcome] >= 3, f"too few dry runs ended {outcome!r}: {dict(seen)}"


# -- examples -----------------------------------------------------------------------------------------------


def _run(state: ClusterState, pending: list[JobSpec], candidate: JobSpec, config: CycleConfig) -> DryRun:
    return dry_run(Scheduler(config), state, pending, candidate, now=0.0)


def test_a_job_that_fits_starts_now_in_the_domain_the_cycle_picks() -> None:
    state = fleet(["AAAAAAAAAAAA......", "BBBBBBBBBBBBBB...."], {"A": Run(end=100), "B": Run(end=200)})
    got = _run(state, [], job("c", 16, nvlink="required"), CycleConfig())
    assert got.start is Start.NOW and got.gpus == 16 and got.domains(state.topo) == ("d01",)
    assert set(got.gpus_by_node(state.topo)) == {f"d01-n{i:02d}" for i in range(14, 18)}
    assert got.reason == "" and got.forecast_start is None


def test_a_job_that_waits_gets_its_reservation_start_and_reason() -> None:
    state = fleet(["AAAAAAAAAAAAAAA...", "BBBBBBBBBBBBBBBBB."], {"A": Run(end=100), "B": Run(end=300)})
    got = _run(state, [], job("c", 64, nvlink="required"), CycleConfig())
    assert got.start is Start.LATER and got.reserved and got.forecast_start == 100
    assert got.domains(state.topo) == ("d00",) and got.gpus == 64
    assert got.reason.startswith("needs 16 nodes in one NVLink domain") and "reserved to start in" in got.reason


def test_behind_a_full_reservation_depth_the_start_is_estimated_and_the_reason_is_the_queues() -> None:
    state = fleet(["AAAAAAAAAAAAAAA...", "BBBBBBBBBBBBBBBBB."], {"A": Run(end=100), "B": Run(end=300)})
    ahead = [job("first", 64, nvlink="required", submit_time=-10.0)]
    got = _run(state, ahead, job("c", 64, nvlink="required"), CycleConfig(reservations=1))
    assert got.start is Start.LATER and not got.reserved
    assert got.reason.endswith("1 reservations ahead") and isinstance(got.decision, Pending)
    # the first job takes d00 from 100; the candidate d01 once B ends at 300
    assert got.forecast_start == 300 and got.domains(state.topo) == ("d01",)


def test_a_job_that_can_never_fit_the_fleet_as_it_is_never_starts() -> None:
    state = fleet(["AAAA####AAAAAAAAAA", "BBBBBBB###BBBBBBBB"], {"A": Run(end=100), "B": Run(end=300)})
    got = _run(state, [], job("c", 64, nvlink="required"), CycleConfig())
    assert got.start is Start.NEVER and got.nodes == () and "won't fit even when running jobs end" in got.reason
    assert isinstance(got.decision, Pending) and got.decision.code is PendingCode.NEVER_FITS


def test_a_job_pending_in_the_queue_cannot_be_dry_run() -> None:
    state = fleet(["......"])
    with pytest.raises(ValueError, match="pending already"):
        _run(state, [job("c", 4)], job("c", 4), CycleConfig())
