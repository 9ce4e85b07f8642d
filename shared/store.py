"""Rack state in Redis: the typed reads and writes each service makes, and the Lua commit.

Each key family has one writer (see `shared.names`). The commit script is the only way GPUs are
handed out: it checks, in one atomic step, that the job holds nothing yet (or holds exactly this
attempt: a redelivered order is a no-op), that the attempt is newer than any released one (a late
redelivery after the job ended must not run it again), that every chosen node is up and every chosen GPU is free,
and only then marks them. Two placement replicas can therefore never hand out one GPU twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline

from shared.bus import Retry
from shared.core.arrays import split_task_id
from shared.jobs import submit_order
from shared.names import Names
from shared.redis_client import RedisClient, redis_client
from shared.schemas import (
    ALLOCATION_RECORD,
    JOB_RECORD,
    MIGRATION_RECORD,
    NODE_HEALTH_STATE,
    NODE_RECORD,
    RESERVATIONS,
    TERMINAL,
    AllocationRecord,
    JobRecord,
    JobState,
    MigrationRecord,
    NodeGpus,
    NodeHealthState,
    NodeRecord,
    Reservations,
    encode,
)

# Retry safety. The client retries a command that failed on a broken connection or a timeout (a restart,
# CLIENT KILL, a failover: shared/redis_client.py), and after such an error the command may or may not have
# run. So every command sent here must come out the same when it runs twice:
# - reads (GET, MGET, HGET, HGETALL, SMEMBERS, ZRANGE*, ZMSCORE, read pipelines, ALLOC_RECORDS_LUA): no effect.
# - writes of a value (SET, MSET, DEL, SADD, SREM, HSET, ZADD NX/GT) and MULTI/EXEC pipelines of them (put_node,
#   put_job, put_migration, put_reservations, touch_nodes; index_array's SADD): the same value again. Only a write
#   another writer made in between could be undone; a key family has one writer (inventory's replicas: the last
#   write wins and the next heartbeat heals it, as without a retry), and the retry follows within a second.
# - INCR topo:gen (put_node): a second bump only makes topology caches read once more.
# - COMMIT_LUA: run again after it committed, it finds its own attempt held and answers 'dup', which placement
#   handles as a redelivered order (the same messages with the same msg ids). If it hadn't run, it decides anew.
# - RELEASE_LUA: run again after it released, the attempt is gone: 0, "held nothing", which callers take as done.
# - LEASE_LUA: run again, the holder finds the lease its own and renews it: the same answer (a caller counts its
#   trust in the lease from before the first try, as the queue does, so a later renewal only adds margin).
# - JOB_CAS_LUA (create_job, update_job): run again after it wrote, the stored record is the new one, not the
#   expected one; the script counts that as written, so the caller's side effects (events, releases) aren't
#   skipped as if another writer had won.
# - EVALSHA after a restart or failover: NOSCRIPT means it didn't run; redis-py loads the script and runs it.
# - WATCH/MULTI: redis-py never retries while watching; nothing here watches (the job CAS is one script).
# - On a cluster the client also retries CLUSTERDOWN and follows MOVED/ASK: answers that the command didn't run.
#   Every command, pipeline and script here touches keys of one cell, one slot (shared.names): one node runs
#   it whole, as one server does.

# The view's clock, counted up by every commit and job write: a writer that saw it further on than Redis has it
# finds Redis went back in time (a stale replica promoted, a copy restored) before it writes anything, and marks
# the view behind, so the queue catches it up from the log (services/queue/rebuild.py). Nil: don't write.
VIEW_CLOCK_LUA = """
local function view_clock(view, seen)
  if redis.call('HGET', view, 'state') ~= 'ready' then return nil end
  local clock = tonumber(redis.call('HGET', view, 'clock') or '0')
  if clock < tonumber(seen) then
    redis.call('HSET', view, 'state', 'behind')
    return nil
  end
  return clock
end
-- count the clock up; whole numbers as text (a Lua number would be written as 1.79e+15, losing digits)
local function tick(view, clock)
  local after = string.format('%.0f', clock + 1)
  redis.call('HSET', view, 'clock', after)
  return after
