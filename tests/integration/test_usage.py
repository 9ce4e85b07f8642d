"""The usage view kept from a real JetStream job log in a real Redis (services/queue/usage.py, shared/usage_store.py).

The log is written here as the queue writes it (JobEvents on events.job.<id>, an inbox message between them), at
fixed times from Monday 2024-01-01 00:00 UTC (T0):

    a1 (a, 8 GPUs)  placed 00:30 day 0 ─ running ─ succeeded 02:30          16 GPU-h on day 0; a late repeat of its
                                                                               placed event after it changes nothing
    b1 (b, 4 GPUs)  placed 23:50 day 0 ─ preempted 00:10 day 1; attempt 2 placed 01:00 day 1, still holding
    c1 (a)          pending ─ cancelled                                      nothing held
    d1 (a, 4 GPUs)  day 2: placed 00:00, migrating 100 s, pending (attempt 2) 160 s, placed 170 s, succeeded 1000 s

The figures are checked against numbers worked out by hand, the decayed usage against the integral; then the view
is handed to a new leader, wiped and rebuilt from the log, and written by two leaders at once, with the same
figures each time.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from services.queue.usage import UsageKeeper
from shared.runtime import Deps
from shared.schemas import Committed, JobEvent, JobState, NodeGpus, encode
from shared.usage_log import DAY, UsageBatch, fold, usage_rows
from shared.usage_store import READY, UsageStore
from tests.integration.conftest import service_deps
from tests.streams import wait_until

pytestmark = pytest.mark.asyncio

T0 = 1_704_067_200  # Monday 2024-01-01 00:00 UTC
H = 7 * DAY
NOW = T0 + 3 * DAY
EIGHT = [NodeGpus("n0", [0, 1, 2, 3]), NodeGpus("n1", [0, 1, 2, 3])]
FOUR = [NodeGpus("n0", [0, 1, 2, 3])]


def ev(
    job: str, state: JobState, at: float, attempt: int, tenant: str, nodes: list[NodeGpus] | None = None
) -> JobEvent:
    holding = state in (JobState.PLACED, JobState.RUNNING, JobState.MIGRATING)
    return JobEvent(
        job_id=job,
        state=state,
        reason="",
        at=at,
        attempt=attempt,
        tenant=tenant,
        nodes=(nodes or []) if holding else [],
    )


P, R, M, S = JobState.PLACED, JobState.RUNNING, JobState.MIGRATING, JobState.SUCCEEDED
LOG = [
    ev("a1", JobState.PENDING, T0, 0, "a"),
    ev("a1", P, T0 + 1800, 1, "a", EIGHT),
    ev("a1", R, T0 + 1810, 1, "a", EIGHT),
    ev("c1", JobState.PENDING, T0 + 100, 0, "a"),
    ev("a1", S, T0 + 9000, 1, "a"),
    ev("a1", P, T0 + 1800, 1, "a", EIGHT),  # a late repeat: its run closed already
    ev("c1", JobState.CANCELLED, T0 + 200, 0, "a"),
    ev("b1", P, T0 + DAY - 600, 1, "b", FOUR),
    ev("b1", R, T0 + DAY - 590, 1, "b", FOUR),
    ev("b1", JobState.PREEMPTED, T0 + DAY + 600, 1, "b"),
    ev("b1", JobState.PENDING, T0 + DAY + 600, 1, "b"),
    ev("b1", P, T0 + DAY + 3600, 2, "b", FOUR),
    ev("b1", R, T0 + DAY + 3610, 2, "b", FOUR),
    ev("d1", P, T0 + 2 * DAY, 1, "a", FOUR),
    ev("d1", R, T0 + 2 * DAY + 5, 1, "a", FOUR),
    ev("d1", M, T0 + 2 * DAY + 100, 1, "a", FOUR),
    ev("d1", JobState.PENDING, T0 + 2 * DAY + 160, 2, "a"),
    ev("d1", P, T0 + 2 * DAY + 170, 2, "a", FOUR),
    ev("d1", R, T0 + 2 * DAY + 175, 2, "a", FOUR),
    ev("d1", S, T0 + 2 * DAY + 1000, 2, "a"),
]
# (tenant, day) → (GPU-seconds, jobs), worked out by hand; b's attempt 2 holds 4 GPUs from 01:00 day 1 up to NOW
EXPECTED = {
    ("a", T0): (8 * 7200.0, 1),
    ("b", T0): (4 * 600.0, 1),
    ("b", T0 + DAY): (4 * 600.0 + 4 * (DAY - 3600.0), 1),
    ("a", T0 + 2 * DAY): (4 * 160.0 + 4 * 830.0, 1),
    ("b", T0 + 2 * DAY): (4 * DAY, 1),
}
# the runs (tenant, GPUs, start, end), for the decayed usage as an integral
RUNS = [
    ("a", 8, T0 + 1800, T0 + 9000),
    ("b", 4, T0 + DAY - 600, T0 + DAY + 600),
    ("b", 4, T0 + DAY + 3600, NOW),
    ("a", 4, T0 + 2 * DAY, T0 + 2 * DAY + 160),
    ("a", 4, T0 + 2 * DAY + 170, T0 + 2 * DAY + 1000),
]


def integral(tenant: str) -> float:
    """GPUs: Σ g·τ·(2^(−(now−end)/h) − 2^(−(now−start)/h)) / τ over the tenant's runs."""
    return sum(g * (2 ** (-(NOW - e) / H) - 2 ** (-(NOW - s) / H)) for who, g, s, e in RUNS if who == tenant)


