"""inventory: the truth about nodes. Agents' registrations and heartbeats in, node records and events out.

- `names.agent_register` / `names.agent_heartbeat` (core NATS, queue group "inventory"): an
  `AgentRegister` creates or refreshes the node's `NodeRecord` (domain = the fabric cluster UUID, or the
  node's own name without a fabric; GPU count; GPU health); a `Heartbeat` refreshes `last_heartbeat` and
  the GPU health, and brings a down node back (up, or draining if an operator drained it).
- A timer (`check_once(now)`, every `heartbeat_s`) marks a node down when it sent nothing for
  `missed_heartbeats * heartbeat_s` seconds. Time comes from the injected clock, so tests drive it.
  Only the time inventory could hear counts (`shared.liveness`): while its NATS connection is down nothing
  is judged, and after a reconnect (or a Redis outage that lost heartbeats, or a server that stopped
  answering) every node gets a fresh grace of the whole limit. A bus outage is not a node's silence.
- `names.node_admin` (request/reply, `NodeAdmin` → `AdminReply`): drain / undrain. An unknown node gets
  ok=False and error "unknown node X". A drain survives the node going down and coming back.

- `names.telemetry_all` (core NATS, queue group "inventory"): GPU telemetry, evaluated by the health rules
  (`services/inventory/health.py`, `shared/health.py`); a GPU's `gpu_health` is the worse of the agent's own
  report and the rules' verdict. `clear_health` (NodeAdmin) lifts the rules' verdicts, latched ones too.

Every change of a node's state, topology or GPU health is written with `store.put_node` (which bumps
`topo:gen`) and announced as a `NodeChanged` on `names.node_event(node)` (JetStream). A heartbeat that changes
nothing writes no record at all: heartbeats are batched (latest per node, one batch while the previous one
is written), read with one MGET and recorded with one ZADD in the liveness zset `names.heartbeats_key`, which
`store.get_nodes` reads back into `last_heartbeat` and `check_once` asks for the silent nodes alone. So 1,152
nodes beating every second cost a few round trips a second, and `topo:gen` stays put for topology caches.

A report that decodes but can't be a node (empty or unusable name, GPU indices not 0..n-1) is
dead-lettered like an undecodable one. Handlers for one node are serialised by a per-node lock; across
replicas the last write wins, and a lost update heals at the next heartbeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec
import nats.js.errors
from nats.aio.msg import Msg

from services.inventory.health import BATCH_WINDOW_S, HealthMonitor, load_rules
from services.inventory.ranks import RankWatch
from shared.core.topology_io.agents import NO_FABRIC_UUIDS
from shared.health import HealthRules, merge_health
from shared.liveness import Hearing, lost, may_judge, observe, overdue, silent_for
from shared.redis_client import UNAVAILABLE
from shared.runtime import Deps, Service, in_groups
from shared.schemas import (
    AGENT_REPORTS,
    EVENTS,
    NODE_ADMIN,
    TELEMETRY,
    AdminReply,
    AgentRegister,
    AgentReport,
    AgentReports,
    GpuReport,
    Heartbeat,
    NodeAdmin,
    NodeChanged,
    NodeRecord,
    encode,
)

log = logging.getLogger("rackscale.inventory")

NodeStateName = Literal["up", "draining", "down"]
QUEUE_GROUP = "inventory"
# A node name becomes part of NATS subjects (agent.cmd.<node>) and Redis keys: no dots, wildcards or spaces.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_PUBLISH_ATTEMPTS = 3
REGISTER_CONCURRENCY = 64  # new nodes' registrations handled at once (each a few round trips)
RANK_ROUND_TICKS = 2  # the reports are reconciled with the job records every this many checks
# Redis going away (restart, failover, shutdown) is an outage to wait out, not a bug to trace back.
STORE_ERRORS = UNAVAILABLE


class ReportError(ValueError):
    """A decodable report that can't describe a node; it is dead-lettered with this message."""