end
"""

# KEYS: alloc:{job}, allocs, gpus:{node_1..n}, nodestate:{node_1..n}, view
# ARGV: job_id, attempt, record, n, gpu lists ("0,1,2,3") for nodes 1..n, the view clock the caller saw last
COMMIT_LUA = (
    VIEW_CLOCK_LUA
    + """
local n = tonumber(ARGV[4])
local view = KEYS[3 + 2 * n]
local clock = view_clock(view, ARGV[5 + n])
if not clock then return {'not_ready'} end
local floor = redis.call('HGET', KEYS[1], 'floor')
if floor and tonumber(ARGV[2]) <= tonumber(floor) then
  return {'stale', 'attempt ' .. ARGV[2] .. ' of this job was already released'}
end
local held = redis.call('HGET', KEYS[1], 'attempt')
if held then
  if held == ARGV[2] then return {'dup', string.format('%.0f', clock)} end
  return {'conflict', 'job already holds GPUs for attempt ' .. held}
end
for i = 1, n do
  local st = redis.call('GET', KEYS[2 + n + i])
  if st ~= 'up' then return {'node_unavailable', KEYS[2 + n + i], st or 'unknown'} end
  for gpu in string.gmatch(ARGV[4 + i], '[^,]+') do
    local owner = redis.call('HGET', KEYS[2 + i], gpu)
    if owner then return {'gpu_taken', KEYS[2 + i], gpu, owner} end
  end
end
for i = 1, n do
  for gpu in string.gmatch(ARGV[4 + i], '[^,]+') do
    redis.call('HSET', KEYS[2 + i], gpu, ARGV[1])
  end
end
redis.call('HSET', KEYS[1], 'attempt', ARGV[2], 'record', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[1])
return {'ok', tick(view, clock)}
"""
)

# Compare-and-set of one job record with its index sets, one round trip (WATCH/GET/MULTI took three).
# KEYS: job:{id}, jobs:active, jobs:undecided, jobs, view; ARGV: the record the caller decided on ('' = none may
# exist yet), the new record, job id, in active (0/1), in undecided (0/1), submit score (only for a new job: ZADD
# NX), the view clock the caller saw last. Returns {1, clock} when written, {2} when the view may not be written
# (being rebuilt, or behind), else {0, the stored record or false}. A
# stored record that already is the new one counts as written: a retried call whose first try landed (the index
# writes below are idempotent).
JOB_CAS_LUA = (
    VIEW_CLOCK_LUA
    + """
local clock = view_clock(KEYS[5], ARGV[7])
if not clock then return {2} end
local cur = redis.call('GET', KEYS[1])
if (cur or '') ~= ARGV[1] and cur ~= ARGV[2] then return {0, cur} end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[4] == '1' then redis.call('SADD', KEYS[2], ARGV[3]) else redis.call('SREM', KEYS[2], ARGV[3]) end
if ARGV[5] == '1' then redis.call('SADD', KEYS[3], ARGV[3]) else redis.call('SREM', KEYS[3], ARGV[3]) end
if ARGV[6] ~= '' then redis.call('ZADD', KEYS[4], 'NX', ARGV[6], ARGV[3]) end
return {1, tick(KEYS[5], clock)}
"""
)

# KEYS: alloc:{job}, allocs, gpus:{node_1..n}; ARGV: job_id, n, gpu lists. Frees only GPUs the job owns.
# Take or renew a leader lease in one step (a GET then PEXPIRE could renew a lease another replica just took).
LEASE_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""

# KEYS: alloc:{job}, allocs, gpus:{node_1..n}, view
# ARGV: job_id, n, attempt, gpu lists ("0,1,2,3") for nodes 1..n. Returns 1 released, 0 held nothing, -1 the
# view is being rebuilt.
RELEASE_LUA = """
local n = tonumber(ARGV[2])
if redis.call('HGET', KEYS[3 + n], 'state') ~= 'ready' then return -1 end
local attempt = redis.call('HGET', KEYS[1], 'attempt')
-- the allocation read before this call, not one committed since (its GPUs may be on other nodes)
if attempt ~= ARGV[3] then return 0 end
for i = 1, n do
  for gpu in string.gmatch(ARGV[3 + i], '[^,]+') do
    if redis.call('HGET', KEYS[2 + i], gpu) == ARGV[1] then redis.call('HDEL', KEYS[2 + i], gpu) end
  end