@pytest_asyncio.fixture
async def deps(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Deps]:
    async with service_deps(nats_url, redis_url, namespace, {}, time.time) as d:
        await d.bus.ensure_streams()
        yield d


async def write_log(deps: Deps, events: list[JobEvent]) -> int:
    """Publish the events in order (an inbox message after the first); the last one's stream sequence."""
    n, js = deps.names, deps.bus.js
    seq = 0
    for i, e in enumerate(events):
        seq = (await js.publish(n.job_event(e.job_id), encode(e))).seq
        if i == 0:
            await js.publish(n.placement_events, encode(Committed(job_id="x", attempt=1, nodes=FOUR, at=T0)))
    return seq


def keeper(deps: Deps) -> UsageKeeper:
    return UsageKeeper(deps.bus, UsageStore(deps.store.r, deps.names), H)


async def folded(k: UsageKeeper, seq: int) -> None:
    """Passes until the keeper has folded the log up to `seq` and found itself caught up."""

    async def probe() -> bool:
        await k.step(True, NOW)
        return k.ready and k.mark >= seq

    await wait_until(probe, f"the usage view folded up to {seq}", 20.0, poll_s=0.05)


async def figures(deps: Deps) -> dict[tuple[str, int], tuple[float, int]]:
    snap = await UsageStore(deps.store.r, deps.names).snapshot(T0 - DAY, T0 + 7 * DAY)
    assert snap.status is not None and snap.status.state == READY
    rows = usage_rows(snap.hours, snap.day_jobs, snap.open_runs, start=T0 - DAY, end=T0 + 7 * DAY, by="day", now=NOW)
    return {(f.tenant, f.start): (f.gpu_s, f.jobs) for f in rows}


def assert_expected(got: dict[tuple[str, int], tuple[float, int]]) -> None:
    assert set(got) == set(EXPECTED)
    for key, (gpu_s, jobs) in EXPECTED.items():
        assert got[key][0] == pytest.approx(gpu_s), key
        assert got[key][1] == jobs, key


