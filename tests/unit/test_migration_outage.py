"""A move's step doesn't time out for a bus outage (`shared.liveness` in the migration service's reconcile).

The steps of a move are carried by NATS: while the service's connection is down nothing times out, and after a
reconnect each step gets the whole `migration_step_timeout_s` again. Real, unconnected clients (nothing is
sent: the records the service would save are caught), a bus whose link the test sets, time as an argument.
"""

from __future__ import annotations

from typing import Any

import nats
import pytest

from services.migration.service import MigrationService
from shared.bus import Bus
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import JobBody, JobRecord, JobState, MigrationRecord, NodeGpus
from shared.settings import Settings
from shared.store import Store
from shared.tracing import noop_tracer

pytestmark = pytest.mark.asyncio

TIMEOUT = 30.0
STEP_AT = 100.0  # the move's last step (restoring) was seen then


class LinkBus(Bus):
    """A bus whose link state the test sets."""

    up = True
    count = 0

    @property
    def connected(self) -> bool:
        return self.up

    @property
    def reconnects(self) -> int:
        return self.count


def _service() -> tuple[MigrationService, LinkBus, list[tuple[str, str]]]:
    names = Names(prefix="unit")
    bus = LinkBus(nats.aio.client.Client(), names, "migration")
    settings = Settings(migration_step_timeout_s=TIMEOUT)
    deps = Deps(settings, names, bus, Store.from_url("redis://x", names), noop_tracer("migration"), clock=lambda: 0.0)
    svc = MigrationService(deps)
    saved: list[tuple[str, str]] = []

    async def save(rec: MigrationRecord, step: str | None = None) -> None:
        saved.append((rec.id, rec.state))

    svc.save = save  # type: ignore[method-assign]
    rec = MigrationRecord(
        id="m1",
        job_id="j1",
        tenant="a",
        kind="defrag",
        why="test",
        attempt=1,
        source=[NodeGpus("d00-n00", [0, 1, 2, 3])],
        target=[NodeGpus("d01-n00", [0, 1, 2, 3])],
        state="restoring",
        created_at=90.0,
        steps={"requested": 90.0, "checkpointing": 95.0, "restoring": STEP_AT},
    )
    svc.records[rec.id] = rec
    return svc, bus, saved


def _jobs() -> dict[str, Any]:
    # the restore's order is out: attempt 2 pending, not placed yet (nothing for `advance` to record)
    job = JobRecord(id="j1", spec=JobBody(name="j", tenant="a", gpus=4), state=JobState.PENDING, attempt=2)
    return {"j1": job}


async def test_a_step_times_out_when_the_link_held() -> None:
    svc, _, saved = _service()
    await svc.reconcile(_jobs(), STEP_AT + TIMEOUT)
    assert saved == []
    await svc.reconcile(_jobs(), STEP_AT + TIMEOUT + 0.1)
    assert saved == [("m1", "rolled_back")]


async def test_no_step_times_out_while_the_link_is_down_and_each_gets_the_whole_timeout_after() -> None:
    svc, bus, saved = _service()
    bus.up = False
    for now in (STEP_AT + TIMEOUT + 1, STEP_AT + 10 * TIMEOUT):
        await svc.reconcile(_jobs(), now)
    assert saved == [] and svc.hearing.deaf
    back = STEP_AT + 10 * TIMEOUT + 5
    bus.up, bus.count = True, 1
    await svc.reconcile(_jobs(), back)
    await svc.reconcile(_jobs(), back + TIMEOUT)
    assert saved == []
    await svc.reconcile(_jobs(), back + TIMEOUT + 0.1)  # still not done a whole timeout after the reconnect
    assert saved == [("m1", "rolled_back")]


async def test_a_reconnect_between_two_rounds_counts_too() -> None:
    svc, bus, saved = _service()
    await svc.reconcile(_jobs(), STEP_AT + 1)
    bus.count = 1  # down and back between two rounds: never seen down
    await svc.reconcile(_jobs(), STEP_AT + TIMEOUT + 5)
    assert saved == []
    await svc.reconcile(_jobs(), STEP_AT + 2 * TIMEOUT + 5.1)
    assert saved == [("m1", "rolled_back")]
