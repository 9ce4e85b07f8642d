"""The common service shell: dependencies, tasks, signals and graceful drain.

A service is built with explicit dependencies (`Deps`: settings, names, bus, store, clock) and
implements `start()` (spawn its loops with `self.spawn`) and optionally `on_stop()`. `run()` handles
SIGTERM/SIGINT: set the stop event, let every loop finish the message in hand (consumers ack what
they processed and leave the rest in JetStream), then close the connections. Nothing accepted is lost:
unacked messages are redelivered to the next replica or the restarted process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from shared.bus import Bus
from shared.metrics import OpsServer, ServiceMetrics
from shared.names import Names
from shared.settings import Settings
from shared.store import Store
from shared.tracing import Tracer, make_provider

Clock = Callable[[], float]

log = logging.getLogger("rackscale.runtime")


@dataclass(slots=True)
class Deps:
    settings: Settings
    names: Names
    bus: Bus
    store: Store
    tracer: Tracer
    clock: Clock = field(default=time.time)
    metrics: ServiceMetrics | None = None  # made from the bus and tracer when not given

    def __post_init__(self) -> None:
        if self.metrics is None:
            # the shell counts for every service: span timings from its tracer, dead letters from its bus
            self.metrics = ServiceMetrics(self.bus.service)
            bus = self.bus
            self.metrics.watch_dead_letters(lambda: bus.dead_letters)
            self.tracer.provider.add_span_processor(self.metrics.span_processor())

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        service: str,
        nats_url: str,
        redis_url: str,
        names: Names,
        *,
        tracer: Tracer | None = None,
        clock: Clock = time.time,
    ) -> Deps:
        bus = await Bus.connect(nats_url, names, service)
        await bus.ensure_streams(settings.stream_replicas)
        if tracer is None:
            provider = make_provider(service, settings.trace_exporter, settings.otlp_endpoint)
            tracer = Tracer(provider, service)
        return cls(
            settings=settings, names=names, bus=bus, store=Store.from_url(redis_url, names), tracer=tracer, clock=clock
        )

    async def close(self) -> None:
        await self.bus.close()
        await self.store.close()
        self.tracer.shutdown()


class Service:
    name = "service"

    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.stop_event = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []

    @property
    def names(self) -> Names:
        return self.deps.names

    @property
    def bus(self) -> Bus:
        return self.deps.bus

    @property
    def store(self) -> Store:
        return self.deps.store

    @property
    def tracer(self) -> Tracer:
        return self.deps.tracer

    def now(self) -> float:
        return self.deps.clock()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(self._guard(coro, name), name=f"{self.name}:{name}")
        self._tasks.append(task)
        return task

    async def _guard(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: loop %s crashed", self.name, name)
            raise

    async def start(self) -> None:
        raise NotImplementedError

    async def on_stop(self) -> None:
        """Hook for services that hold resources beyond their loops (agents: child processes)."""

    async def stop(self, grace_s: float = 10.0) -> None:
        self.stop_event.set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=grace_s)
            for t in pending:
                t.cancel()
            for t in pending:
                with contextlib.suppress(BaseException):
                    await t
        await self.on_stop()

    async def wait(self) -> None:
        await self.stop_event.wait()

    # -- operations: /metrics and /healthz (OpsServer) ----------------------------------------------------
    def healthy(self) -> bool:
        """Live while no loop has ended (a crashed loop ends; the orchestrator restarts the process)."""
        return not any(t.done() for t in self._tasks)

    async def extra_metrics(self) -> bytes:
        """Exposition text the service adds to the shell's metrics (the gateway: the cluster's figures)."""
        return b""

    async def metrics_text(self) -> bytes:
        assert self.deps.metrics is not None
        return self.deps.metrics.render() + await self.extra_metrics()


async def in_groups(steps: list[Coroutine[Any, Any, Any]], size: int) -> None:
    """Run independent steps (each of its own job or node), `size` at a time: their round trips overlap instead
    of waiting one behind the other, and a step's own writes stay in order (one coroutine). The first failure is
    raised once its group is done; the steps after it are not run (closed), as after a failure one by one."""
    for i in range(0, len(steps), size):
        done = await asyncio.gather(*steps[i : i + size], return_exceptions=True)
        if failed := next((e for e in done if isinstance(e, BaseException)), None):
            for later in steps[i + size :]:
                later.close()
            raise failed


async def run(service: Service) -> None:
    """Run until SIGTERM/SIGINT, then drain gracefully."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, service.stop_event.set)
    ops: OpsServer | None = None
    port = service.deps.settings.metrics_port
    if port:
        ops = await OpsServer(service.metrics_text, service.healthy, port=port).start()
    await service.start()
    settle_heap()
    log.info("%s started", service.name)
    await service.wait()
    log.info("%s stopping", service.name)
    await service.stop()
    if ops is not None:
        await ops.stop()
    await service.deps.close()


def settle_heap() -> None:
    """Once started: move what exists now (topology, clients, modules) out of the collector's reach. A full
    collection otherwise walks all of it, and no message is handled meanwhile (docs/performance.md, the
    collector); what is allocated afterwards is collected as usual."""
    gc.collect()
    gc.freeze()


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
