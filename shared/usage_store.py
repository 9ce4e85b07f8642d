"""The usage view in Redis: the queue leader's writes (one script a batch) and everyone's reads.

The keys (shared/names.py, `usage*`) hold the fold of the job log (shared/usage_log.py) up to the EVENTS sequence
`usage` records: the runs open now, each job's last closed attempt, and per UTC day the GPU-seconds per tenant
and hour and the jobs that held GPUs. `apply` writes a batch with its new position only if the stored position is
the one the batch was folded from, in one script: the view is always a whole prefix of the log folded, a second
leader (a lease that changed hands) can't add a stretch twice, and Redis that came back empty or behind (a
replica promoted) shows the leader a position other than its own, from which it folds again.

Retry safety (see shared/store.py): `apply` run twice finds its own new position stored and answers written
without writing again; the reads are reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from shared.names import Names
from shared.redis_client import RedisClient
from shared.schemas import USAGE_RUN, UsageRun, encode
from shared.usage_log import UsageBatch

READY, REBUILDING = "ready", "rebuilding"

# KEYS: usage, usage:open, usage:floors, usage:days, then per day of the batch its usage:day and usage:jobs key
# ARGV: position folded from, new position, state, at; n, n x (job, run); n, n x job (open runs gone);
# n, n x (job, floor); then per day: day, n, n x (hour field, GPU-seconds), n, n x job member.
# Returns 1 written (or written already: a retried call), 0 the stored position is another (nothing written).
APPLY_LUA = """
local seq = tonumber(redis.call('HGET', KEYS[1], 'events_seq') or '0')
local from, to = tonumber(ARGV[1]), tonumber(ARGV[2])
if seq ~= from then
  if seq == to and to ~= from then return 1 end
  return 0
end
local i = 5
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]); i = i + 2 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HDEL', KEYS[2], ARGV[i]); i = i + 1 end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]); i = i + 2 end
local k = 5
while i <= #ARGV do
  local day = ARGV[i]; i = i + 1
  redis.call('ZADD', KEYS[4], day, day)
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do redis.call('HINCRBYFLOAT', KEYS[k], ARGV[i], ARGV[i + 1]); i = i + 2 end
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do redis.call('SADD', KEYS[k + 1], ARGV[i]); i = i + 1 end
  k = k + 2
end
redis.call('HSET', KEYS[1], 'events_seq', ARGV[2], 'state', ARGV[3], 'at', ARGV[4])
return 1
"""


@dataclass(frozen=True, slots=True)
class UsageStatus:
    events_seq: int  # the log position folded up to
    state: str  # ready: caught up with the log when it was written; rebuilding: folding it again from behind
    at: float  # when the leader last wrote


@dataclass(frozen=True, slots=True)
class UsageSnapshot:
    """What a reader needs for `usage_log.usage_rows`, read in one transaction (a consistent prefix of the log)."""

    status: UsageStatus | None
    hours: dict[int, dict[str, float]]
    day_jobs: dict[int, set[str]]
    open_runs: dict[str, UsageRun]


class UsageStore:
    def __init__(self, client: RedisClient, names: Names) -> None:
        self.r = client
        self.names = names
        self._apply = client.register_script(APPLY_LUA)

    async def status(self) -> UsageStatus | None:
        """None: no view (Redis came back empty, or no leader ever wrote one)."""
        return _status(await self.r.hgetall(self.names.usage_key))

    async def open_runs(self) -> dict[str, UsageRun]:
        raw = await self.r.hgetall(self.names.usage_open_key)
        return {_text(job): USAGE_RUN.decode(run) for job, run in raw.items()}

    async def floors(self, jobs: Iterable[str]) -> dict[str, int]:
        ids = sorted(set(jobs))
        if not ids:
            return {}
        vals = await self.r.hmget(self.names.usage_floors_key, ids)
        return {job: int(v) for job, v in zip(ids, vals, strict=True) if v is not None}

    async def days(self, start: float, end: float) -> list[int]:
        """The days with usage in [start, end) (day starts)."""
        raw = await self.r.zrangebyscore(self.names.usage_days_key, start, f"({end}")
        return [int(d) for d in raw]

    async def hours(self, days: Iterable[int]) -> dict[int, dict[str, float]]:
        """Per day, hour field → GPU-seconds."""
        ds = list(days)
        async with self.r.pipeline(transaction=False) as p:
            for day in ds:
                p.hgetall(self.names.usage_day_key(day))
            got = await p.execute()
        return {day: {_text(f): float(v) for f, v in fields.items()} for day, fields in zip(ds, got, strict=True)}

    async def snapshot(self, start: float, end: float) -> UsageSnapshot:
        """Every day in [start, end) with its jobs, the open runs and the position, as of one moment."""
        days = await self.days(start, end)
        n = self.names
        async with self.r.pipeline(transaction=True) as p:
            p.hgetall(n.usage_key)
            p.hgetall(n.usage_open_key)
            for day in days:
                p.hgetall(n.usage_day_key(day))
                p.smembers(n.usage_jobs_key(day))
            got = await p.execute()
        hours: dict[int, dict[str, float]] = {}
        jobs: dict[int, set[str]] = {}
        for i, day in enumerate(days):
            hours[day] = {_text(f): float(v) for f, v in got[2 + 2 * i].items()}
            jobs[day] = {_text(m) for m in got[3 + 2 * i]}
        runs = {_text(job): USAGE_RUN.decode(run) for job, run in got[1].items()}
        return UsageSnapshot(_status(got[0]), hours, jobs, runs)

    async def apply(self, batch: UsageBatch, from_seq: int, to_seq: int, state: str, at: float) -> bool:
        """Write `batch` and the new position `to_seq` if the stored position is `from_seq` (see the module doc)."""
        n = self.names
        keys = [n.usage_key, n.usage_open_key, n.usage_floors_key, n.usage_days_key]
        args: list[str | bytes | float | int] = [from_seq, to_seq, state, at, len(batch.open)]
        for job, run in sorted(batch.open.items()):
            args += [job, encode(run)]
        args.append(len(batch.gone))
        args += sorted(batch.gone)
        args.append(len(batch.floors))
        for job, floor in sorted(batch.floors.items()):
            args += [job, floor]
        for day in sorted(set(batch.gpu_s) | set(batch.jobs)):
            keys += [n.usage_day_key(day), n.usage_jobs_key(day)]
            fields = batch.gpu_s.get(day, {})
            members = sorted(batch.jobs.get(day, ()))
            args += [day, len(fields)]
            for name, amount in sorted(fields.items()):
                args += [name, repr(amount)]
            args.append(len(members))
            args += members
        return bool(await self._apply(keys=keys, args=args))


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _status(raw: dict[bytes, bytes] | dict[str, str]) -> UsageStatus | None:
    if not raw:
        return None
    fields = {_text(k): _text(v) for k, v in raw.items()}
    return UsageStatus(int(fields.get("events_seq", 0)), fields.get("state", REBUILDING), float(fields.get("at", 0)))
