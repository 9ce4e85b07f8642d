"""placement: turns the queue's orders into atomic commits in Redis and commands to the agents.

A PlaceOrder is committed by the Lua script in `shared.store` (every GPU still free, every node up,
the job holding nothing else), so any number of placement replicas can run side by side: two of them
can never hand out one GPU twice. Only after the commit do the agents get their StartRank commands.
A ReleaseOrder frees the job's GPUs at once and tells its agents to stop the ranks (none when every rank has
exited already: `ReleaseOrder.stop_ranks`).
Orders are redelivered until acked, and both paths are idempotent. A fetched batch of orders is handled one lane
per job (each job's orders in stream order, different jobs' at once): under a burst the commits' and publishes'
round trips overlap instead of queueing one behind the other. Jobs' orders never depend on each other in a batch: the
queue orders GPUs another job gave back only once placement has told it they are released.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shared import lifecycle
from shared.bus import Outgoing
from shared.runtime import Deps, Service
from shared.schemas import (
    ORDERS,
    AllocationRecord,
    CheckpointOrder,
    Committed,
    Order,
    PlaceOrder,
    Rejected,
    Released,
    ReleaseOrder,
    StartRank,
    StopRank,
)

log = logging.getLogger("rackscale.placement")


def _job(order: Order) -> str:
    return order.job_id


class PlacementService(Service):
    name = "placement"

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self.commits = 0
        self.rejections = 0

    async def start(self) -> None:
        self.spawn(
            self.bus.consume(
                self.names.orders,
                self.names.consumer(self.name, "orders"),
                ORDERS,
                self.handle,
                self.stop_event,
                key=_job,
            ),
            "orders",
        )

    async def handle(self, order: Order, headers: Mapping[str, str]) -> None:
        if isinstance(order, PlaceOrder):
            await self.place(order, headers)
        elif isinstance(order, CheckpointOrder):
            await self.checkpoint(order, headers)
        else:
            await self.release(order, headers)

    async def place(self, order: PlaceOrder, headers: Mapping[str, str]) -> None:
        attrs = {
            "rackscale.job_id": order.job_id,
            "rackscale.attempt": order.attempt,
            "rackscale.nodes": len(order.nodes),
        }
        with self.tracer.span("placement.commit", headers, attrs) as span:
            await self._place(order, self.tracer.headers(), span)

    async def _place(self, order: PlaceOrder, headers: Mapping[str, str], span: Any) -> None:
        rec = AllocationRecord(job_id=order.job_id, attempt=order.attempt, nodes=order.nodes, committed_at=self.now())
        result = await self.store.commit(rec)
        key = f"{order.job_id}:{order.attempt}"
        span.set_attribute("rackscale.commit", "ok" if result.ok else result.reason)
        if not result.ok:
            self.rejections += 1
            log.info("order %s rejected: %s", key, result.reason)
            await self.bus.publish(
                self.names.placement_events,
                Rejected(job_id=order.job_id, attempt=order.attempt, reason=result.reason, at=self.now()),
                msg_id=f"{key}:rejected",
                headers=headers,
            )
            return
        if not result.duplicate:
            self.commits += 1
            nodes = order.nodes
        else:  # a redelivered order re-sends the same messages: agents and the queue dedupe by msg id
            held = await self.store.allocation(order.job_id)
            nodes = held.nodes if held is not None else order.nodes
        # The commit is stored before any agent hears of the attempt: a rank's start then always follows it in
        # the queue's inbox (at the cost of one more wait on the way to the start).
        committed = Committed(
            job_id=order.job_id, attempt=order.attempt, nodes=nodes, at=self.now(), segment=order.segment
        )
        await self.bus.publish(self.names.placement_events, committed, msg_id=f"{key}:committed", headers=headers)
        out = []
        for rank, ng in enumerate(nodes):
            cmd = StartRank(
                job_id=order.job_id,
                attempt=order.attempt,
                node=ng.node,
                gpus=ng.gpus,
                rank=rank,
                world_size=len(nodes),
                master_addr=order.master_addr,
                command=order.command,
                duration_s=order.duration_s,
                restore=order.restore,
                launch=order.launch,
                nodes=nodes,
                domains=order.domains,
                segments=order.segments,
                master_port=order.master_port,
            )
            out.append(Outgoing(self.names.agent_cmd(ng.node), cmd, f"{key}:start:{rank}", headers))
        await self.bus.publish_all(out)

    async def checkpoint(self, order: CheckpointOrder, headers: Mapping[str, str]) -> None:
        """A move's first step: the ranks checkpoint and stop; the GPUs stay held until the queue releases them
        (after every rank acknowledged), so nothing else lands on them while the checkpoint is written."""
        held = await self.store.allocation(order.job_id)
        if held is None:
            await self.store.require_view()  # a view being rebuilt may not know the allocation yet
        if held is None or held.attempt != order.attempt:
            log.info("checkpoint of %s:%d: the job holds no such allocation", order.job_id, order.attempt)
            return
        key = f"{order.job_id}:{order.attempt}"
        for ng in held.nodes:
            stop = StopRank(
                job_id=order.job_id,
                node=ng.node,
                reason=order.reason,
                checkpoint=True,
                attempt=order.attempt,
                ack=True,
                cause=lifecycle.MOVED,
            )
            await self.bus.publish(
                self.names.agent_cmd(ng.node), stop, msg_id=f"{key}:checkpoint:{ng.node}", headers=headers
            )

    async def release(self, order: ReleaseOrder, headers: Mapping[str, str]) -> None:
        with self.tracer.span("placement.release", headers, {"rackscale.job_id": order.job_id}):
            await self._release(order, self.tracer.headers())

    async def _release(self, order: ReleaseOrder, headers: Mapping[str, str]) -> None:
        held = await self.store.allocation(order.job_id)
        if order.only_attempt and held is not None and held.attempt != order.only_attempt:
            job, attempt = order.job_id, order.only_attempt
            log.info("release of %s:%d: the job holds attempt %d now; kept", job, attempt, held.attempt)
            return
        await self.store.release(order.job_id, held)
        out: list[Outgoing] = []
        if held is not None and order.stop_ranks:
            key = f"{order.job_id}:{held.attempt}"
            for ng in held.nodes:
                stop = StopRank(
                    job_id=order.job_id,
                    node=ng.node,
                    reason=order.reason,
                    checkpoint=order.checkpoint,
                    attempt=held.attempt,
                    cause=order.cause,
                )
                out.append(Outgoing(self.names.agent_cmd(ng.node), stop, f"{key}:stop:{ng.node}", headers))
        attempt = held.attempt if held else 0
        released = Released(job_id=order.job_id, reason=order.reason, at=self.now(), attempt=attempt)
        msg_id = f"{order.job_id}:{attempt or 'none'}:released"
        out.append(Outgoing(self.names.placement_events, released, msg_id, headers))
        await self.bus.publish_all(out)
