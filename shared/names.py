"""Every NATS subject, JetStream stream and consumer, and Redis key pattern — defined once, here.

A `Names` is built from a prefix (default ``rackscale``; tests use a unique one so they can share a
server) and a scheduling cell. All Redis keys of a cell share the hash tag ``{cell}``, so one Lua
script can touch any of them atomically, also on Redis Cluster; a cell's subjects and streams start with
`scope` (``rackscale.c1.…``; the default cell ``c0`` keeps plain ``rackscale.…``), so several cells share one
NATS and one Redis.

Who writes what (one writer per Redis key family):
  inventory  node:*, nodestate:*, healthstate:*, nodes, heartbeats, topo:gen      placement  gpus:*, alloc:*, allocs
  queue      job:*, jobs, jobs:active, jobs:undecided, array:*, queue:leader, view, view:lock, usage* (its leader)
  migration  migration:*, migrations
(A rebuild of the view from the log — services/queue/rebuild.py — writes allocations too, while the view is
closed and the commit script refuses; every commit and job write counts the view's clock up.)
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

# A process's log (shared/rank_log.py): chunks of up to LOG_CHUNK_BYTES (or FLUSH_S of lines), the newest
# LOG_CHUNKS_PER_RANK kept per rank (so at most 16 MiB a rank), every log at most a week, 1 GiB in all.
LOG_CHUNK_BYTES = 16 * 1024
LOG_CHUNKS_PER_RANK = 1024
LOG_STREAM_MAX_BYTES = 1 << 30
LOG_MAX_AGE_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    # streams whose loss loses accepted work are synced to disk on every write (see README, durability)
    sync_always: bool
    per_subject: int = 0  # keep only the newest N messages per subject (a record per subject); 0: all
    max_bytes: int = 0  # the stream's size bound, oldest dropped first; 0: none
    max_age_s: float = 0.0  # messages older than this are dropped; 0: kept


DEFAULT_CELL = "c0"
# A cell name becomes a Redis hash tag `{cell}` and part of NATS subjects: no braces, dots, spaces or wildcards.
CELL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_JOB_TOKEN = re.compile(r"[0-9a-f]{32}")


def cell_job_id(cell: str, token: str) -> str:
    """The id of a job of `cell` minted from `token` (32 hex digits): `<cell>-<token>`, so a front door over
    several cells (services/router) sends reads, cancels and logs to the cell without a lookup. The default
    cell's ids stay the plain token, as they always were."""
    return token if cell == DEFAULT_CELL else f"{cell}-{token}"


# Idempotency-Key → job id: uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}/{key}"), in the cell's form. Never change it:
# retries across a deploy must keep naming the same job (and a router finds an earlier submit by it).
IDEMPOTENCY_NAMESPACE = uuid.UUID("3d1f0c52-7a4e-5b8e-9c61-2f4a8e0b7d93")