def gpu_health_map(gpus: list[GpuReport], count: int) -> dict[str, str]:
    """NodeRecord.gpu_health from GPU reports: index → "degraded" | "down"; ok GPUs are left out."""
    ordered = sorted(gpus, key=lambda g: g.index)
    return {str(g.index): g.health for g in ordered if g.health != "ok" and 0 <= g.index < count}


def record_from_register(reg: AgentRegister, prev: NodeRecord | None, now: float) -> NodeRecord:
    """The record a registration makes; an operator's drain (and its reason) carries over from `prev`."""
    check_register(reg)
    drained = prev.drained if prev is not None else False
    agent = gpu_health_map(reg.gpus, len(reg.gpus))
    rules = prev.rule_health if prev is not None and not new_boot(reg, prev) else {}
    return NodeRecord(
        name=reg.node,
        domain=reg.node if reg.cluster_uuid in NO_FABRIC_UUIDS else reg.cluster_uuid,
        clique=reg.clique_id,
        gpus=len(reg.gpus),
        gpu_health=merge_health(agent, rules),
        agent_health=agent,
        rule_health=rules,
        boot_id=reg.boot_id,
        state="draining" if drained else "up",
        drained=drained,
        reason=prev.reason if prev is not None and drained else "",
        last_heartbeat=now,
        backend=reg.backend,
        leaf=reg.leaf,
        addr=reg.addr,
    )


def verdict_record(ev: NodeChanged) -> NodeRecord:
    """The part of a node's record its last NodeChanged keeps: drained (and why), the rules' verdicts, the
    boot they belong to. The rest comes from the registration; `last_heartbeat` 0 marks it as no record."""
    return NodeRecord(
        name=ev.node,
        domain="",
        state="draining" if ev.drained else "up",
        drained=ev.drained,
        reason=ev.reason if ev.drained else "",
        rule_health=dict(ev.rule_health),
        boot_id=ev.boot_id,
    )


def new_boot(reg: AgentRegister, prev: NodeRecord) -> bool:
    """The agent restarted since it last registered: latched GPU faults are cleared (services/inventory/health.py)."""
    return bool(prev.boot_id and reg.boot_id and prev.boot_id != reg.boot_id)


def check_node_name(node: str) -> None:
    if not NODE_NAME.fullmatch(node):
        raise ReportError(
            f"node: {node!r} is not a node name (1-128 of A-Z a-z 0-9 _ -, starting with a letter or digit)"
        )


def check_register(reg: AgentRegister) -> None:
    check_node_name(reg.node)
    indices = sorted(g.index for g in reg.gpus)
    if not indices or indices != list(range(len(indices))):
        raise ReportError(f"gpus: node {reg.node!r} reports GPU indices {indices}; they must be 0..n-1, each once")
    if reg.clique_id < 0:
        raise ReportError(f"clique_id: node {reg.node!r} reports {reg.clique_id}; it must be >= 0")
    if reg.leaf is not None and not reg.leaf:
        raise ReportError(f"leaf: node {reg.node!r} reports an empty leaf name (use null for none)")


def _repeats(rec: NodeRecord, prev: NodeRecord) -> bool:
    """The record a registration makes differs from the stored one in nothing but liveness (a new boot, a new
    state, description or GPU health all show in the record)."""
    return msgspec.structs.replace(rec, last_heartbeat=prev.last_heartbeat) == prev


def _topology_fields(rec: NodeRecord) -> tuple[Any, ...]:
    return (rec.domain, rec.clique, rec.gpus, rec.leaf, rec.backend, rec.addr)


