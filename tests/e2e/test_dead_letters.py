"""A malformed message on any subject a service consumes is dead-lettered, and the service keeps serving
(issue #3, acceptance 6).

Two bad messages per subject: bytes that aren't msgpack, and well-formed msgpack of the wrong shape (an
unknown tag). Each must show up as a DeadLetter on the consuming service's DLQ subject, naming the
subject; afterwards a valid job still runs to the end and inventory still answers drain requests.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import msgspec
import pytest

from shared.schemas import DeadLetter
from tests.e2e.conftest import E2E, StackFactory, service_errors, wait_until

pytestmark = pytest.mark.asyncio

DEAD_LETTERS = msgspec.msgpack.Decoder(DeadLetter)
GARBAGE = b"\xc1\xc1 this is not msgpack"
WRONG_SHAPE = msgspec.msgpack.encode({"type": "no.such.message", "job_id": 42, "nodes": "everywhere"})
NODE = "d00-n03"


async def test_malformed_messages_are_dead_lettered_and_services_keep_serving(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    e2e: E2E = await open_stack(domains=1)
    n = e2e.names
    js = e2e.nc.jetstream()
    durable = [  # JetStream subjects and the services consuming them (a subject may have several)
        (n.job_submit, "queue"),
        (n.job_cancel, "queue"),
        (n.job_move, "queue"),
        (n.placement_events, "queue"),
        (n.agent_events, "queue"),
        (n.node_events, "queue"),
        (n.orders, "placement"),
        (n.agent_cmd(NODE), "agent"),
        (n.node_events, "migration"),
        (n.job_event("no-such-job"), "migration"),
    ]
    core = [  # core NATS subjects and the service subscribed to them
        (n.agent_register, "inventory"),
        (n.agent_heartbeat, "inventory"),
        (n.node_admin, "inventory"),
        (n.telemetry(NODE), "inventory"),
        (n.telemetry(NODE), "migration"),
    ]
    for subject in {s for s, _ in durable}:
        for data in (GARBAGE, WRONG_SHAPE):
            await js.publish(subject, data)
    for subject in {s for s, _ in core}:
        for data in (GARBAGE, WRONG_SHAPE):
            await e2e.nc.publish(subject, data)
    await e2e.nc.flush()

    expected = [*durable, *core]

    async def letters() -> dict[tuple[str, str], list[DeadLetter]] | None:
        got: dict[tuple[str, str], list[DeadLetter]] = defaultdict(list)
        for service in {svc for _, svc in expected}:
            for m in await e2e.stream(n.dead_letter(service)):
                letter = DEAD_LETTERS.decode(m.data)
                assert letter.service == service, letter
                got[(letter.subject, service)].append(letter)
        complete = all(len(got[pair]) >= 2 for pair in expected)
        return got if complete else None

    try:
        got = await wait_until(letters, "two dead letters for every consumed subject")
    except AssertionError:
        last = await _dead_letter_counts(e2e, expected)
        missing = {pair: last.get(pair, 0) for pair in expected if last.get(pair, 0) < 2}
        raise AssertionError(f"(subject, service) without both dead letters (count): {missing}") from None
    for pair in expected:
        datas = sorted(letter.data for letter in got[pair])
        assert datas == sorted([GARBAGE, WRONG_SHAPE]), (pair, got[pair])
        assert all(letter.error for letter in got[pair])

    # everyone still serves: a job runs end to end, inventory answers drain/undrain, the migration service
    # still evacuates a job from a failed GPU
    job = await e2e.submit({"name": "after", "tenant": "t", "gpus": 4, "duration_s": 0.1})
    view = await e2e.wait_state(job, {"succeeded", "failed", "cancelled"})
    assert view["state"] == "succeeded", view
    ckpt = await e2e.submit({"name": "moves", "tenant": "t", "gpus": 4, "checkpointable": True, "duration_s": 30})
    running = await e2e.wait_state(ckpt, {"running"})
    hit = running["allocation"][0]["node"]
    fleet = e2e.stack.fleet
    assert fleet is not None
    fleet.agents[hit].backend.set_health(running["allocation"][0]["gpus"][0], "down")  # type: ignore[attr-defined]
    moved = await e2e.wait_state(ckpt, {"running"}, check=lambda v: v["attempt"] >= 2)
    assert moved["allocation"][0]["node"] != hit, moved
    assert (await e2e.admin(NODE, "drain"))["state"] == "draining"
    assert (await e2e.admin(NODE, "undrain"))["state"] == "up"

    def dead_letter_log(r: logging.LogRecord) -> bool:
        return r.name == "rackscale.bus" and r.getMessage().startswith("dead-lettered")

    assert not service_errors(caplog.records, allow=dead_letter_log)


async def _dead_letter_counts(e2e: E2E, expected: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for service in {svc for _, svc in expected}:
        for m in await e2e.stream(e2e.names.dead_letter(service)):
            counts[(DEAD_LETTERS.decode(m.data).subject, service)] += 1
    return dict(counts)
