"""The HTTP API's response and admin bodies (msgspec Structs), defined once: the gateway builds and encodes
them (`services/gateway/views.py`), /openapi.json describes them, and clients (the CLI) decode them."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from shared.schemas import JobState, TopologyBody

MAX_PAGE = 500  # the most items one page of a list holds (`limit`)
DEFAULT_PAGE = 50
# An Idempotency-Key is a Structured Field string (draft-ietf-httpapi-idempotency-key-header): printable ASCII.
IDEMPOTENCY_KEY = "^[ -~]{1,255}$"


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


class DryRunView(msgspec.Struct, kw_only=True):
    """POST /v1/jobs?dry_run=true: where the job would go if it were submitted now, as the queue leader's next cycle
    would decide on its current state with the job added. Nothing is stored or published: the job doesn't exist.

    `start`: `now` (it fits now: `allocation` is where), `later` (it would wait: `forecast_start` is when its
    reservation starts, or an estimate when the reservations ahead of it use up the cycle's depth; null when no start
    can be forecast), `never` (it can't run on the fleet as it is: health, drains). `reason` is the pending reason
    the queue would give it (when it starts now: whom it displaces, else "")."""

    start: Literal["now", "later", "never"]
    allocation: list[Placed]  # where it starts now, or its reserved (or estimated) layout; [] when neither
    domains: list[str]  # the NVLink domains of that layout, in order
    gpus: int  # GPUs of that layout (an elastic job's size); without one, what it asks for
    segment: int | None  # the layout's segment size (a flexible job's may be smaller than its first)
    forecast_start: float | None  # Unix seconds
    reason: str
    reserved: bool  # the cycle would hold a reservation for it (false for an estimate)
    preempts: int  # jobs of lower priority it would preempt to start now
    shrinks: int  # elastic jobs it would shrink to start (it starts once they gave their GPUs back)


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


class UsageRow(msgspec.Struct, kw_only=True):
    """One tenant's use of one period (a UTC day, or an ISO week from Monday)."""

    tenant: str
    period: str  # the period's first day, ISO (2025-01-06)
    start: float  # the same, as Unix seconds (00:00 UTC)
    gpu_hours: float  # GPUs held x hours, runs still holding counted up to `as_of`
    jobs: int  # distinct jobs that held GPUs in the period


class UsageView(msgspec.Struct, kw_only=True):
    """GET /v1/usage: GPU-hours per tenant and period, from the job log (the usage view the queue keeps)."""

    tenant: str | None  # the tenant asked for (null: every tenant the caller may see)
    by: str  # day | week
    start: float = msgspec.field(name="from")  # the first period's start (from, rounded down to one)
    end: float = msgspec.field(name="to")  # the end of the last (to, rounded up): periods in [from, to)
    as_of: float  # when this was read: open runs count up to it
    rows: list[UsageRow]  # by period, then tenant; a tenant's periods without use are left out


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


class CellSummary(msgspec.Struct, kw_only=True):
    """One cell's capacity in figures (GET /v1/cluster/summary): what a router over several cells places jobs by,
    and its /v1/cells rows. GPUs: `healthy` and `busy` as in Utilisation; `free` healthy GPUs no job holds on nodes
    up (not draining, not down): what a job could get now. Jobs: `jobs_running` hold GPUs (placed, running or
    moving), `jobs_pending` wait for them (every other job not ended)."""

    cell: str
    generation: int  # topology generation
    gpus: int
    healthy: int
    busy: int
    free: int
    nodes: int
    nodes_up: int
    jobs_pending: int
    jobs_running: int


class CellStatus(msgspec.Struct, kw_only=True):
    """A router's row for one cell (GET /v1/cells): the cell's summary, or why there is none."""

    cell: str
    up: bool  # its gateway answered
    summary: CellSummary | None = None
    error: str = ""  # why not, when it didn't


class CellList(msgspec.Struct, kw_only=True):
    cells: list[CellStatus]  # in the router's order (the first: the default cell of one-cell views)


class RouterHealth(msgspec.Struct, kw_only=True):
    """A router's /healthz and /readyz: which cells' gateways answer."""

    status: str  # ok (every cell answers) | degraded (some do) | unavailable (none does)
    cells: dict[str, bool]
