"""One job, one trace: the spans of every hop share the trace id started at the gateway (issue #3, acceptance 7).

Each service gets its own tracer with an in-memory exporter (StackOptions.tracer_factory). The job's spans
are those naming its id (rackscale.job_id) plus every span in a trace one of those belongs to.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.tracing import Tracer, make_provider
from tests.e2e.conftest import E2E, StackFactory, service_errors, wait_until

pytestmark = pytest.mark.asyncio

HOPS = ("gateway", "queue", "placement", "agent")


async def test_a_jobs_spans_from_every_hop_share_one_trace(
    open_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    exporters: dict[str, InMemorySpanExporter] = {}

    def tracer_factory(service: str) -> Tracer:
        exporters[service] = InMemorySpanExporter()
        return Tracer(make_provider(service, span_exporter=exporters[service]), service)

    e2e: E2E = await open_stack(domains=1, tracer_factory=tracer_factory)
    assert set(HOPS) <= set(exporters), exporters
    job = await e2e.submit({"name": "traced", "tenant": "t", "gpus": 8, "duration_s": 0.1})
    view = await e2e.wait_state(job, {"succeeded", "failed", "cancelled"})
    assert view["state"] == "succeeded", view

    def job_spans() -> dict[str, list[ReadableSpan]]:
        every = {svc: list(exp.get_finished_spans()) for svc, exp in exporters.items()}
        traces = {
            s.context.trace_id
            for spans in every.values()
            for s in spans
            if s.attributes and s.attributes.get("rackscale.job_id") == job
        }
        return {svc: [s for s in spans if s.context.trace_id in traces] for svc, spans in every.items()}

    async def every_hop() -> dict[str, list[ReadableSpan]] | None:
        spans = job_spans()
        return spans if all(spans.get(h) for h in HOPS) else None

    try:
        spans = await wait_until(every_hop, f"spans of job {job} from {HOPS}", timeout=10)
    except AssertionError:
        got = {svc: sorted(s.name for s in v) for svc, v in job_spans().items()}
        raise AssertionError(f"job {job}: spans by service {got}; every one of {HOPS} must have one") from None

    ids = {format(s.context.trace_id, "032x") for v in spans.values() for s in v}
    by_trace = {
        svc: sorted({(format(s.context.trace_id, "032x")[:8], s.name) for s in v}) for svc, v in spans.items() if v
    }
    assert len(ids) == 1, f"job {job} is spread over {len(ids)} traces: {by_trace}"
    names = {svc: sorted({s.name for s in v}) for svc, v in spans.items()}
    assert "gateway.submit" in names["gateway"], names
    assert "queue.decide" in names["queue"], names
    assert "placement.commit" in names["placement"], names
    assert "agent.start_rank" in names["agent"], names
    # the gateway's span is the root; every other span has a parent
    roots = [s for v in spans.values() for s in v if s.parent is None]
    assert [s.name for s in roots] == ["gateway.submit"], [s.name for s in roots]
    assert not service_errors(caplog.records)
