"""The HTTP API's response and admin bodies (msgspec Structs), defined once: the gateway builds and encodes
them (`services/gateway/views.py`), /openapi.json describes them, and clients (the CLI) decode them."""

from __future__ import annotations

from typing import Annotated

import msgspec

from shared.schemas import JobState, TopologyBody


class ErrorBody(msgspec.Struct, kw_only=True):
    """Every 4xx/5xx answer. `field` is the dotted path of the offending input, when there is one."""

    error: str
    field: str | None = None


class Accepted(msgspec.Struct, kw_only=True):
    id: str
    state: str


class DrainBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Optional body of POST /v1/nodes/{id}/drain and /undrain."""

    reason: Annotated[str, msgspec.Meta(max_length=512)] = ""


class NodeAdminResult(msgspec.Struct, kw_only=True):
    node: str
    state: str


class Placed(msgspec.Struct, kw_only=True):
    """GPUs of one node held by a job, with the node's NVLink domain."""

    domain: str
    node: str
    gpus: list[int]


class RankExitView(msgspec.Struct, kw_only=True):
    """How one rank of the job's latest attempt ended."""

    node: str
    rank: int
    exit_code: int  # the process's status; -N: signal N ended it
    signal: str | None  # that signal's name (SIGTERM, SIGKILL, ...)
    cause: str  # completed, failed, time limit, cancelled, node lost, preempted, moved


class JobView(msgspec.Struct, kw_only=True):
    """A job as stored by the queue (JobRecord), kept after it ends."""

    id: str
    name: str
    tenant: str
    state: JobState
    reason: str  # why it is pending (or how it ended)
    gpus: int  # an elastic job's most
    gpus_per_node: int | None
    topology: TopologyBody
    priority: int
    exclusive: bool
    checkpointable: bool
    allocation: list[Placed]
    submitted_at: float
    started_at: float | None
    ended_at: float | None
    updated_at: float
    attempt: int
    exit_codes: dict[str, int]  # "node/rank" → exit code
    trace_id: str = ""  # the job's trace (32 hex digits; "" when the submit carried none), for a Jaeger link
    # how its processes start (the body's; its env is not echoed back: it may hold credentials)
    time_limit_s: float | None = None
    processes: str = "per_node"
    workdir: str = ""
    end: str = ""  # why it ended: completed, failed, time limit, cancelled, node lost ("" while it hasn't)
    exits: list[RankExitView] = []  # its latest attempt's ranks that exited while it ran, by rank
    # the segment size of its latest attempt's layout (null: none yet, or no segments); a flexible job's
    # (`topology.segment` a list) is one of the sizes it listed
    segment: int | None = None
    min_gpus: int | None = None  # elastic: its least (its allocation says the size it has)
    # a task of an array: the array's id (its submit's) and this task's index; `array` the body's ("0-99%8")
    array_id: str | None = None
    array_index: int | None = None
    array: str | None = None
    dependency: str = ""  # what it waits for, as submitted ("afterok:ID,singleton"); the reason says what is left


class LogLine(msgspec.Struct, kw_only=True):
    """One line a job's process wrote, as a followed log sends it (`event: line`). A `dropped` line is not the
    process's but a marker: that many of its lines before this one are missing (`text` says why)."""

    rank: int
    text: str  # without its newline
    dropped: int = 0


class LogEnd(msgspec.Struct, kw_only=True):
    """The last event of a followed log (`event: end`): the job has ended and every line it wrote was sent."""

    state: JobState
    end: str  # why it ended (JobView.end)


class JobList(msgspec.Struct, kw_only=True):
    jobs: list[JobView]
    total: int  # jobs matching the filters
    offset: int
    limit: int


class MigrationView(msgspec.Struct, kw_only=True):
    """One move the migration service made (or an evacuation requeue: `to` is empty), and why."""

    id: str
    job_id: str
    tenant: str
    kind: str  # evacuate | defrag | rebalance | consolidate | grow
    why: str
    state: str  # requested | checkpointing | restoring | done | requeued | rolled_back
    attempt: int  # the job attempt moved; it restores as attempt + 1
    source: list[Placed] = msgspec.field(name="from")
    to: list[Placed]
    created_at: float
    updated_at: float
    steps: dict[str, float]  # step → time: requested, checkpointing, restoring, placed, running, done, ...
    took_s: float | None  # requested → its final state
    error: str
    cost_gpu_s: float  # the planner's estimate (checkpoint + restore time x GPUs)
    gain_gpu_s: float


class MigrationList(msgspec.Struct, kw_only=True):
    migrations: list[MigrationView]
    total: int
    offset: int
    limit: int


class GpuView(msgspec.Struct, kw_only=True):
    index: int
    health: str  # ok | degraded | down
    job: str | None  # owning job id
    # what the GPU shows (shared.picture.gpu_cell): free | job | down | draining | degraded; absent from older gateways
    cell: str = "free"


class Utilisation(msgspec.Struct, kw_only=True):
    """`healthy`: GPUs not down on nodes not down; `busy`: GPUs held by a job; ratio: busy healthy / healthy."""

    total: int
    healthy: int
    busy: int
    ratio: float


class NodeView(msgspec.Struct, kw_only=True):
    name: str
    state: str  # up | draining | down
    drained: bool
    reason: str
    clique: int
    leaf: str | None
    backend: str
    last_heartbeat: float
    gpus: list[GpuView]


class DomainView(msgspec.Struct, kw_only=True):
    name: str
    nodes: list[NodeView]
    utilisation: Utilisation


class AllocationView(msgspec.Struct, kw_only=True):
    job_id: str
    attempt: int
    committed_at: float
    nodes: list[Placed]


class ClusterView(msgspec.Struct, kw_only=True):
    generation: int  # topology generation (bumped on every inventory change)
    domains: list[DomainView]
    allocations: list[AllocationView]
    utilisation: Utilisation


class Health(msgspec.Struct, kw_only=True):
    status: str
    nats: bool | None = None
    redis: bool | None = None
    view: bool | None = None  # Redis holds a complete view of the log (not being rebuilt)