def idempotent_job_id(tenant: str, key: str, cell: str = DEFAULT_CELL) -> str:
    """The id a submit of `tenant` with this Idempotency-Key gets in `cell`."""
    return cell_job_id(cell, uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{tenant}/{key}").hex)


def job_cell(job_id: str) -> str:
    """The cell a job id belongs to (what `cell_job_id` put in it): an id without a cell prefix is the default
    cell's. The token has no '-', so a cell name with one ('west-2') is still read whole."""
    cell, sep, token = job_id.rpartition("-")
    if sep and CELL_NAME.fullmatch(cell) and _JOB_TOKEN.fullmatch(token):
        return cell
    return DEFAULT_CELL


@dataclass(frozen=True, slots=True)
class Names:
    prefix: str = "rackscale"
    cell: str = DEFAULT_CELL

    @property
    def scope(self) -> str:
        """What every subject and stream name starts with: the prefix, and for a cell other than the default its
        name too, so that cells share one NATS without a subject or stream in common (as their Redis keys share
        one Valkey under their own hash tags). The default cell keeps the names it always had."""
        return self.prefix if self.cell == DEFAULT_CELL else f"{self.prefix}.{self.cell}"

    # -- subjects: JetStream (durable) ------------------------------------------------------------------
    @property
    def job_submit(self) -> str:
        return f"{self.scope}.jobs.submit"  # gateway → queue: JobSubmitted

    @property
    def job_cancel(self) -> str:
        return f"{self.scope}.jobs.cancel"  # gateway → queue: JobCancel

    @property
    def job_move(self) -> str:
        return f"{self.scope}.jobs.move"  # migration → queue: MoveOrder / MoveAbort

    @property
    def orders(self) -> str:
        return f"{self.scope}.orders.{self.cell}"  # queue → placement: PlaceOrder / ReleaseOrder / CheckpointOrder

    def agent_cmd(self, node: str) -> str:
        return f"{self.scope}.agent.cmd.{node}"  # placement → one agent: StartRank / StopRank

    @property
    def agent_cmd_all(self) -> str:
        return f"{self.scope}.agent.cmd.>"

    def job_event(self, job_id: str) -> str:
        return f"{self.scope}.events.job.{job_id}"  # queue → anyone: JobEvent (the job's audit log)

    @property
    def job_events_all(self) -> str:
        return f"{self.scope}.events.job.>"

    # What the queue hears about a job from placement and the agents shares one subject prefix, so the queue
    # reads it as one inbox (one consumer, the stream's order), each job's messages in order: a rank's start
    # can't overtake its attempt's commit, which placement stores before any agent hears of the attempt.
    @property
    def placement_events(self) -> str:
        return f"{self.scope}.events.inbox.placement"  # placement → queue: Committed / Rejected / Released

    @property
    def agent_events(self) -> str:
        return f"{self.scope}.events.inbox.agent"  # agents → queue: RankStarted / RankExited

    @property
    def events_all(self) -> str:
        return f"{self.scope}.events.>"  # the EVENTS stream whole: what a rebuild of the view reads in order

    @property
    def job_inbox(self) -> str:
        return f"{self.scope}.events.inbox.>"  # both of the above, as the queue reads them

    def node_event(self, node: str) -> str:
        # inventory → queue, gateway, migration: NodeChanged. One subject per node, so the node's last verdict
        # (a drain, a fatal XID) is one lookup in the log when its record must be made again (Redis lost it)
        return f"{self.scope}.events.node.{node}"

    @property
    def node_events(self) -> str:
        return f"{self.scope}.events.node.>"  # every node's, as they are heard

    @property
    def migration_events(self) -> str:
        return f"{self.scope}.events.migration"  # migration → anyone: MigrationEvent (each step of a move)

    def migration_record(self, migration_id: str) -> str:
        return f"{self.scope}.migrations.{migration_id}"  # migration's own record of a move (newest kept)

    @property
    def migration_records_all(self) -> str:
        return f"{self.scope}.migrations.>"

    def job_log(self, job_id: str, attempt: int, rank: int) -> str:
        return f"{self.scope}.logs.{job_id}.{attempt}.{rank}"  # agent → anyone: LogChunk (a process's output)

    def job_logs(self, job_id: str, attempt: int | str = "*", rank: int | str = "*") -> str:
        return f"{self.scope}.logs.{job_id}.{attempt}.{rank}"  # a job's logs ("*": every attempt, every rank)

    @property
    def logs_all(self) -> str:
        return f"{self.scope}.logs.>"

    # -- subjects: core NATS (fire-and-forget or request/reply) --------------------------------------------
    @property
    def agent_register(self) -> str:
        return f"{self.scope}.agent.register"  # agent → inventory: AgentRegister

    @property
    def agent_heartbeat(self) -> str:
        return f"{self.scope}.agent.heartbeat"  # agent → inventory: Heartbeat

    def telemetry(self, node: str) -> str:
        # agent → inventory (queue group), migration: Telemetry. Core NATS on purpose: high rate, loss-tolerant
        # (counters are cumulative), and no stream holds it.
        return f"{self.scope}.telemetry.{node}"

    def telemetry_batch(self, shard: str) -> str:
        # a simulated fleet's samples together (TelemetryBatch), under `telemetry_all` so every listener has them:
        # the token starts with "_", which no node name does (services/inventory: NODE_NAME)
        return f"{self.scope}.telemetry._{shard}"

    @property
    def telemetry_all(self) -> str:
        return f"{self.scope}.telemetry.*"

    @property
    def node_admin(self) -> str:
        return f"{self.scope}.nodes.admin"  # gateway → inventory (request/reply): NodeAdmin

    @property
    def dry_run(self) -> str:
        return f"{self.scope}.queue.dry_run"  # gateway → the queue leader (request/reply): DryRunRequest

    @property
    def cycle_kick(self) -> str:
        return f"{self.scope}.queue.kick"  # anyone → queue: run a cycle soon

    def dead_letter(self, service: str) -> str:
        return f"{self.scope}.dlq.{service}"  # malformed messages, with the error and the original subject

    # -- streams and consumers ---------------------------------------------------------------------------
    def _stream(self, suffix: str) -> str:
        return f"{self.scope.upper().replace('.', '_').replace('-', '_')}_{suffix}"

    @property
    def streams(self) -> tuple[StreamSpec, ...]:
        return (
            StreamSpec(self._stream("JOBS"), (self.job_submit, self.job_cancel, self.job_move), sync_always=True),
            StreamSpec(self._stream("ORDERS"), (f"{self.scope}.orders.>",), sync_always=True),
            StreamSpec(self._stream("AGENT"), (self.agent_cmd_all,), sync_always=True),
            StreamSpec(self._stream("EVENTS"), (self.events_all,), sync_always=True),
            StreamSpec(self._stream("DLQ"), (f"{self.scope}.dlq.>",), sync_always=False),
            # one MigrationRecord per move, the newest only: what a restarted migration service resumes from
            StreamSpec(self._stream("MIGRATIONS"), (self.migration_records_all,), sync_always=True, per_subject=1),
            # each process's output: the newest LOG_CHUNKS_PER_RANK chunks per rank, a week, 1 GiB in all
            StreamSpec(
                self._stream("LOGS"),
                (self.logs_all,),
                sync_always=False,
                per_subject=LOG_CHUNKS_PER_RANK,
                max_bytes=LOG_STREAM_MAX_BYTES,
                max_age_s=LOG_MAX_AGE_S,
            ),
        )

    def stream_for(self, subject: str) -> str:
        for spec in self.streams:
            for pattern in spec.subjects:
                if subject == pattern or (pattern.endswith(">") and subject.startswith(pattern[:-1])):
                    return spec.name
        raise KeyError(f"no stream holds subject {subject!r}")

    def consumer(self, service: str, what: str) -> str:
        """Durable consumer name: shared by a service's replicas (they split the work)."""
        return f"{service}-{what}".replace(".", "-")

    # -- Redis keys --------------------------------------------------------------------------------------
    def _key(self, rest: str) -> str:
        return f"{self.prefix}:{{{self.cell}}}:{rest}"

    def node_key(self, node: str) -> str:
        return self._key(f"node:{node}")  # hash: the agent's report, state, last heartbeat

    def node_state_key(self, node: str) -> str:
        return self._key(f"nodestate:{node}")  # string up|draining|down, read by the commit script

    def health_state_key(self, node: str) -> str:
        return self._key(f"healthstate:{node}")  # string: NodeHealthState (msgpack), the health rules' hysteresis

    @property
    def nodes_key(self) -> str:
        return self._key("nodes")  # set of node names

    @property
    def heartbeats_key(self) -> str:
        return self._key("heartbeats")  # zset: node → time of its last heartbeat (liveness, apart from the record)

    @property
    def topo_gen_key(self) -> str:
        return self._key("topo:gen")  # counter, bumped on every topology or health change

    def job_key(self, job_id: str) -> str:
        return self._key(f"job:{job_id}")  # string: JobRecord (msgpack)

    @property
    def jobs_key(self) -> str:
        return self._key("jobs")  # zset: job id by submit order (listing)

    def array_key(self, array_id: str) -> str:
        return self._key(f"array:{array_id}")  # set: the task ids of an array (the queue writes it with the tasks)

    @property
    def active_jobs_key(self) -> str:
        return self._key("jobs:active")  # set: ids of jobs not yet terminal

    @property
    def undecided_jobs_key(self) -> str:
        return self._key("jobs:undecided")  # set: ids of pending jobs with no order in flight (a cycle's work)

    def gpus_key(self, node: str) -> str:
        return self._key(f"gpus:{node}")  # hash: GPU index → job id

    def alloc_key(self, job_id: str) -> str:
        return self._key(f"alloc:{job_id}")  # hash: attempt, record (AllocationRecord); floor once released

    @property
    def allocs_key(self) -> str:
        return self._key("allocs")  # set: job ids holding GPUs

    @property
    def queue_leader_key(self) -> str:
        return self._key("queue:leader")  # string: the queue replica that runs cycles (SET NX PX lease)

    @property
    def reservations_key(self) -> str:
        # string: Reservations (msgpack): the leader's scheduler memory, its reservations' NVLink domains for the
        # migration planner, and reserved jobs and borrowers for the next leader
        return self._key("queue:reservations")

    def migration_key(self, migration_id: str) -> str:
        return self._key(f"migration:{migration_id}")  # string: MigrationRecord (msgpack), the API's view

    @property
    def migrations_key(self) -> str:
        return self._key("migrations")  # zset: migration id by creation time (listing)

    @property
    def migration_leader_key(self) -> str:
        return self._key("migration:leader")  # string: the migration replica that plans (SET NX PX lease)

    @property
    def view_key(self) -> str:
        # hash: state (ready | rebuilding) and the stream sequences the view is complete up to (jobs_seq,
        # events_seq): what tells an empty or stale Redis from a current one (services/queue/rebuild.py)
        return self._key("view")

    @property
    def view_lock_key(self) -> str:
        return self._key("view:lock")  # string: the queue replica rebuilding the view (SET NX PX)

    # The usage view (services/queue/usage.py, shared/usage_log.py): the queue leader's fold of the job log into
    # GPU-seconds per tenant and hour, complete up to the EVENTS sequence `usage_key` records.
    @property
    def usage_key(self) -> str:
        return self._key("usage")  # hash: events_seq (the log position folded), state (ready | rebuilding), at

    @property
    def usage_open_key(self) -> str:
        return self._key("usage:open")  # hash: job id → UsageRun (msgpack), the run its attempt holds GPUs in

    @property
    def usage_floors_key(self) -> str:
        return self._key("usage:floors")  # hash: job id → the last attempt whose run was closed

    @property
    def usage_days_key(self) -> str:
        return self._key("usage:days")  # zset: UTC day start (Unix seconds) of every day with usage, by itself

    def usage_day_key(self, day: int) -> str:
        return self._key(f"usage:day:{day}")  # hash: "<tenant>/<hour 00-23>" → GPU-seconds used that hour

    def usage_jobs_key(self, day: int) -> str:
        return self._key(f"usage:jobs:{day}")  # set: "<tenant>/<job id>" of every job that held GPUs that day

    @property
    def key_pattern(self) -> str:
        return self._key("*")  # everything of this cell (tests and `rackscale up` clean-up)