class InventoryService(Service):
    name = "inventory"

    def __init__(
        self, deps: Deps, *, check_interval_s: float | None = None, health_rules: HealthRules | None = None
    ) -> None:
        super().__init__(deps)
        self.check_interval_s = check_interval_s or deps.settings.heartbeat_s
        self.started_at = 0.0
        # since when inventory could hear every node without a break (its start, its last reconnect, the end
        # of the last Redis outage that lost heartbeats): silence counts only from there
        self.hearing = Hearing(since=0.0)
        self._store_down = False  # recording heartbeats failed: they are lost until Redis answers again
        self._store_breaks = 0  # Redis outages that lost heartbeats, ended (part of the hearing's epoch)
        self.unknown_heartbeats = 0  # heartbeats from nodes that never registered (count, for tests/metrics)
        self._locks: dict[str, asyncio.Lock] = {}
        self._subs: list[Any] = []
        # heartbeats wait here (latest per node) for the flusher, which handles them a batch at a time
        self._beats: dict[str, Heartbeat] = {}
        self._regs: dict[str, AgentRegister] = {}  # registrations waiting for their flusher, one per node
        self._beat = asyncio.Event()  # wakes the heartbeats' flusher
        self._reg = asyncio.Event()  # wakes the registrations' flusher
        self.ranks = RankWatch(self.store, self.bus, deps.settings.heartbeat_s, self.now)
        self._heard: dict[str, float] = {}  # node → when this replica last handled a report of it
        self._ticks = 0
        self.health = HealthMonitor(
            self.store,
            self.bus,
            health_rules or load_rules(deps.settings.health_rules_file),
            self.now,
            lock=self._lock,
            save=self._save,
            announce=self._announce,
            check_name=check_node_name,
        )

    @property
    def down_after_s(self) -> float:
        s = self.deps.settings
        return s.missed_heartbeats * s.heartbeat_s

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.started_at = self.now()
        self.hearing = Hearing(since=self.started_at, epoch=self._link_epoch())
        self.bus.on_link(lambda _up: self._hear(self.now()))
        for subject in (self.names.agent_register, self.names.agent_heartbeat):
            self._subs.append(await self.bus.subscribe(subject, AGENT_REPORTS, self._on_report, queue=QUEUE_GROUP))
        self._subs.append(
            await self.bus.subscribe(
                self.names.telemetry_all,
                TELEMETRY,
                self.health.on_message,
                queue=QUEUE_GROUP,
            )
        )
        admin = await self.bus.subscribe(self.names.node_admin, NODE_ADMIN, self._on_admin, queue=QUEUE_GROUP)
        self._subs.append(admin)
        # The server has the subscriptions before start() returns (publishers on other connections can
        # still miss them for a few ms; agents' periodic reports make up for that).
        await self.bus.nc.flush()
        self.spawn(self._timer(), "heartbeat-timer")
        self.spawn(self._flusher(self._reg, self._take_regs, "registrations", self.registrations), "register-flusher")
        self.spawn(self._flusher(self._beat, self._take_beats, "heartbeats", self.heartbeats), "heartbeat-flusher")
        self.spawn(self.health.run(self.stop_event, STORE_ERRORS), "telemetry-batches")

    async def on_stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()

    async def _timer(self) -> None:
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=self.check_interval_s)
            if self.stop_event.is_set():
                break
            try:
                await self.check_once()
                self._ticks += 1
                if self._ticks % RANK_ROUND_TICKS == 0:
                    await self.ranks.round()
            except STORE_ERRORS as e:
                log.warning("heartbeat check skipped, Redis unavailable: %s", e)
            except Exception:
                log.exception("heartbeat check failed; trying again next period")

    async def extra_metrics(self) -> bytes:
        return self.health.metrics_text()

    def _lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    # -- agent reports -----------------------------------------------------------------------------------
    async def _on_report(self, report: AgentReport, msg: Msg) -> None:
        if isinstance(report, AgentReports):  # a fleet's: each as if it had come alone
            for i, one in enumerate(report.reports):
                await self._take_report(one, msg.subject, lambda e, one=one, i=i: (encode(one), f"reports[{i}]: {e}"))
        else:
            await self._take_report(report, msg.subject, lambda e: (msg.data, str(e)))

    async def _take_report(
        self, report: AgentRegister | Heartbeat, subject: str, letter: Callable[[ReportError], tuple[bytes, str]]
    ) -> None:
        """Queue a report for the flusher; a bad one is dead-lettered as `letter` says (the data and the error)."""
        try:
            if isinstance(report, AgentRegister):
                # each agent registers again every few beats: batched like heartbeats (see `registrations`)
                check_register(report)
                self._regs[report.node] = report
                self._reg.set()
            else:
                # 5,004 nodes beat once a second at 278 domains: batched, a beat costs no round trip of its own
                check_node_name(report.node)
                self._beats[report.node] = report
                self._beat.set()
        except ReportError as e:
            await self.bus.dead_letter(subject, *letter(e))

    async def register(self, reg: AgentRegister) -> NodeRecord:
        """Create or refresh the node's record from its registration; raises ReportError for a bad one."""
        check_register(reg)
        async with self._lock(reg.node):
            prev = await self.store.get_node(reg.node)
            if prev is None:
                prev = await self._last_verdict(reg.node)  # a node Redis lost: its drain and latched faults stay
            rec = record_from_register(reg, prev, self.now())
            if prev is None or prev.last_heartbeat == 0.0:
                await self._save(rec, changed=True)
                log.info("node %s registered: domain %s, %d GPUs", rec.name, rec.domain, rec.gpus)
                await self._announce(rec, "registered")
                return rec
            if _repeats(rec, prev):
                # the periodic re-registration of a node that changed nothing: liveness only, like a heartbeat
                await self.store.touch_nodes({rec.name: rec.last_heartbeat})
                return rec
            reasons, cause = [], ""
            if new_boot(reg, prev) and prev.rule_health:
                await self.health.forget(reg.node)
                reasons.append("agent restarted: GPU health rules cleared")
                cause = "cleared"
            if prev.state != rec.state:
                reasons.append(f"registered again after {prev.state}")
            if _topology_fields(prev) != _topology_fields(rec):
                reasons.append("registered with a new description")
            if prev.gpu_health != rec.gpu_health:
                reasons.append(_health_reason(rec))
            await self._save(rec, changed=bool(reasons))
            if reasons:
                await self._announce(rec, "; ".join(reasons), prev=prev, cause=cause)
            return rec

    async def _last_verdict(self, node: str) -> NodeRecord | None:
        """What the log last said of a node inventory has no record of (new, or lost with Redis): the record
        that verdict stands for, as far as a registration doesn't say it again (None: never announced)."""
        n = self.names
        try:
            msg = await self.bus.js.get_last_msg(n.stream_for(n.node_event(node)), n.node_event(node))
        except nats.js.errors.NotFoundError:
            return None
        ev = EVENTS.decode(msg.data)
        if not isinstance(ev, NodeChanged):
            return None
        return verdict_record(ev)

    async def registrations(self, regs: list[AgentRegister]) -> None:
        """A batch of registrations (one per node): one read for all; those that only repeat what the record
        says count as a heartbeat (one write for all), the others go through `register`, `REGISTER_CONCURRENCY`
        at a time (a fleet's first registrations: 5,004 at 278 domains, each with its round trips)."""
        now = self.now()
        prevs = await self.store.get_nodes([reg.node for reg in regs])
        seen: dict[str, float] = {}
        news: list[AgentRegister] = []
        for reg, prev in zip(regs, prevs, strict=True):
            if prev is not None and _repeats(record_from_register(reg, prev, now), prev):
                seen[reg.node] = now
            else:
                news.append(reg)
        await self.store.touch_nodes(seen)
        await in_groups([self.register(r) for r in news], REGISTER_CONCURRENCY)
        for reg in regs:
            self.ranks.observe(reg.node, reg.ranks, now)
            self._heard[reg.node] = now

    def _take_regs(self) -> list[AgentRegister]:
        regs, self._regs = self._regs, {}
        return list(regs.values())

    def _take_beats(self) -> list[Heartbeat]:
        beats, self._beats = self._beats, {}
        return list(beats.values())

    async def _flusher(
        self,
        wake: asyncio.Event,
        take: Callable[[], list[Any]],
        what: str,
        handle: Callable[[list[Any]], Awaitable[object]],
    ) -> None:
        """Handle the reports `take` gives, a batch at a time. Registrations and heartbeats have a flusher each:
        heartbeats never wait behind a long batch of new nodes (their nodes would look silent)."""
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.check_interval_s)
                await asyncio.sleep(BATCH_WINDOW_S)  # let a batch gather
            wake.clear()
            await self._flush(what, handle, take())

    async def _flush(self, what: str, handle: Callable[[list[Any]], Awaitable[object]], batch: list[Any]) -> None:
        """Handle one batch of periodic reports; a failure loses only them (the agents' next ones are the retry)."""
        if not batch:
            return
        try:
            await handle(batch)
            self._store_back()
        except STORE_ERRORS as e:
            # heartbeats lost: until Redis is back nodes' silence isn't theirs (a fresh grace after)
            self._store_down = True
            log.warning("%d %s dropped, Redis unavailable: %s", len(batch), what, e)
        except Exception:
            log.exception("%d %s failed; the agents' next ones are the retry", len(batch), what)

    async def heartbeat(self, hb: Heartbeat) -> NodeRecord | None:
        """Refresh a registered node; None (and nothing written) for a node that never registered."""
        check_node_name(hb.node)
        return (await self.heartbeats([hb]))[hb.node]

    async def heartbeats(self, beats: list[Heartbeat]) -> dict[str, NodeRecord | None]:
        """Handle a batch of heartbeats (one per node): one read for all and one liveness write for all;
        only a node whose state or GPU health changes gets its record rewritten and an event."""
        now = self.now()
        prevs = await self.store.get_nodes([hb.node for hb in beats])
        out: dict[str, NodeRecord | None] = {}
        changed: list[Heartbeat] = []
        for hb, prev in zip(beats, prevs, strict=True):
            if prev is None:
                self.unknown_heartbeats += 1
                log.debug("heartbeat from unregistered node %s: waiting for its registration", hb.node)
                out[hb.node] = None
                continue
            out[hb.node] = msgspec.structs.replace(prev, last_heartbeat=now)
            self.ranks.observe(hb.node, hb.ranks, now)
            self._heard[hb.node] = now
            if prev.state == "down" or (hb.gpus and _agent_health(hb, prev) != prev.agent_health):
                changed.append(hb)
        await self.store.touch_nodes({node: now for node, rec in out.items() if rec is not None})
        for hb in changed:
            out[hb.node] = await self._heartbeat_change(hb, now)
        return out

    async def _heartbeat_change(self, hb: Heartbeat, now: float) -> NodeRecord | None:
        async with self._lock(hb.node):
            prev = await self.store.get_node(hb.node)  # re-read under the lock: another writer may have been first
            if prev is None:
                return None
            rec = msgspec.structs.replace(prev, last_heartbeat=now)
            reasons = []
            if hb.gpus:
                rec.agent_health = _agent_health(hb, rec)
                rec.gpu_health = merge_health(rec.agent_health, prev.rule_health)
                if rec.gpu_health != prev.gpu_health:
                    reasons.append(_health_reason(rec))
            if prev.state == "down":
                rec.state = "draining" if prev.drained else "up"
                rec.reason = prev.reason if prev.drained else ""
                reasons.insert(0, "heartbeat resumed")
            await self._save(rec, changed=bool(reasons))
            if reasons:
                await self._announce(rec, "; ".join(reasons), prev=prev)
            return rec

    # -- missed heartbeats -------------------------------------------------------------------------------
    async def check_once(self, now: float | None = None) -> list[NodeChanged]:
        """Mark down every node silent for longer than `missed_heartbeats * heartbeat_s`; the events sent.

        Silence counts only while inventory could hear (`shared.liveness`): from the later of the node's last
        heartbeat and the end of inventory's last break — its start (a restarted inventory doesn't mark the
        fleet down before it could hear from anyone), its last NATS reconnect, the end of a Redis outage that
        lost heartbeats. While its connection is down, or the server doesn't answer a round trip, nobody is
        judged.
        """
        now = self.now() if now is None else now
        changes: list[NodeChanged] = []
        self._hear(now)
        if not may_judge(self.hearing, now, self.down_after_s):
            return changes
        # the liveness zset names the silent nodes: a quiet fleet costs one command, not a read of every record
        silent = await self.store.silent_nodes(now - self.down_after_s)
        if self._store_back():  # Redis answers again after losing heartbeats: a fresh grace from here
            self._hear(now)
            return changes
        states = await self.store.node_states(silent)
        doomed = [name for name, state in zip(silent, states, strict=True) if state is not None and state != "down"]
        if doomed and not await self.bus.answers():
            # a connection can look up and be dead: judge nobody until the server answers again
            self.hearing = lost(self.hearing)
            log.warning("NATS doesn't answer: no node is judged until it does (then a fresh grace)")
            return changes
        for name in doomed:
            async with self._lock(name):
                rec = await self.store.get_node(name)  # a heartbeat may have landed meanwhile
                if rec is None or rec.state == "down" or not self._silent(rec, now):
                    continue
                silent_s = silent_for(self.hearing, self._last_heard(rec), now)
                rec.state = "down"
                rec.reason = f"no heartbeat for {silent_s:.1f}s (limit {self.down_after_s:g}s)"
                self.ranks.forget(name)  # its jobs are the node-down rule's now
                await self._save(rec, changed=True)
                log.warning("node %s down: %s", rec.name, rec.reason)
                # replicas that both notice the same silence send one event (same msg id)
                changes.append(await self._announce(rec, rec.reason, msg_id=f"{rec.name}:down:{rec.last_heartbeat}"))
        return changes

    def _silent(self, rec: NodeRecord, now: float) -> bool:
        return overdue(self.hearing, self._last_heard(rec), now, self.down_after_s)

    def _last_heard(self, rec: NodeRecord) -> float:
        """The node's last report as Redis has it, or as this replica heard it if that is later: a Redis that
        went back in time (a stale replica promoted) holds old heartbeats, and silence is the node's alone."""
        return max(rec.last_heartbeat, self._heard.get(rec.name, 0.0))

    def _link_epoch(self) -> int:
        return self.bus.reconnects + self._store_breaks

    def _hear(self, now: float) -> None:
        """Look at the links heartbeats come through (NATS, and Redis where they are recorded)."""
        before = self.hearing
        up = self.bus.connected and not self._store_down
        self.hearing = observe(before, connected=up, epoch=self._link_epoch(), now=now)
        if self.hearing.deaf and not before.deaf:
            log.warning("inventory can't hear the nodes: no node is judged until it can again")
        elif self.hearing is not before and not self.hearing.deaf:  # a break ended
            log.warning("inventory hears again: every node has %gs from now before silence counts", self.down_after_s)

    def _store_back(self) -> bool:
        """Redis answered: if recording heartbeats had failed, that outage is over (True)."""
        if not self._store_down:
            return False
        self._store_down = False
        self._store_breaks += 1
        return True

    # -- drain / undrain ---------------------------------------------------------------------------------
    async def _on_admin(self, req: NodeAdmin, msg: Msg) -> None:
        try:
            reply = await self.admin(req)
        except STORE_ERRORS as e:
            log.warning("admin request %s failed, Redis unavailable: %s", req, e)
            reply = AdminReply(ok=False, error=f"inventory can't reach its store: {e}")
        except Exception as e:
            log.exception("admin request %s failed", req)
            reply = AdminReply(ok=False, error=f"inventory failed: {e}")
        if msg.reply:
            await msg.respond(encode(reply))

    async def admin(self, req: NodeAdmin) -> AdminReply:
        unknown = AdminReply(ok=False, error=f"unknown node {req.node}")
        if await self.store.get_node(req.node) is None:
            return unknown  # before taking a lock: names from the API must not grow the lock table
        if req.action == "clear_health":
            return await self.health.clear(req.node, f"GPU health cleared: {req.reason or 'by an operator'}")
        async with self._lock(req.node):
            prev = await self.store.get_node(req.node)
            if prev is None:
                return unknown
            rec = msgspec.structs.replace(prev)
            if req.action == "drain":
                rec.drained = True
                rec.reason = req.reason or "drained by an operator"
                if rec.state == "up":
                    rec.state = "draining"
            else:
                rec.drained = False
                rec.reason = "" if rec.state != "down" else rec.reason
                if rec.state == "draining":
                    rec.state = "up"
            changed = (rec.state, rec.drained, rec.reason) != (prev.state, prev.drained, prev.reason)
            if changed:
                await self._save(rec, changed=True)
                log.info("node %s %sed: now %s", rec.name, req.action, rec.state)
                await self._announce(rec, f"{req.action}: {req.reason}" if req.reason else req.action)
            return AdminReply(ok=True, state=rec.state)

    # -- writes and events -------------------------------------------------------------------------------
    async def _save(self, rec: NodeRecord, *, changed: bool) -> None:
        # liveness-only writes keep topo:gen, so readers' topology caches stay valid
        await self.store.put_node(rec, topology_changed=changed)

    async def _announce(
        self,
        rec: NodeRecord,
        reason: str,
        *,
        msg_id: str | None = None,
        prev: NodeRecord | None = None,
        changed_gpus: dict[str, str] | None = None,
        cause: str = "",
    ) -> NodeChanged:
        if changed_gpus is None and prev is not None:  # the agent's own report changed GPU health
            changed_gpus = _gpu_diff(prev.gpu_health, rec.gpu_health)
            cause = cause or ("agent" if changed_gpus else "")
        event = NodeChanged(
            node=rec.name,
            state=rec.state,
            reason=reason,
            at=self.now(),
            gpu_health=rec.gpu_health,
            changed_gpus=changed_gpus or {},
            cause=cause,
            drained=rec.drained,
            rule_health=rec.rule_health,
            boot_id=rec.boot_id,
        )
        msg_id = msg_id or f"{rec.name}:{rec.state}:{event.at}:{reason}"
        for attempt in range(1, _PUBLISH_ATTEMPTS + 1):
            try:
                await self.bus.publish(self.names.node_event(rec.name), event, msg_id=msg_id)
                break
            except Exception:
                if attempt == _PUBLISH_ATTEMPTS:
                    log.exception("could not publish %s; the record in Redis is current", event)
                else:
                    await asyncio.sleep(0.2 * attempt)
        return event


def _agent_health(hb: Heartbeat, rec: NodeRecord) -> dict[str, str]:
    return gpu_health_map(hb.gpus, rec.gpus)


def _health_reason(rec: NodeRecord) -> str:
    if not rec.gpu_health:
        return "all GPUs ok"
    return "GPU health " + ", ".join(f"{idx}={state}" for idx, state in sorted(rec.gpu_health.items(), key=_idx))


def _idx(item: tuple[str, str]) -> int:
    return int(item[0])


def _gpu_diff(before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    keys = sorted(set(before) | set(after), key=int)
    return {k: after.get(k, "ok") for k in keys if after.get(k, "ok") != before.get(k, "ok")}
