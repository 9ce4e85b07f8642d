"""inventory's health monitor: agents' telemetry → the health rules (shared.health) → node records and events.

- Telemetry comes on `names.telemetry_all` (core NATS, queue group "inventory", so replicas split it).
  Samples are evaluated in batches (whatever arrived while the previous batch was handled: one read and
  one write for all), each against its node's rule state, kept in Redis (`healthstate:<node>`), not in a
  replica's memory: with two replicas a node's samples land on either, and the hysteresis window still
  counts every sample. Samples of one node are seconds apart; two replicas racing on one node's state
  would lose one sample's step, which the next sample makes up.
- When the rules' verdict for a GPU changes, the node record's `rule_health` and `gpu_health` (the worse of
  the agent's own report and the rules) are written with `store.put_node` (bumping `topo:gen`, so the
  queue stops placing on the GPU) and a `NodeChanged` goes out with `gpu_health`, `changed_gpus` and
  `cause` (the rule). A record whose `rule_health` disagrees with the rules' state (a heartbeat written
  on another replica raced it) is rewritten by the next sample, without an event.
- Latched faults (fatal XIDs, a GPU off the bus) are lifted only by `clear` (NodeAdmin `clear_health`) or
  by the agent registering with a new boot id (`forget`).
- A sample from an unregistered node is dropped (counted); one that decodes but can't be this node's
  (bad name, GPU index out of range or repeated) is dead-lettered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import msgspec
import yaml
from nats.aio.msg import Msg
from prometheus_client.core import CounterMetricFamily

from shared.bus import Bus
from shared.health import (
    GpuChange,
    HealthRules,
    HealthRulesError,
    clear,
    evaluate,
    merge_health,
    rules_from_mapping,
    verdicts,
)
from shared.metrics import gauge_text
from shared.schemas import (
    AdminReply,
    NodeChanged,
    NodeHealthState,
    NodeRecord,
    Telemetry,
    TelemetryBatch,
    TelemetryMessage,
    encode,
)
from shared.store import Store

# Reports (telemetry samples, heartbeats, registrations) are handled in batches; a batch waits this long for
# more once the first report is in. Without it the batches held one or two reports and each cost its round
# trips (docs/performance.md, periodic work). Late by this much is nothing next to the periods.
BATCH_WINDOW_S = 0.025

log = logging.getLogger("rackscale.inventory.health")

Save = Callable[..., Awaitable[None]]  # InventoryService._save(rec, changed=...)
Announce = Callable[..., Awaitable[NodeChanged]]  # InventoryService._announce(rec, reason, ...)


class TelemetryError(ValueError):
    """A decodable sample that can't be the node's; it is dead-lettered with this message."""


def load_rules(path: str | Path | None) -> HealthRules:
    """The rules of RACKSCALE_HEALTH_RULES (YAML, see shared.health); the defaults when unset."""
    if path is None:
        return HealthRules()
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise HealthRulesError(f"{path}: {e}") from None
    return rules_from_mapping(doc, str(path))


def check_sample(t: Telemetry, rec: NodeRecord) -> None:
    seen: set[int] = set()
    for g in t.gpus:
        if not 0 <= g.index < rec.gpus or g.index in seen:
            raise TelemetryError(
                f"gpus[].index: node {t.node!r} has GPUs 0..{rec.gpus - 1}; the sample names {g.index}"
                + (" twice" if g.index in seen else "")
            )
        seen.add(g.index)


def agent_health(rec: NodeRecord) -> dict[str, str]:
    """The agent's own report; a record written before rule health existed has only gpu_health."""
    return rec.agent_health if rec.agent_health or rec.rule_health else dict(rec.gpu_health)


def describe(changes: list[GpuChange]) -> str:
    return "; ".join(f"GPU {c.gpu} {c.after}: {c.cause} ({c.detail})" for c in changes)


