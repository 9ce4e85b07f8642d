"""The mixed burst every fault test runs under, and the client that drives it (issue 21, acceptance).

`mixed_burst` builds the jobs: single-node and multi-node shapes, some checkpointable, both
`on_node_failure` values, a few real commands, most short and some long enough that a fault finds them
running. `Burst` submits them at a steady pace through a `Recorder` (retrying, with an Idempotency-Key,
as a client would while a fault lasts) and meanwhile reads accepted jobs back, so the history holds reads
from before, during and after the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from types import TracebackType
from typing import Any, Self

from tests.faults.workflows import Workflows
from tests.history import Recorder, Refused

OK_CMD = ["python3", "-c", "import sys; sys.exit(0)"]
TENANTS = ("alpha", "beta", "gamma")


def mixed_burst(n: int = 100, seed: int = 0) -> list[dict[str, Any]]:
    """`n` jobs for a fleet of 2+ NVLink domains of 18 four-GPU nodes.

    Half single-node (1, 2 or 4 GPUs), the rest multi-node: 8-32 GPUs inside one NVLink domain (the
    default `required`), or 8 GPUs anywhere (`nvlink: none`). Every fourth job is checkpointable, every third
    asks `on_node_failure: fail` (so both values meet every shape), every tenth runs a real command; one in
    eight runs 3-6 s (a fault finds it running), the rest 0.1-1 s."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body: dict[str, Any] = {"name": f"burst-{i}", "tenant": TENANTS[i % len(TENANTS)]}
        shape = rng.random()
        if shape < 0.5:
            body["gpus"] = rng.choice((1, 2, 4))
        elif shape < 0.85:
            body["gpus"] = rng.choice((8, 12, 16, 32))
        else:
            body["gpus"] = 8
            body["topology"] = {"nvlink": "none"}
        long = rng.random() < 0.125
        body["duration_s"] = round(rng.uniform(3.0, 6.0) if long else rng.uniform(0.1, 1.0), 3)
        body["checkpointable"] = i % 4 == 1
        body["on_node_failure"] = "fail" if i % 3 == 2 else "requeue"
        if i % 10 == 7:
            body["command"] = OK_CMD
        out.append(body)
    return out


class Burst:
    """Submit `bodies` at `rate_per_s` (at most `concurrency` at once) while `readers` read accepted jobs back.

    `async with Burst(rec, bodies) as burst:` starts it; leaving the block waits until every body was accepted
    (each retried for up to `deadline_s`; one answered 4xx is given up and kept in `refused`), and the
    `workflows` too when given, and stops the readers. Inside, `await burst.wait_accepted(n)`
    paces a fault against the load."""

    def __init__(
        self,
        rec: Recorder,
        bodies: list[dict[str, Any]],
        *,
        rate_per_s: float = 20.0,
        concurrency: int = 8,
        readers: int = 2,
        read_every_s: float = 0.1,
        deadline_s: float = 120.0,
        workflows: Workflows | None = None,
    ) -> None:
        self.rec = rec
        self.workflows = workflows  # arrays and dependencies submitted beside the bodies (tests/faults/workflows.py)
        self.bodies = bodies
        self.rate_per_s = rate_per_s
        self.concurrency = concurrency
        self.readers = readers
        self.read_every_s = read_every_s
        self.deadline_s = deadline_s
        self.spec: dict[str, dict[str, Any]] = {}  # accepted job id → its body
        self.refused: list[str] = []  # submits answered 4xx (each body is valid: a wrong answer)
        self._accepted = asyncio.Condition()
        self._submitter: asyncio.Task[None] | None = None
        self._readers: list[asyncio.Task[None]] = []
        self._rng = random.Random(len(bodies))

    @property
    def accepted(self) -> list[str]:
        return list(self.spec)

    async def __aenter__(self) -> Self:
        self._submitter = asyncio.create_task(self._submit_all(), name="burst:submit")
        self._readers = [asyncio.create_task(self._read(), name=f"burst:read{i}") for i in range(self.readers)]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._submitter is not None
        try:
            if exc is None:
                await self._submitter
            else:
                self._submitter.cancel()
                with contextlib.suppress(BaseException):
                    await self._submitter
        finally:
            for t in self._readers:
                t.cancel()
            for t in self._readers:
                with contextlib.suppress(BaseException):
                    await t

    async def wait_accepted(self, n: int, timeout: float = 60.0) -> None:
        async with self._accepted:
            await asyncio.wait_for(self._accepted.wait_for(lambda: len(self.spec) >= n), timeout)

    async def _submit_all(self) -> None:
        sem = asyncio.Semaphore(self.concurrency)
        t0 = time.monotonic()

        async def one(i: int, body: dict[str, Any]) -> None:
            await asyncio.sleep(max(0.0, t0 + i / self.rate_per_s - time.monotonic()))
            async with sem:
                try:
                    job_id = await self.rec.submit(body, deadline_s=self.deadline_s)
                except Refused as e:
                    self.refused.append(str(e))
                    return
            async with self._accepted:
                self.spec[job_id] = body
                self._accepted.notify_all()

        beside = [self._workflows()] if self.workflows is not None else []
        await asyncio.gather(*(one(i, b) for i, b in enumerate(self.bodies)), *beside)

    async def _workflows(self) -> None:
        assert self.workflows is not None
        try:
            await self.workflows.submit()
        except Refused as e:
            self.refused.append(str(e))

    async def _read(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(self.read_every_s)
            n += 1
            if n % 10 == 0:
                await self.rec.call("GET", "/v1/jobs?limit=50")
            elif self.spec:
                await self.rec.read(self._rng.choice(self.accepted))
