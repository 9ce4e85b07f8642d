#!/usr/bin/env python3
"""What the periodic full reads cost at N active jobs: the queue's timer (each second) and the migration
service (every 5 s) read every job record and every allocation.

    python bench/full_read_bench.py [--jobs 3000] [--repeats 7]

Against an embedded Valkey (or the one named by RACKSCALE_REDIS_URL), N running 1-GPU jobs, each with its job
record and its allocation as the queue and placement store them. Median over `--repeats` of:

- `cache_read_active_ms`: the full read of the job records the queue does (`JobCache.read_active`), no record
  changed since the last (only changed records are decoded);
- `active_jobs_ms`: every job record read and decoded;
- `allocations_ms`: every allocation record (one script call).

One JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable without an install
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec

from shared.embedded import EmbeddedValkey
from shared.job_cache import JobCache
from shared.names import Names
from shared.schemas import AllocationRecord, JobBody, JobRecord, JobState, NodeGpus, NodeRecord
from shared.store import Store, ViewMark


async def _fill(store: Store, jobs: int) -> None:
    nodes = [f"d{d:02d}-n{k:02d}" for d in range(max(1, -(-jobs // 72))) for k in range(18)]
    for name in nodes:
        await store.put_node(NodeRecord(name=name, domain=name[:3]))
    for i in range(jobs):
        ng = [NodeGpus(nodes[i // 4], [i % 4])]
        body = JobBody(name=f"j{i}", tenant="t", gpus=1, duration_s=86_400.0, command=["python", "train.py"])
        rec = JobRecord(id=f"j{i}", spec=body, trace="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
        await store.create_job(rec)
        await store.update_job(
            rec.id, lambda r, ng=ng: msgspec.structs.replace(r, state=JobState.RUNNING, allocation=ng, attempt=1)
        )
        if not (await store.commit(AllocationRecord(job_id=rec.id, attempt=1, nodes=ng, committed_at=0.0))).ok:
            raise SystemExit(f"commit of {rec.id} failed")


async def _median_ms(fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return round(statistics.median(times), 1)


async def measure(url: str, jobs: int, repeats: int) -> dict[str, Any]:
    names = Names(prefix=f"fullread{uuid.uuid4().hex[:6]}")
    store = Store.from_url(url, names)
    await store.open_view(ViewMark(), time.time())
    try:
        await _fill(store, jobs)
        cache = JobCache(store)
        await cache.read_active()  # the queue's first full read decodes everything once
        return {
            "jobs": jobs,
            "repeats": repeats,
            "cache_read_active_ms": await _median_ms(cache.read_active, repeats),
            "active_jobs_ms": await _median_ms(store.active_jobs, repeats),
            "allocations_ms": await _median_ms(store.allocations, repeats),
        }
    finally:
        keys = [k async for k in store.r.scan_iter(names.key_pattern)]
        for i in range(0, len(keys), 1000):
            await store.r.delete(*keys[i : i + 1000])
        await store.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--jobs", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        url = os.environ.get("RACKSCALE_REDIS_URL") or stack.enter_context(EmbeddedValkey()).url
        print(json.dumps(asyncio.run(measure(url, args.jobs, args.repeats)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