class HealthMonitor:
    """Evaluates telemetry for one inventory replica; dependencies are the service's store, bus and writers."""

    def __init__(
        self,
        store: Store,
        bus: Bus,
        rules: HealthRules,
        clock: Callable[[], float],
        *,
        lock: Callable[[str], AbstractAsyncContextManager[object]],
        save: Save,
        announce: Announce,
        check_name: Callable[[str], None],
    ) -> None:
        self.store = store
        self.bus = bus
        self.rules = rules
        self.clock = clock
        self.lock = lock
        self.save = save
        self.announce = announce
        self.check_name = check_name
        self.samples = 0  # evaluated samples (count, for tests and metrics)
        self.unknown_samples = 0  # from nodes that never registered
        self.changes: Counter[tuple[str, str]] = Counter()  # (cause, new health) → GPU health changes announced
        self._pending: list[tuple[Telemetry, str]] = []  # (sample, subject)  # samples waiting for the next batch
        self._wake = asyncio.Event()

    async def on_message(self, t: TelemetryMessage, msg: Msg) -> None:
        """Queue a sample (or a fleet's batch of them) for the next batch; the callback returns at once."""
        for sample in t.samples if isinstance(t, TelemetryBatch) else (t,):
            try:
                self.check_name(sample.node)
            except ValueError as e:
                await self.bus.dead_letter(msg.subject, encode(sample), str(e))
                continue
            self._pending.append((sample, msg.subject))
        self._wake.set()

    async def run(self, stop: asyncio.Event, store_errors: tuple[type[Exception], ...]) -> None:
        """Evaluate queued samples in batches until `stop`: one read of every node's record and rule state
        and one write of the states per batch, instead of two round trips per sample (at 64 domains and a
        5 s period, ~230 samples a second, each waiting its turn on the subscription)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                await asyncio.sleep(BATCH_WINDOW_S)  # let a batch gather
            self._wake.clear()
            batch, self._pending = self._pending, []
            if not batch:
                continue
            try:
                await self.evaluate_batch(batch)
            except store_errors as e:
                log.warning("%d telemetry samples dropped, Redis unavailable: %s", len(batch), e)
            except Exception:
                log.exception("%d telemetry samples failed; the agents' next ones are the retry", len(batch))

    async def evaluate_batch(self, batch: list[tuple[Telemetry, str]]) -> None:
        """Evaluate samples (in order; several of one node step its rules in turn) under every node's lock;
        GPU health changes are written and announced. A sample that can't be its node's is dead-lettered."""
        nodes = sorted({t.node for t, _ in batch})
        async with contextlib.AsyncExitStack() as held:
            for node in nodes:  # in name order: a batch never waits on another holding its later locks
                await held.enter_async_context(self.lock(node))
            stored = await self.store.nodes_with_health(nodes)
            now = self.clock()
            states: dict[str, NodeHealthState] = {}
            changed: dict[str, list[GpuChange]] = {}
            for t, subject in batch:
                rec, state = stored[t.node]
                if rec is None:
                    self.unknown_samples += 1
                    continue
                try:
                    check_sample(t, rec)
                except TelemetryError as e:
                    await self.bus.dead_letter(subject, encode(t), str(e))
                    continue
                state = states.get(t.node) or state or NodeHealthState()
                states[t.node] = state
                changed.setdefault(t.node, []).extend(evaluate(self.rules, state, t, now))
                self.samples += 1
            await self.store.put_health_states(states)
            for node, changes in changed.items():
                rec = stored[node][0]
                assert rec is not None
                await self._apply(rec, verdicts(states[node]), changes, "")

    def metrics_text(self) -> bytes:
        """This replica's telemetry figures (the gateway's gauges already count down GPUs per domain)."""
        samples = CounterMetricFamily(
            "rackscale_telemetry_samples", "Telemetry samples evaluated by the health rules", labels=["node_known"]
        )
        samples.add_metric(["yes"], float(self.samples))
        samples.add_metric(["no"], float(self.unknown_samples))
        changes = CounterMetricFamily(
            "rackscale_gpu_health_changes",
            "GPU health changes announced, by cause and new health",
            labels=["cause", "health"],
        )
        for (cause, health), n in sorted(self.changes.items()):
            changes.add_metric([cause, health], float(n))
        return gauge_text([samples, changes])

    async def clear(self, node: str, why: str = "cleared by an operator") -> AdminReply:
        """Lift every rule verdict of the node, latched faults included (NodeAdmin clear_health)."""
        async with self.lock(node):
            rec, state = (await self.store.nodes_with_health([node]))[node]
            if rec is None:
                return AdminReply(ok=False, error=f"unknown node {node}")
            changes = clear(state) if state is not None else []
            await self.store.delete_health_state(node)
            await self._apply(rec, {}, changes, why)
            return AdminReply(ok=True, state=rec.state)

    async def forget(self, node: str) -> None:
        """Drop the rules' state (the agent registered with a new boot id; its record is rewritten by the caller)."""
        await self.store.delete_health_state(node)

    async def _apply(self, rec: NodeRecord, rule_map: dict[str, str], changes: list[GpuChange], why: str) -> None:
        agent = agent_health(rec)
        merged = merge_health(agent, rule_map)
        if rule_map == rec.rule_health and merged == rec.gpu_health and agent == rec.agent_health:
            return
        new = msgspec.structs.replace(rec, agent_health=agent, rule_health=rule_map, gpu_health=merged)
        health_changed = merged != rec.gpu_health
        await self.save(new, changed=health_changed)
        if not health_changed:
            return  # only the record caught up with the rules (a raced write healed): no news
        changed = {str(c.gpu): merged.get(str(c.gpu), "ok") for c in changes}
        changed = {k: v for k, v in changed.items() if v != rec.gpu_health.get(k, "ok")}
        if not changed:  # the record was stale: name what differs
            keys = set(merged) | set(rec.gpu_health)
            changed = {k: merged.get(k, "ok") for k in keys if merged.get(k, "ok") != rec.gpu_health.get(k, "ok")}
        cause = next((c.cause for c in changes if str(c.gpu) in changed), "cleared" if why else "")
        reason = why or describe([c for c in changes if str(c.gpu) in changed]) or "GPU health rules"
        log.warning("node %s: %s", rec.name, reason)
        self.changes.update((cause, h) for h in changed.values())
        await self.announce(
            new, reason, changed_gpus=dict(sorted(changed.items(), key=lambda kv: int(kv[0]))), cause=cause
        )
