"""OpenTelemetry for the services: one tracer provider per process, W3C trace context in NATS headers.

A job's trace starts at the gateway's POST and continues through queue → placement → agent because each
hop publishes with the `traceparent` of the span it is in and the next hop starts its span as a child of
the `traceparent` it received. Exporter by setting: `none` (spans are still created, so context flows),
`console`, or `otlp` (OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT`). Tests pass their own exporter.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()


def make_provider(
    service: str, exporter: str = "none", endpoint: str | None = None, span_exporter: SpanExporter | None = None
) -> TracerProvider:
    """A tracer provider for one service. `span_exporter` (tests) overrides the named exporter."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"rackscale-{service}"}))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    elif exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        url = (endpoint or "http://localhost:4318").rstrip("/")
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    elif exporter != "none":
        raise ValueError(f"unknown trace exporter {exporter!r}; use none, console or otlp")
    return provider


class Tracer:
    """A service's tracer with helpers to carry context through NATS headers."""

    def __init__(self, provider: TracerProvider, service: str) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(f"rackscale.{service}")

    @contextmanager
    def span(
        self, name: str, headers: Mapping[str, str] | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Iterator[Span]:
        """A span that continues the trace in `headers` (if any) and is current inside the block."""
        parent = _PROPAGATOR.extract(carrier=dict(headers)) if headers else None
        with self.tracer.start_as_current_span(name, context=parent, attributes=dict(attributes or {})) as s:
            yield s

    @staticmethod
    def headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Headers carrying the current span's context, to publish with."""
        carrier: dict[str, str] = dict(extra or {})
        _PROPAGATOR.inject(carrier, context=otel_context.get_current())
        return carrier

    def shutdown(self) -> None:
        self.provider.shutdown()


def noop_tracer(service: str) -> Tracer:
    return Tracer(make_provider(service), service)
