"""`POST /v1/jobs?dry_run=true` at the gateway, against real NATS and Redis: the body is checked as a submit's (the
same answers), the queue leader is asked over `names.dry_run` (here a stand-in responder; the real leader answers in
tests/integration/test_queue_dry_run.py and tests/e2e/test_dry_run.py), and nothing reaches the JOBS stream.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from shared.schemas import DRY_RUN_REQUEST, DryRunReply, JobBody, NodeGpus, NodeRecord, TopologyBody, encode
from tests.integration import test_gateway
from tests.integration.test_gateway import JOB, NOW, Gw

pytestmark = pytest.mark.asyncio

gw = test_gateway.gw  # the gateway alone, on real NATS and Redis (its fixture)

DRY = "/v1/jobs?dry_run=true"


async def _nodes(g: Gw, count: int = 4) -> None:
    for i in range(count):
        await g.deps.store.put_node(NodeRecord(name=f"d00-n{i:02d}", domain="d00"))


async def _leader(nats_client: NatsClient, g: Gw, reply: DryRunReply, asked: list[Any]) -> None:
    """A stand-in for the queue leader's dry-run responder."""

    async def answer(m: Msg) -> None:
        asked.append(DRY_RUN_REQUEST.decode(m.data))
        await m.respond(encode(reply))

    await nats_client.subscribe(g.names.dry_run, cb=answer)
    await nats_client.flush()


@pytest.mark.parametrize(
    ("data", "status", "field"),
    [
        (b"{not json", 400, None),
        (b'{"name": "x", "tenant": "a", "gpus": 0}', 422, "gpus"),
        (b'{"name": "x", "tenant": "a", "gpus": 4, "colour": "red"}', 422, "colour"),
        (b'{"name": "x", "tenant": "a", "gpus": 24}', 422, "gpus"),  # 6 nodes; the cluster has 4
        (b'{"name": "x", "tenant": "a", "gpus": 8, "topology": {"segment": 3}}', 422, "topology.segment"),
    ],
)
async def test_a_dry_run_answers_what_a_submit_answers_for_a_bad_body(
    gw: Gw, nats_client: NatsClient, data: bytes, status: int, field: str | None
) -> None:
    await _nodes(gw)
    asked: list[Any] = []
    await _leader(nats_client, gw, DryRunReply(ok=True), asked)
    headers = {"Content-Type": "application/json"}
    dry = await gw.client.post(DRY, data=data, headers=headers)
    real = await gw.client.post("/v1/jobs", data=data, headers=headers)
    assert (dry.status, await dry.json()) == (real.status, await real.json())
    assert dry.status == status and (await dry.json())["field"] == field
    assert asked == [] and await gw.stream_count(gw.names.job_submit) == 0


async def test_a_dry_run_asks_the_queue_leader_and_answers_its_decision(gw: Gw, nats_client: NatsClient) -> None:
    await _nodes(gw)
    asked: list[Any] = []
    placed = [NodeGpus("d00-n02", [0, 1, 2, 3]), NodeGpus("d00-n03", [0, 1, 2, 3])]
    reply = DryRunReply(ok=True, start="now", allocation=placed, domains=["d00"], gpus=8, segment=2, reason="")
    await _leader(nats_client, gw, reply, asked)
    for query in ("dry_run=true", "dry_run=1", "dry_run=TRUE"):
        resp = await gw.client.post(f"/v1/jobs?{query}", json={**JOB, "topology": {"segment": 2}})
        assert resp.status == 200, await resp.text()
        assert await resp.json() == {
            "start": "now",
            "allocation": [
                {"domain": "d00", "node": "d00-n02", "gpus": [0, 1, 2, 3]},
                {"domain": "d00", "node": "d00-n03", "gpus": [0, 1, 2, 3]},
            ],
            "domains": ["d00"],
            "gpus": 8,
            "segment": 2,
            "forecast_start": None,
            "reason": "",
            "reserved": False,
            "preempts": 0,
            "shrinks": 0,
        }
    assert len(asked) == 3 and len({a.job_id for a in asked}) == 3  # a fresh id each time, as a submit's
    assert asked[0].spec == JobBody(name="train", tenant="a", gpus=8, topology=TopologyBody(segment=2))
    assert asked[0].submitted_at == NOW
    assert await gw.stream_count(gw.names.job_submit) == 0  # nothing submitted
    assert (await (await gw.client.get("/v1/jobs")).json())["total"] == 0
    # dry_run=false (or 0) is a plain submit
    assert (await gw.client.post("/v1/jobs?dry_run=0", json=JOB)).status == 202
    assert len(asked) == 3 and await gw.stream_count(gw.names.job_submit) == 1


async def test_a_bad_dry_run_value_is_named(gw: Gw) -> None:
    resp = await gw.client.post("/v1/jobs?dry_run=maybe", json=JOB)
    assert resp.status == 422
    assert await resp.json() == {"error": "dry_run: must be true, false, 1 or 0, got 'maybe'", "field": "dry_run"}
    assert await gw.stream_count(gw.names.job_submit) == 0


async def test_no_queue_leader_is_503_and_a_leader_that_cannot_decide_says_why(gw: Gw, nats_client: NatsClient) -> None:
    await _nodes(gw)
    resp = await gw.client.post(DRY, json=JOB)
    assert resp.status == 503 and "no queue leader answered" in (await resp.json())["error"]
    await _leader(nats_client, gw, DryRunReply(ok=False, error="the queue leader could not decide: boom"), [])
    resp = await gw.client.post(DRY, json=JOB)
    assert resp.status == 503 and (await resp.json())["error"] == "the queue leader could not decide: boom"
    assert await gw.stream_count(gw.names.job_submit) == 0
