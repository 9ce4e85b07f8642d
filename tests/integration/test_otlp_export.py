"""A job's trace leaves the services over OTLP/HTTP, as it would to Jaeger (RACKSCALE_TRACE_EXPORTER=otlp).

An in-test OTLP/HTTP receiver (POST /v1/traces, protobuf) stands in for Jaeger's collector; the whole
system runs with the OTLP exporter pointed at it. One job's spans must arrive from every hop under one
trace id, from services named `rackscale-<service>`, with the decision's policy, domains and queue wait,
the commit's outcome and the agent's start.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.e2e.conftest import StackFactory, open_stack, wait_until  # noqa: F401 (open_stack: a fixture)

pytestmark = pytest.mark.asyncio


class Receiver:
    """Collects exported spans as (service.name, span name, trace id hex, attributes)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: _value(a.value) for a in s.attributes}
                    self.spans.append((resource.get("service.name", ""), s.name, s.trace_id.hex(), attrs))
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


@pytest_asyncio.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = Receiver()
    await r.start()
    try:
        yield r
    finally:
        assert r.runner is not None
        await r.runner.cleanup()


async def test_a_jobs_spans_reach_an_otlp_collector_with_their_attributes(
    open_stack: StackFactory,  # noqa: F811
    receiver: Receiver,
) -> None:
    e2e = await open_stack(domains=1, settings={"trace_exporter": "otlp", "otlp_endpoint": receiver.url})
    await e2e.wait_nodes(18)
    job = await e2e.submit({"name": "traced", "tenant": "a", "gpus": 8, "duration_s": 0.2})
    view = await e2e.wait_state(job, {"succeeded"})

    async def of_job() -> dict[str, list[tuple[str, str, dict[str, Any]]]] | None:
        traces = {t for _, _, t, a in receiver.spans if a.get("rackscale.job_id") == job}
        spans = [(svc, name, a) for svc, name, t, a in receiver.spans if t in traces]
        names = {name for _, name, _ in spans}
        if not {"gateway.submit", "queue.decide", "placement.commit", "agent.start_rank"} <= names:
            return None
        assert len(traces) == 1, f"one trace for the job, got {traces}"
        by_name: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
        for s in spans:
            by_name.setdefault(s[1], []).append(s)
        return by_name

    # the batch exporter sends every few seconds
    by_name = await wait_until(of_job, f"job {job}'s spans at the OTLP receiver", timeout=60)
    services = {svc for spans in by_name.values() for svc, _, _ in spans}
    assert {"rackscale-gateway", "rackscale-queue", "rackscale-placement", "rackscale-agent"} <= services
    (_, _, decide), *_ = by_name["queue.decide"]
    assert decide["rackscale.policy"] == "rackscale"
    assert decide["rackscale.domains"] == view["allocation"][0]["domain"]
    assert decide["rackscale.queue_wait_s"] >= 0
    (_, _, commit), *_ = by_name["placement.commit"]
    assert commit["rackscale.commit"] == "ok"
    ranks = {a["rackscale.rank"] for _, _, a in by_name["agent.start_rank"]}
    assert ranks == set(range(len(view["allocation"])))