async def test_the_view_is_the_log_folded_and_the_decayed_usage_its_integral(deps: Deps) -> None:
    last = await write_log(deps, LOG)
    k = keeper(deps)
    try:
        await folded(k, last)
        assert_expected(await figures(deps))
        assert set(k.open) == {"b1"} and k.open["b1"].attempt == 2
        shares = k.shares(NOW, ["a", "b", "nobody"])
        assert shares is not None and set(shares) == {"a", "b"}
        assert shares["a"] == pytest.approx(integral("a"), rel=1e-9)
        assert shares["b"] == pytest.approx(integral("b"), rel=1e-9)
        # by week: Monday 2024-01-01 holds all of it
        snap = await UsageStore(deps.store.r, deps.names).snapshot(T0, T0 + 7 * DAY)
        weekly = usage_rows(snap.hours, snap.day_jobs, snap.open_runs, start=T0, end=T0 + 7 * DAY, by="week", now=NOW)
        assert [(f.tenant, f.start, f.jobs) for f in weekly] == [("a", T0, 2), ("b", T0, 1)]
        assert weekly[0].gpu_s == pytest.approx(8 * 7200.0 + 4 * 990.0)
    finally:
        await k.let_go()


async def test_a_new_leader_goes_on_from_the_view_and_loses_nothing(deps: Deps) -> None:
    last = await write_log(deps, LOG[:10])  # up to b1's preemption
    first = keeper(deps)
    await folded(first, last)
    before = first.shares(NOW, ["a", "b"])
    await first.let_go()  # the lease moved
    last = await write_log(deps, LOG[10:])
    second = keeper(deps)
    try:
        await folded(second, last)
        assert_expected(await figures(deps))
        shares = second.shares(NOW, ["a", "b"])
        assert shares is not None and before is not None
        # made from hourly buckets (each spread over its hour) and the open run: the integral, to within the hour
        assert shares["a"] == pytest.approx(integral("a"), rel=5e-3)
        assert shares["b"] == pytest.approx(integral("b"), rel=5e-3)
    finally:
        await second.let_go()


async def test_a_wiped_view_is_folded_again_from_the_log(deps: Deps) -> None:
    last = await write_log(deps, LOG)
    k = keeper(deps)
    try:
        await folded(k, last)
        before = await figures(deps)
        r = deps.store.r
        wiped = [key async for key in r.scan_iter(deps.names.usage_key + "*")]
        assert wiped and await r.delete(*wiped)
        assert await UsageStore(r, deps.names).status() is None
        k.ready = False  # (only so `folded` waits for the rebuild's end, not the state before it)
        await folded(k, last)
        assert await figures(deps) == before
        assert_expected(before)
        assert k.shares(NOW, ["a"]) == pytest.approx({"a": integral("a")}, rel=1e-9)
    finally:
        await k.let_go()


async def test_two_leaders_at_once_never_count_a_stretch_twice(deps: Deps) -> None:
    last = await write_log(deps, LOG[:3])  # a1 holding: both leaders have its run open
    old, new = keeper(deps), keeper(deps)
    try:
        await folded(old, last)
        await folded(new, last)  # took over at the same position
        last = await write_log(deps, LOG[3:])
        await folded(new, last)  # writes the rest first (a1's run closed)
        await folded(old, last)  # its batch finds the position moved: it reads the view again, writes nothing twice
        assert_expected(await figures(deps))
        assert old.mark == new.mark == last
    finally:
        await old.let_go()
        await new.let_go()


async def test_a_retried_write_is_not_counted_twice(deps: Deps) -> None:
    store = UsageStore(deps.store.r, deps.names)
    batch = fold({}, {}, LOG[:5])
    assert await store.apply(batch, 0, 5, READY, NOW)
    assert await store.apply(batch, 0, 5, READY, NOW)  # the retry finds its own position: written, not again
    assert not await store.apply(batch, 3, 6, READY, NOW)  # another position: refused
    hours = await store.hours([T0])
    assert sum(hours[T0].values()) == pytest.approx(8 * 7200.0)
    assert await store.apply(UsageBatch(), 5, 5, READY, NOW)  # nothing new: the state alone


async def test_the_expected_figures_add_up() -> None:
    """The hand-worked table against the runs it comes from (so a typo in either shows here, not as a fold bug)."""
    by_tenant: dict[str, float] = {}
    for who, g, s, e in RUNS:
        by_tenant[who] = by_tenant.get(who, 0.0) + g * (e - s)
    for who in ("a", "b"):
        assert sum(v for (t, _), (v, _) in EXPECTED.items() if t == who) == pytest.approx(by_tenant[who])