end
-- keep a floor: an order for this or an older attempt, redelivered late, must never commit again
redis.call('HDEL', KEYS[1], 'attempt', 'record')
redis.call('HSET', KEYS[1], 'floor', attempt)
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

# every allocation record in one command (KEYS: the jobs' alloc keys); '' for a key released meanwhile. A pipeline
# of one HGET per job costs redis-py work per job, which the queue's timer paid for every allocation each period
# (docs/performance.md, full reads).
ALLOC_RECORDS_LUA = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('HGET', key, 'record') or '' end
return out
"""

# KEYS: view; ARGV: jobs_seq, events_seq, the view clock the caller saw last. A ready view's position moves
# forward only, and only on a view not behind the caller (a stale copy swapped in since the caller read the
# position's clock would otherwise claim writes it lacks).
RECORD_VIEW_LUA = (
    VIEW_CLOCK_LUA
    + """
if not view_clock(KEYS[1], ARGV[3]) then return 0 end
for i, field in ipairs({'jobs_seq', 'events_seq'}) do
  if tonumber(ARGV[i]) > tonumber(redis.call('HGET', KEYS[1], field) or '0') then
    redis.call('HSET', KEYS[1], field, ARGV[i])
  end
end
return 1
"""
)

RESTORE_BATCH = 500  # records per pipeline when the view is rebuilt


JobWatcher = Callable[[str, bytes | None, JobState | None], None]  # (job id, stored bytes, state): a record cache


class ViewNotReady(Retry):
    """The view is being rebuilt from the log (services/queue/rebuild.py) or Redis holds none (it came back
    empty): nothing may be written to it now, and the message that wanted to is redelivered once it is open."""


@dataclass(frozen=True, slots=True)
class ViewMark:
    """Up to which stream sequences the view is complete: everything at or below them is in Redis."""

    jobs_seq: int = 0  # JOBS (the submits)
    events_seq: int = 0  # EVENTS (the job events and the inbox)


@dataclass(frozen=True, slots=True)
class CommitResult:
    ok: bool
    duplicate: bool = False
    reason: str = ""


class Store:
    """Typed access to one cell's keys. Explicit dependency: built from a client and `Names`."""

    def __init__(self, client: RedisClient, names: Names) -> None:
        self.r = client
        self.names = names
        self._commit = client.register_script(COMMIT_LUA)
        self._release = client.register_script(RELEASE_LUA)
        self._lease = client.register_script(LEASE_LUA)
        self._job_cas = client.register_script(JOB_CAS_LUA)
        self._alloc_records = client.register_script(ALLOC_RECORDS_LUA)
        self._record_view = client.register_script(RECORD_VIEW_LUA)
        self._view_clock = 0  # the furthest the view's clock was seen at (VIEW_CLOCK_LUA)
        self._job_watchers: list[JobWatcher] = []

    @classmethod
    def from_url(cls, url: str, names: Names) -> Store:
        """A store on `url`: one server, a Sentinel set or a cluster (`shared.redis_client`), with reconnection and
        retry."""
        return cls(redis_client(url, decode_responses=False), names)

    async def close(self) -> None:
        await self.r.aclose()

    def watch_jobs(self, watcher: JobWatcher) -> None:
        """Tell `watcher` of every job record this store writes or finds stored on a failed compare-and-set
        (None: the job doesn't exist), as (id, bytes, state): a record cache (`shared.job_cache`) keeps them."""
        self._job_watchers.append(watcher)

    def _seen(self, job_id: str, data: bytes | None, state: JobState | None) -> None:
        for watcher in self._job_watchers:
            watcher(job_id, data, state)

    # -- inventory: nodes ------------------------------------------------------------------------------
    async def put_node(self, rec: NodeRecord, *, topology_changed: bool = True) -> None:
        """Write a node; heartbeats pass topology_changed=False so readers' topology caches stay valid."""
        n = self.names
        async with self.r.pipeline(transaction=True) as p:
            p.set(n.node_key(rec.name), encode(rec))
            p.set(n.node_state_key(rec.name), rec.state)
            p.sadd(n.nodes_key, rec.name)
            p.zadd(n.heartbeats_key, {rec.name: rec.last_heartbeat}, gt=True)
            if topology_changed:
                p.incr(n.topo_gen_key)
            await p.execute()

    async def touch_nodes(self, seen: Mapping[str, float]) -> None:
        """Record heartbeats (node → time) without rewriting the records: one command for a whole batch."""
        if seen:
            await self.r.zadd(self.names.heartbeats_key, dict(seen), gt=True)

    async def get_node(self, name: str) -> NodeRecord | None:
        return (await self.get_nodes([name]))[0]

    async def get_nodes(self, names: Sequence[str]) -> list[NodeRecord | None]:
        """Records in the order asked, None for unknown names; `last_heartbeat` from the liveness zset."""
        if not names:
            return []
        n = self.names
        async with self.r.pipeline(transaction=False) as p:
            # MGET by name: redis-py refuses `mget` in a cluster pipeline, as its keys could span slots; a cell's
            # keys share one (the hash tag), so the cluster sends it to that slot's node like any other command
            p.execute_command("MGET", *[n.node_key(x) for x in names])
            p.zmscore(n.heartbeats_key, list(names))
            raws, seen = await p.execute()
        out: list[NodeRecord | None] = []
        for raw, t in zip(raws, seen, strict=True):
            rec = NODE_RECORD.decode(raw) if raw else None
            if rec is not None and t is not None and t > rec.last_heartbeat:
                rec.last_heartbeat = t
            out.append(rec)
        return out

    async def node_states(self, names: Sequence[str]) -> list[str | None]:
        raws = await self.r.mget([self.names.node_state_key(x) for x in names]) if names else []
        return [raw.decode() if raw else None for raw in raws]

    async def last_heard(self) -> dict[str, float]:
        """Every node's last heartbeat (or registration) time, from the liveness zset: one read."""
        return {m.decode(): t for m, t in await self.r.zrange(self.names.heartbeats_key, 0, -1, withscores=True)}

    async def silent_nodes(self, before: float) -> list[str]:
        """Nodes whose last heartbeat (or registration) is older than `before`."""
        return [m.decode() for m in await self.r.zrangebyscore(self.names.heartbeats_key, "-inf", f"({before!r}")]

    async def nodes(self) -> list[NodeRecord]:
        names = sorted(m.decode() for m in await self.r.smembers(self.names.nodes_key))
        return [rec for rec in await self.get_nodes(names) if rec is not None]

    async def nodes_with_health(self, names: list[str]) -> dict[str, tuple[NodeRecord | None, NodeHealthState | None]]:
        """Nodes' records and their health rules' states, in one round trip."""
        if not names:
            return {}
        keys = [k for name in names for k in (self.names.node_key(name), self.names.health_state_key(name))]
        raws = await self.r.mget(keys)
        out: dict[str, tuple[NodeRecord | None, NodeHealthState | None]] = {}
        for i, name in enumerate(names):
            raw_node, raw_health = raws[2 * i], raws[2 * i + 1]
            node = NODE_RECORD.decode(raw_node) if raw_node else None
            out[name] = node, (NODE_HEALTH_STATE.decode(raw_health) if raw_health else None)
        return out

    async def put_health_states(self, states: Mapping[str, NodeHealthState]) -> None:
        if states:
            await self.r.mset({self.names.health_state_key(name): encode(st) for name, st in states.items()})

    async def delete_health_state(self, name: str) -> None:
        await self.r.delete(self.names.health_state_key(name))

    async def hold_lease(self, key: str, holder: str, ttl_s: float) -> bool:
        """Take the lease at `key` (free or expired) or renew it (held by `holder`); False while another holds it."""
        return bool(await self._lease(keys=[key], args=[holder, int(ttl_s * 1000)]))

    async def put_reservations(self, r: Reservations) -> None:
        await self.r.set(self.names.reservations_key, encode(r))

    async def reservations(self) -> Reservations | None:
        raw = await self.r.get(self.names.reservations_key)
        return RESERVATIONS.decode(raw) if raw else None

    async def topology_generation(self) -> int:
        return int(await self.r.get(self.names.topo_gen_key) or 0)

    # -- queue: jobs -----------------------------------------------------------------------------------
    async def put_job(self, rec: JobRecord, *, new: bool = False) -> None:
        n = self.names
        async with self.r.pipeline(transaction=True) as p:
            p.set(n.job_key(rec.id), encode(rec))
            if new:
                p.zadd(n.jobs_key, {rec.id: submit_order(rec)}, nx=True)
            _index_job(p, n, rec)
            await p.execute()
        self._seen(rec.id, encode(rec), rec.state)

    async def create_job(self, rec: JobRecord) -> tuple[JobRecord, bool]:
        """Store a new job unless its id exists (a redelivered submission); returns the stored record and
        whether this call created it. One round trip either way."""
        data = encode(rec)
        ok, current = await self._cas_job(rec.id, b"", data, rec, score=submit_order(rec))
        if ok:
            return rec, True
        assert current is not None  # '' was expected, so the CAS only fails when a record exists
        stored = JOB_RECORD.decode(current)
        self._seen(rec.id, current, stored.state)
        return stored, False

    async def update_job(
        self, job_id: str, change: Callable[[JobRecord], JobRecord | None], *, known: bytes | None = None
    ) -> tuple[JobRecord | None, bool]:
        """Read-modify-write one job atomically: `change` decides on the stored record (first on `known`, the
        bytes a cache kept, without a read) and a CAS script writes the result only if that record is still the
        stored one, else `change` runs again on the stored one.

        `change` gets the current record and returns the new one, or None for "no change". Returns the
        record as stored afterwards and whether it changed; (None, False) when the job doesn't exist. A
        "no change" or an exception decided on `known` is checked against the store first.
        """
        key = self.names.job_key(job_id)
        raw, remembered = known, known is not None
        if raw is None:
            raw = await self.r.get(key)
        while True:
            if raw is None:
                await self.require_view()  # a job missing from a view being rebuilt may exist: wait for it
                self._seen(job_id, None, None)
                return None, False
            failed: Exception | None = None
            try:
                new = change(JOB_RECORD.decode(raw))
            except Exception as e:
                new, failed = None, e
            if new is None:
                # decided on a kept record that is no longer the stored one: decide again on that one
                if remembered and (fresh := await self.r.get(key)) != raw:
                    raw, remembered = fresh, False
                    continue
                if failed is not None:
                    raise failed
                stored = JOB_RECORD.decode(raw)
                self._seen(job_id, raw, stored.state)
                return stored, False
            data = encode(new)
            ok, current = await self._cas_job(job_id, raw, data, new)
            if ok:
                return new, True
            raw, remembered = current, False

    async def _cas_job(
        self, job_id: str, expected: bytes, data: bytes, new: JobRecord, score: float | None = None
    ) -> tuple[bool, bytes | None]:
        n = self.names
        active, undecided = _job_indexes(new)
        keys = [n.job_key(job_id), n.active_jobs_key, n.undecided_jobs_key, n.jobs_key, n.view_key]
        args = [expected, data, job_id, int(active), int(undecided), "" if score is None else repr(score)]
        res = await self._job_cas(keys=keys, args=[*args, self._view_clock])
        if res[0] == 2:
            raise ViewNotReady(f"job {job_id} not written")
        if res[0] == 1:
            self._saw_clock(int(res[1]))
            self._seen(job_id, data, new.state)
            return True, None
        current = res[1] if len(res) > 1 and res[1] else None
        if current is None:
            self._seen(job_id, None, None)
        return False, current

    async def get_job(self, job_id: str) -> JobRecord | None:
        """The job's record; None when it doesn't exist. ViewNotReady when it is missing from a view that is
        being rebuilt (or from a Redis that came back empty): it may exist, nobody can tell yet."""
        raw = await self.r.get(self.names.job_key(job_id))
        if raw is None:
            await self.require_view()
            return None
        return JOB_RECORD.decode(raw)

    async def get_jobs(self, ids: Iterable[str]) -> list[JobRecord]:
        """The records of the ids that exist."""
        return [JOB_RECORD.decode(raw) for raw in await self.job_bytes(ids) if raw is not None]

    async def job_bytes(self, ids: Iterable[str]) -> list[bytes | None]:
        """The stored records of `ids` as bytes, in order (None: no such job); one MGET."""
        ids = list(ids)
        return await self.r.mget([self.names.job_key(i) for i in ids]) if ids else []

    async def undecided_job_ids(self) -> set[str]:
        """Pending jobs waiting for a decision (none has an order in flight): one SMEMBERS."""
        return {m.decode() for m in await self.r.smembers(self.names.undecided_jobs_key)}

    async def active_job_ids(self) -> list[str]:
        """The ids of every job not yet terminal, in id order."""
        return sorted(m.decode() for m in await self.r.smembers(self.names.active_jobs_key))

    async def active_job_count(self) -> int:
        """How many jobs have not ended (the size of the active set; no record read)."""
        return int(await self.r.scard(self.names.active_jobs_key))

    async def active_jobs(self) -> list[JobRecord]:
        """Every job not yet terminal."""
        return await self.get_jobs(await self.active_job_ids())

    async def index_array(self, array_id: str, task_ids: Sequence[str]) -> None:
        """Note an array's task ids (once their records are written: whoever finds the array finds every task).
        Idempotent."""
        if task_ids:
            await self.r.sadd(self.names.array_key(array_id), *task_ids)

    async def array_task_ids(self, array_id: str) -> list[str]:
        """An array's task ids in index order; [] when `array_id` names no array. One SMEMBERS."""
        ids = [m.decode() for m in await self.r.smembers(self.names.array_key(array_id))]
        return sorted(ids, key=lambda t: (split_task_id(t) or ("", 0))[1])

    async def list_jobs(
        self,
        *,
        tenant: str | None = None,
        state: JobState | None = None,
        offset: int = 0,
        limit: int = 50,
        array: str | None = None,
    ) -> tuple[list[JobRecord], int]:
        """Jobs in submit order (an array's tasks, `array`, in index order), filtered; returns (page, total
        matching). Scans in chunks: fine at our scale."""
        out: list[JobRecord] = []
        matched = 0
        start, chunk = 0, 500
        tasks = await self.array_task_ids(array) if array is not None else None
        while True:
            if tasks is not None:
                ids = tasks[start : start + chunk]
            else:
                ids = [m.decode() for m in await self.r.zrange(self.names.jobs_key, start, start + chunk - 1)]
            if not ids:
                break
            for rec in await self.get_jobs(ids):
                if (tenant is None or rec.spec.tenant == tenant) and (state is None or rec.state == state):
                    if offset <= matched < offset + limit:
                        out.append(rec)
                    matched += 1
            start += chunk
        return out, matched

    # -- placement: allocations ------------------------------------------------------------------------
    async def commit(self, rec: AllocationRecord) -> CommitResult:
        n = self.names
        nodes = [ng.node for ng in rec.nodes]
        keys = [n.alloc_key(rec.job_id), n.allocs_key]
        keys += [n.gpus_key(x) for x in nodes] + [n.node_state_key(x) for x in nodes] + [n.view_key]
        args = [rec.job_id, str(rec.attempt), encode(rec), str(len(nodes))]
        args += [",".join(str(g) for g in ng.gpus) for ng in rec.nodes] + [str(self._view_clock)]
        res = [x.decode() if isinstance(x, bytes) else str(x) for x in await self._commit(keys=keys, args=args)]
        if res[0] == "not_ready":
            raise ViewNotReady("commit refused")
        if res[0] in ("ok", "dup"):
            self._saw_clock(int(res[1]))
            return CommitResult(True, duplicate=res[0] == "dup")
        return CommitResult(False, reason=" ".join(res))

    async def release(self, job_id: str, held: AllocationRecord | None = None) -> bool:
        """Free the job's GPUs; False when it held none (already released: idempotent). `held`: the job's
        allocation as the caller has just read it (`allocation`), which saves reading it again."""
        n = self.names
        rec = held
        if rec is None:
            raw = await self.r.hget(n.alloc_key(job_id), "record")
            if raw is None:
                await self.require_view()  # nothing held, or a view being rebuilt that doesn't know yet
                await self.r.srem(n.allocs_key, job_id)
                return False
            rec = ALLOCATION_RECORD.decode(raw)
        keys = [n.alloc_key(job_id), n.allocs_key] + [n.gpus_key(ng.node) for ng in rec.nodes] + [n.view_key]
        args = [job_id, str(len(rec.nodes)), str(rec.attempt)] + [",".join(str(g) for g in ng.gpus) for ng in rec.nodes]
        released = int(await self._release(keys=keys, args=args))
        if released < 0:
            raise ViewNotReady("release refused")
        return released == 1

    async def allocation(self, job_id: str) -> AllocationRecord | None:
        raw = await self.r.hget(self.names.alloc_key(job_id), "record")
        return ALLOCATION_RECORD.decode(raw) if raw else None

    async def allocations(self) -> list[AllocationRecord]:
        ids = sorted(m.decode() for m in await self.r.smembers(self.names.allocs_key))
        if not ids:
            return []
        raws = await self._alloc_records(keys=[self.names.alloc_key(i) for i in ids])
        return [ALLOCATION_RECORD.decode(raw) for raw in raws if raw]

    async def gpu_owners(self, node: str) -> dict[int, str]:
        raw = await self.r.hgetall(self.names.gpus_key(node))
        return {int(k): v.decode() for k, v in raw.items()}

    # -- the view: whether Redis is complete, and up to where in the log ---------------------------------------
    async def view_status(self) -> tuple[str, ViewMark | None]:
        """("ready" | "rebuilding" | "missing", the position it recorded): "missing" is a Redis that came back
        empty (or was never written), "rebuilding" one whose rebuild is under way or was cut short."""
        raw = await self.r.hgetall(self.names.view_key)
        if not raw:
            return "missing", None
        mark = ViewMark(int(raw.get(b"jobs_seq", 0)), int(raw.get(b"events_seq", 0)))
        return raw.get(b"state", b"rebuilding").decode(), mark

    async def view_ready(self) -> bool:
        return await self.r.hget(self.names.view_key, "state") == b"ready"

    async def require_view(self) -> None:
        """ViewNotReady unless the view is ready: what isn't in it may still be in the log."""
        if not await self.view_ready():
            raise ViewNotReady("the view is being rebuilt from the log")

    def _saw_clock(self, clock: int) -> None:
        self._view_clock = max(self._view_clock, clock)

    async def close_view(self) -> None:
        """Refuse every commit, release and job write until `open_view` (the rebuild writes meanwhile)."""
        await self.r.hset(self.names.view_key, "state", "rebuilding")

    async def open_view(self, mark: ViewMark, now: float) -> None:
        """Open a view complete up to `mark`. Its clock moves on to `now` in microseconds: past what any writer
        saw of an earlier view (which counts up by one a write, far slower), whether it was caught up from a
        copy or rebuilt on an empty Redis, so none finds the new one behind."""
        key = self.names.view_key
        clock = int(await self.r.hget(key, "clock") or 0)
        fields = {"clock": max(clock + 1, int(now * 1e6))}
        fields |= {"state": "ready", "jobs_seq": mark.jobs_seq, "events_seq": mark.events_seq}
        await self.r.hset(key, mapping=fields)

    async def see_view_clock(self) -> None:
        """Take in the view's clock as it is now: a write or record after this finds a copy older than now
        behind. Read after the log positions a `record_view` will record: every write those cover is then at or
        below it."""
        self._saw_clock(int(await self.r.hget(self.names.view_key, "clock") or 0))

    async def record_view(self, mark: ViewMark) -> bool:
        """Move a ready view's position forward (never back; nothing while it is rebuilt or missing). A view
        behind the clock this store saw (a stale copy swapped in) is marked behind instead; False then."""
        args = [mark.jobs_seq, mark.events_seq, self._view_clock]
        return bool(await self._record_view(keys=[self.names.view_key], args=args))

    async def restore_jobs(self, records: Sequence[JobRecord]) -> None:
        """Write job records rebuilt from the log, with their indexes (the view is closed: nobody else writes)."""
        n = self.names
        for i in range(0, len(records), RESTORE_BATCH):
            chunk = [(rec, encode(rec)) for rec in records[i : i + RESTORE_BATCH]]
            async with self.r.pipeline(transaction=False) as p:
                for rec, data in chunk:
                    p.set(n.job_key(rec.id), data)
                    p.zadd(n.jobs_key, {rec.id: submit_order(rec)}, nx=True)
                    _index_job(p, n, rec)
                    if rec.array_id:
                        p.sadd(n.array_key(rec.array_id), rec.id)
                await p.execute()
            for rec, data in chunk:
                self._seen(rec.id, data, rec.state)

    async def restore_allocations(self, held: Mapping[str, AllocationRecord], floors: Mapping[str, int]) -> None:
        """Make the allocations exactly `held` (job → its allocation, from the rebuilt records) and every job's
        floor its record's (an order of an attempt up to it, redelivered late, never commits): what the commit
        and release scripts would have left. The view is closed: nobody else writes."""
        n = self.names
        current = {a.job_id: a for a in await self.allocations()}
        async with self.r.pipeline(transaction=True) as p:
            for job, alloc in current.items():
                if held.get(job) == alloc:
                    continue
                for ng in alloc.nodes:
                    p.hdel(n.gpus_key(ng.node), *[str(g) for g in ng.gpus])
                p.hdel(n.alloc_key(job), "attempt", "record")
                p.srem(n.allocs_key, job)
            for job, alloc in held.items():
                if current.get(job) == alloc:
                    continue
                for ng in alloc.nodes:
                    p.hset(n.gpus_key(ng.node), mapping={str(g): job for g in ng.gpus})
                p.hset(n.alloc_key(job), mapping={"attempt": alloc.attempt, "record": encode(alloc)})
                p.sadd(n.allocs_key, job)
            for job, floor in floors.items():
                if floor > 0:
                    p.hset(n.alloc_key(job), "floor", floor)
            await p.execute()

    # -- migration: moves (the API's view; the truth is the MIGRATIONS stream) ------------------------------
    async def put_migration(self, rec: MigrationRecord) -> None:
        n = self.names
        async with self.r.pipeline(transaction=True) as p:
            p.set(n.migration_key(rec.id), encode(rec))
            p.zadd(n.migrations_key, {rec.id: rec.created_at}, nx=True)
            await p.execute()

    async def list_migrations(
        self, *, tenant: str | None = None, job_id: str | None = None, offset: int = 0, limit: int = 50
    ) -> tuple[list[MigrationRecord], int]:
        """Moves, newest first, filtered; returns (page, total matching)."""
        n = self.names
        ids = [m.decode() for m in await self.r.zrevrange(n.migrations_key, 0, -1)]
        out: list[MigrationRecord] = []
        matched = 0
        for start in range(0, len(ids), 500):
            raws = await self.r.mget([n.migration_key(i) for i in ids[start : start + 500]])
            for raw in raws:
                if not raw:
                    continue
                rec = MIGRATION_RECORD.decode(raw)
                if (tenant is None or rec.tenant == tenant) and (job_id is None or rec.job_id == job_id):
                    if offset <= matched < offset + limit:
                        out.append(rec)
                    matched += 1
        return out, matched


def _job_indexes(rec: JobRecord) -> tuple[bool, bool]:
    """Whether the job belongs in the active set and in the undecided set (its record decides both)."""
    return rec.state not in TERMINAL, rec.state is JobState.PENDING and rec.inflight_since is None


def _index_job(p: Pipeline | ClusterPipeline, n: Names, rec: JobRecord) -> None:
    """The job's membership of the active and undecided sets, in the same transaction as its record."""
    active, undecided = _job_indexes(rec)
    (p.sadd if active else p.srem)(n.active_jobs_key, rec.id)
    (p.sadd if undecided else p.srem)(n.undecided_jobs_key, rec.id)


def node_gpus(pairs: Iterable[tuple[str, Iterable[int]]]) -> list[NodeGpus]:
    return [NodeGpus(node, sorted(gpus)) for node, gpus in pairs]
