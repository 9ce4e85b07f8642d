"""Prometheus metrics of one service, kept by the shell so no service has to count for itself.

- Span timings: every span a service ends (the tracer's spans: `queue.decide`, `placement.commit`,
  `agent.start_rank`, ...) is observed into `rackscale_span_seconds{span}`; the queue's decision span
  carries the job's queue wait (`rackscale_queue_wait_seconds`), placement's commit span its outcome
  (`rackscale_placement_commits_total{outcome}`).
- Dead letters: `rackscale_dead_letters_total{service}`, read from the bus's own count.
- Whatever the service adds (`Service.extra_metrics`; the gateway: the cluster's figures from Redis).

Each service has its own registry (several services share one process in `rackscale up` and the tests).
`OpsServer` serves `/metrics` and `/healthz` on RACKSCALE_METRICS_PORT for `shared.runtime.run`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("rackscale.metrics")

# placement and cycle latencies are ms to s; queue waits s to hours
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS = (0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


class _DeadLetters(Collector):
    def __init__(self, service: str, count: Callable[[], int]) -> None:
        self.service, self.count = service, count

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "rackscale_dead_letters", "Malformed messages sent to the dead-letter subject", labels=["service"]
        )
        family.add_metric([self.service], float(self.count()))
        yield family


class ServiceMetrics:
    """One service's registry: span timings, queue waits, commit outcomes, dead letters."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry(auto_describe=True)
        self.span_seconds = Histogram(
            "rackscale_span_seconds", "Duration of the service's spans", ["span"],
            registry=self.registry, buckets=LATENCY_BUCKETS,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "rackscale_queue_wait_seconds", "Submit to placement decision, per placed job attempt",
            registry=self.registry, buckets=WAIT_BUCKETS,
        )  # fmt: skip
        self.commits = Counter(
            "rackscale_placement_commits", "Placement commits by outcome (ok, or the rejection reason)",
            ["outcome"], registry=self.registry,
        )  # fmt: skip

    def watch_dead_letters(self, count: Callable[[], int]) -> None:
        self.registry.register(_DeadLetters(self.service, count))

    def span_processor(self) -> SpanProcessor:
        return _SpanMetrics(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MigrationMetrics:
    """The migration service's figures, in its service's registry: moves started and ended, in flight, and
    the GPU-seconds they pause (the planner's estimate)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        r = metrics.registry
        self.started = Counter("rackscale_migrations", "Moves and evacuation requeues started", ["kind"], registry=r)
        self.ended = Counter(
            "rackscale_migrations_ended", "Moves that reached a final state", ["kind", "state"], registry=r
        )
        self.in_flight = Gauge("rackscale_migrations_in_flight", "Moves under way", registry=r)
        self.gpu_seconds = Counter(
            "rackscale_migration_gpu_seconds", "Estimated GPU-seconds paused by the moves started", registry=r
        )


class _SpanMetrics(SpanProcessor):
    def __init__(self, metrics: ServiceMetrics) -> None:
        self.m = metrics

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.start_time is None or span.end_time is None:
            return
        self.m.span_seconds.labels(span.name).observe(max(0.0, (span.end_time - span.start_time) / 1e9))
        attrs = span.attributes or {}
        wait = attrs.get("rackscale.queue_wait_s")
        if isinstance(wait, int | float):
            self.m.queue_wait.observe(float(wait))
        outcome = attrs.get("rackscale.commit")
        if span.name == "placement.commit" and isinstance(outcome, str):
            # rejection reasons are a handful of fixed phrases; keep the label set bounded anyway
            self.m.commits.labels("ok" if outcome == "ok" else outcome.split(":")[0][:40]).inc()

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class OpsServer:
    """`/metrics` and `/healthz` of one service on its own port (RACKSCALE_METRICS_PORT)."""

    def __init__(
        self,
        metrics: Callable[[], Awaitable[bytes]],
        healthy: Callable[[], bool],
        host: str = "0.0.0.0",
        port: int = 0,
    ) -> None:
        self._metrics, self._healthy = metrics, healthy
        self.host, self.port = host, port
        self._runner: web.AppRunner | None = None

    async def start(self) -> OpsServer:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        log.info("metrics and health on %s:%d", self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    async def _serve_metrics(self, request: web.Request) -> web.Response:
        return metrics_response(await self._metrics())

    async def _serve_health(self, request: web.Request) -> web.Response:
        ok = self._healthy()
        return web.json_response({"status": "ok" if ok else "a loop has stopped"}, status=200 if ok else 503)


def metrics_response(body: bytes) -> web.Response:
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp


def gauge_text(families: list[Any]) -> bytes:
    """Exposition text of ready-made metric families (computed at scrape time)."""

    class _Once(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry)
