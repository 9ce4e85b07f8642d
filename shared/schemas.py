"""Every message and record, as msgspec Structs with explicit dotted tags. Defined once, here.

Rules: every field added later gets a default (old messages still decode); bus messages are one tagged
union per subject family with one Decoder built once; `forbid_unknown_fields` only on external input
(the HTTP API), so services of different versions can talk. The records a service keeps one of per job or
node (a job's spec and record, its allocation, a node's record) are `gc=False`: they hold plain data and
never themselves, so the cyclic collector needn't walk thousands of them on a busy cluster, where a full
collection holds the event loop (docs/performance.md, "A busy cluster"). Keep it so: no field of such a record
may refer back to it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

import msgspec

# -- API input (external: strict) --------------------------------------------------------------------------

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


ENV_VALUE_MAX = 4096  # bytes of one env value; all of a job's env together at most ENV_TOTAL_MAX
ENV_TOTAL_MAX = 32 * 1024
Processes = Literal["per_node", "per_gpu"]  # one process per node (torchrun style) or per GPU (srun style)


SEGMENTS_MAX = 8  # segment sizes a flexible job may list


class TopologyBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True, gc=False):
    nvlink: Literal["required", "preferred", "none"] = "required"
    # Slurm's --segment; a list is a flexible job's acceptable sizes, preferred (largest) first
    segment: Positive | Annotated[list[Positive], msgspec.Meta(min_length=1, max_length=SEGMENTS_MAX)] | None = None
    level: Name = "domain"


class JobBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True, gc=False):
    """POST /v1/jobs."""

    name: Name
    tenant: Name
    gpus: Positive
    # elastic: it runs with any size from min_gpus to gpus, in whole segments (or nodes), resized at checkpoints
    # (torchrun --nnodes=MIN:MAX); it must be checkpointable. None: exactly `gpus`
    min_gpus: Positive | None = None
    gpus_per_node: Positive | None = None
    topology: TopologyBody = TopologyBody()
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    checkpointable: bool = False
    exclusive: bool = False
    command: Annotated[list[str], msgspec.Meta(max_length=256)] = []
    duration_s: NonNegative = 60.0  # how long a simulated agent runs it
    expected_runtime_s: NonNegative | None = None  # the user's estimate; defaults to duration_s
    on_node_failure: Literal["requeue", "fail"] = "requeue"
    # how its processes start (`Launch`; names and sizes checked in services/gateway/validation.py)
    env: Annotated[dict[str, Annotated[str, msgspec.Meta(max_length=ENV_VALUE_MAX)]], msgspec.Meta(max_length=64)] = {}
    workdir: Annotated[str, msgspec.Meta(max_length=4096)] = ""  # absolute; "" the agent's own
    time_limit_s: Annotated[float, msgspec.Meta(gt=0)] | None = None  # hard: stopped past it, ends failed
    processes: Processes = "per_node"
    slurm_env: bool = False  # also the launch contract's facts under Slurm's names (SLURM_PROCID, ...)
    # an array of tasks, Slurm's --array syntax ("0-99%8"; shared/core/arrays.py); None: one job
    array: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    # what it waits for, Slurm's --dependency syntax ("afterok:ID:ID,singleton"; shared/core/dependencies.py)
    dependency: Annotated[str, msgspec.Meta(max_length=8192)] = ""
    # also write each rank's output to this file on its node (Slurm's --output; %j job id, %x name, %t rank,
    # %N node, %A array id, %a task index, %% a percent sign); "": only the job's log
    output: Annotated[str, msgspec.Meta(max_length=4096)] = ""


class NodeAdmin(msgspec.Struct, kw_only=True, frozen=True):
    """gateway → inventory (request/reply): drain or undrain a node, or clear its latched GPU faults.

    `clear_health` forgets what the telemetry health rules decided for the node's GPUs (a fatal XID stays
    down until then, or until the agent registers with a new boot id); the next samples decide afresh.
    """

    node: str
    action: Literal["drain", "undrain", "clear_health"]
    reason: str = ""


class AdminReply(msgspec.Struct, kw_only=True, frozen=True):
    ok: bool
    error: str = ""
    state: str = ""


class DryRunRequest(msgspec.Struct, kw_only=True, frozen=True):
    """gateway → the queue leader (request/reply): where would this job go if it were submitted now? A submit's
    fields; the leader decides on its cycle's state with the job added and stores and publishes nothing."""

    job_id: str
    spec: JobBody
    submitted_at: float


class DryRunReply(msgspec.Struct, kw_only=True, frozen=True):
    """The queue leader's answer (`shared.core.dry_run`); `ok` False: it couldn't decide now (`error` says why)."""

    ok: bool
    error: str = ""
    start: Literal["now", "later", "never"] = "later"
    allocation: list[NodeGpus] = []  # where it starts now, or its reserved or estimated layout
    domains: list[str] = []
    gpus: int = 0
    segment: int | None = None
    forecast_start: float | None = None
    reason: str = ""
    reserved: bool = False
    preempts: int = 0  # jobs it would preempt to start now
    shrinks: int = 0  # elastic jobs it would shrink to start


# -- records in Redis --------------------------------------------------------------------------------------


class JobState(StrEnum):
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    MIGRATING = "migrating"  # checkpointing for a move; its GPUs stay held until every rank acknowledged


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
HOLDING = frozenset({JobState.PLACED, JobState.RUNNING, JobState.MIGRATING})  # states whose allocation is the job's own


class NodeGpus(msgspec.Struct, frozen=True, array_like=True, gc=False):
    node: str
    gpus: list[int]


class MoveTicket(msgspec.Struct, kw_only=True, gc=False):
    """A move the queue carries out for the migration service (`JobRecord.move`, while migrating)."""

    migration_id: str
    target: list[NodeGpus]  # where the job restores (pinned); placement's commit checks every GPU is free
    reason: str
    since: float
    acked: list[int] = []  # ranks whose checkpoint the agents acknowledged
    ran_s: float = 0.0  # the attempt's run time, from the acknowledgements
    segment: int = 0  # the layout's segment on the target, when the move changes it (0: as it was)


class JobRecord(msgspec.Struct, kw_only=True, gc=False):
    """What the queue keeps per job (key `job:{id}`) and the API shows."""

    id: str
    spec: JobBody
    state: JobState = JobState.PENDING
    reason: str = ""
    submitted_at: float = 0.0
    updated_at: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    attempt: int = 0  # bumps on every (re)placement
    floor: int = 0  # attempts up to this one were placed and are over: their late commits and starts are stale
    allocation: list[NodeGpus] = []
    domains: list[str] = []
    exit_codes: dict[str, int] = {}  # "node/rank" → exit code
    exit_causes: dict[str, str] = {}  # "node/rank" → why it exited (shared.lifecycle CAUSES)
    end: str = ""  # why the job ended: completed, failed, time limit, cancelled, node lost ("" while it runs)
    started_ranks: list[int] = []
    inflight_since: float | None = None  # a PlaceOrder is out for this attempt
    trace: str = ""  # traceparent of the submit, so later hops join the job's trace
    ran_s: float = 0.0  # run time banked by checkpoints: a restored attempt runs only what is left
    checkpoint: str = ""  # ref of the newest checkpoint ("" none); a restore resumes from it
    move: MoveTicket | None = None  # set while migrating
    segment: int | None = None  # the segment of the layout its attempt got (a flexible job's may be smaller)
    # a task of an array (`spec.array`): the array's id (its submit's) and this task's index; "" / None: no array
    array_id: str = ""
    array_index: int | None = None


class AllocationRecord(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """What placement keeps per job holding GPUs (key `alloc:{id}`)."""

    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    committed_at: float


class NodeRecord(msgspec.Struct, kw_only=True, gc=False):
    """What inventory keeps per node (key `node:{name}`)."""

    name: str
    domain: str
    clique: int = 0
    gpus: int = 4
    gpu_health: dict[str, str] = {}  # GPU index → "degraded" | "down"; absent means ok (worse of the two below)
    agent_health: dict[str, str] = {}  # what the agent itself reports (GpuReport.health)
    rule_health: dict[str, str] = {}  # what inventory's telemetry health rules decided (shared/health.py)
    boot_id: str = ""  # the agent's, from its last registration; a new one clears latched GPU faults
    state: Literal["up", "draining", "down"] = "up"
    drained: bool = False  # an operator's drain survives the node going down and up
    reason: str = ""
    last_heartbeat: float = 0.0
    backend: str = "sim"
    leaf: str | None = None
    addr: str = ""  # the agent's `AgentRegister.addr`: the launch contract's MASTER_ADDR when it is node 0


class RuleState(msgspec.Struct, kw_only=True):
    """Hysteresis of one health rule on one GPU (shared.health)."""

    active: bool = False  # the rule's verdict applies to the GPU
    held: int = 0  # consecutive samples the condition held (while not active)
    held_since: float | None = None
    clear: int = 0  # consecutive samples the condition was clear (while active)
    clear_since: float | None = None


class GpuHealthState(msgspec.Struct, kw_only=True):
    rules: dict[str, RuleState] = {}
    at: float | None = None  # time of the previous sample, and its counters (for rates and increases)
    nvlink_errors: int = 0
    ecc_uncorrected: int = 0


class NodeHealthState(msgspec.Struct, kw_only=True):
    """What inventory keeps per node (key `healthstate:{node}`) between telemetry samples: GPU index → state."""

    gpus: dict[str, GpuHealthState] = {}


# -- bus messages ------------------------------------------------------------------------------------------


class JobSubmitted(msgspec.Struct, tag="job.submitted", kw_only=True, frozen=True):
    job_id: str
    spec: JobBody
    submitted_at: float


class JobCancel(msgspec.Struct, tag="job.cancel", kw_only=True, frozen=True):
    job_id: str
    at: float
    reason: str = "cancelled by user"


class MoveOrder(msgspec.Struct, tag="job.move", kw_only=True, frozen=True):
    """migration → queue: move a running attempt to `target` (checkpoint, release, pinned place, restore).

    An empty `target` requeues the attempt instead (a job that can't be checkpointed, on failed hardware):
    pending again, or failed when the job asked for `on_node_failure: fail`.
    """

    migration_id: str
    job_id: str
    attempt: int
    target: list[NodeGpus]
    reason: str
    at: float
    segment: int = 0  # the layout's segment on the target, when the move changes it (consolidation; 0: as it was)


class MoveAbort(msgspec.Struct, tag="job.move_abort", kw_only=True, frozen=True):
    """migration → queue: a move whose checkpoint step timed out: requeue the job (no restore)."""

    migration_id: str
    job_id: str
    reason: str
    at: float


JobIntake = JobSubmitted | JobCancel | MoveOrder | MoveAbort


class ArrayTask(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """What an array task's processes are told of their array (shared/launch.py: RACKSCALE_ARRAY_*)."""

    array_id: str
    index: int
    count: int  # tasks in the array
    first: int  # its lowest and highest index
    last: int


class Launch(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """How a job's processes start, as its body asked: the same on every node (shared/launch.py)."""

    env: dict[str, str] = {}
    workdir: str = ""
    time_limit_s: float | None = None
    processes: Processes = "per_node"
    slurm_env: bool = False
    output: str = ""  # the body's output pattern (shared/output_path.py): each process's output also goes there
    job_name: str = ""  # the body's name, for the pattern's %x
    array: ArrayTask | None = None  # set for a task of an array


class PlaceOrder(msgspec.Struct, tag="order.place", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    master_addr: str
    command: list[str]
    duration_s: float
    decided_at: float
    restore: str = ""  # checkpoint ref the ranks resume from ("" a fresh start)
    launch: Launch = Launch()
    domains: list[str] = []  # each node's NVLink domain, parallel to `nodes`
    segments: list[int] = []  # each node's segment index (0 without segments), parallel to `nodes`
    master_port: int = 0
    segment: int = 0  # the layout's segment size (0: none); placement's commit carries it back


class ReleaseOrder(msgspec.Struct, tag="order.release", kw_only=True, frozen=True):
    """Free a job's GPUs now and stop its ranks (cancel, preemption, end, node failure)."""

    job_id: str
    reason: str
    checkpoint: bool = False
    only_attempt: int = 0  # free the GPUs only if the job holds them for this attempt (0: whatever it holds)
    stop_ranks: bool = True  # False: every rank has exited already (the job's own end): no StopRank to send
    cause: str = ""  # why the ranks stop (shared.lifecycle CAUSES): what their exits will say


class CheckpointOrder(msgspec.Struct, tag="order.checkpoint", kw_only=True, frozen=True):
    """Checkpoint and stop a job's ranks; its GPUs stay held (the queue releases them after the acks)."""

    job_id: str
    attempt: int
    reason: str


Order = PlaceOrder | ReleaseOrder | CheckpointOrder


class StartRank(msgspec.Struct, tag="agent.start", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    node: str
    gpus: list[int]
    rank: int
    world_size: int
    master_addr: str
    command: list[str]
    duration_s: float
    restore: str = ""  # checkpoint ref to resume from ("" a fresh start); duration_s is then what is left
    launch: Launch = Launch()
    # the attempt's whole allocation, its nodes' NVLink domains and segment indexes (parallel to `nodes`), and
    # the rendezvous port: what the launch contract tells every process (shared/launch.py)
    nodes: list[NodeGpus] = []
    domains: list[str] = []
    segments: list[int] = []
    master_port: int = 0


class StopRank(msgspec.Struct, tag="agent.stop", kw_only=True, frozen=True):
    job_id: str
    node: str
    reason: str
    checkpoint: bool = False
    # stop only ranks of this attempt or older (0: every attempt): a late stop must never hit a newer attempt
    # of the job started on the same node (a move that keeps some nodes)
    attempt: int = 0
    cause: str = ""  # why it stops (shared.lifecycle CAUSES), for its exit to say
    # a move's checkpoint: the GPUs stay held until the rank's exit acknowledges it (RankExited.checkpointed);
    # the sim agent takes RACKSCALE_CHECKPOINT_S. A preemption's checkpoint stop (GPUs already freed) is instant.
    ack: bool = False


AgentCommand = StartRank | StopRank


class GpuReport(msgspec.Struct, kw_only=True, frozen=True):
    index: int
    uuid: str = ""
    health: Literal["ok", "degraded", "down"] = "ok"


class RunningRank(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A rank an agent holds: running, or ended with its exit not yet stored (`shared.reconcile`)."""

    job_id: str
    attempt: int
    rank: int
    gpus: list[int] = []


class AgentRegister(msgspec.Struct, tag="agent.register", kw_only=True, frozen=True):
    node: str
    cluster_uuid: str
    clique_id: int
    gpus: list[GpuReport]
    backend: str = "sim"
    leaf: str | None = None
    at: float = 0.0
    boot_id: str = ""  # new at every agent start; a registration with a new one clears latched GPU faults
    ranks: list[RunningRank] = []  # what the agent holds (a registration stands in for that beat's heartbeat)
    addr: str = ""  # where the job's other nodes reach this one (MASTER_ADDR when it is node 0); "" its name


# -- telemetry (agent → inventory, core NATS: high rate, a lost sample is replaced by the next) ----------------


class NvLinkSample(msgspec.Struct, kw_only=True, frozen=True):
    up: int = 0  # links in state up
    total: int = 0  # links the GPU has; 0: not reported (no NVLink, or the query is unsupported)
    errors: int = 0  # cumulative replay + recovery + CRC errors over all links since the driver loaded


class GpuSample(msgspec.Struct, kw_only=True, frozen=True):
    """One GPU in one telemetry sample. Counters are cumulative, so a lost sample loses no count."""

    index: int
    util: float = 0.0  # busy fraction, 0..1
    mem_used_mib: int = 0
    mem_total_mib: int = 0
    temp_c: float = 0.0
    power_w: float = 0.0
    ecc_corrected: int = 0  # cumulative volatile single-bit (corrected) ECC errors
    ecc_uncorrected: int = 0  # cumulative volatile double-bit (uncorrected) ECC errors
    xids: list[int] = []  # XID codes seen since the previous sample
    nvlink: NvLinkSample = NvLinkSample()
    fabric: str = ""  # "completed" | "in_progress" | "not_started" | "failed"; "": no multi-node fabric / unknown
    # active clock throttle reasons: "hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake", "sw_power_cap"
    throttle: list[str] = []
    lost: bool = False  # fell off the bus: NVML can't reach the GPU (the other fields are zero)


class Telemetry(msgspec.Struct, tag="agent.telemetry", kw_only=True, frozen=True):
    """agent → inventory (and anyone listening) on `names.telemetry(node)`, every RACKSCALE_TELEMETRY_S."""

    node: str
    at: float
    seq: int = 0  # counts up from 0 at the agent's start: gaps are lost samples
    gpus: list[GpuSample] = []


class Heartbeat(msgspec.Struct, tag="agent.heartbeat", kw_only=True, frozen=True):
    node: str
    at: float
    gpus: list[GpuReport] = []
    ranks: list[RunningRank] = []  # what the agent holds, for the reconciliation of agents and records
    boot_id: str = ""  # the agent's, as in its registration


class AgentReports(msgspec.Struct, tag="agent.reports", kw_only=True, frozen=True):
    """Many agents' registrations and heartbeats as one message: a simulated fleet sends its nodes' reports
    of each moment together (5,004 nodes beat every second at 278 domains; one message each cost inventory
    more than the work they carry). On `names.agent_heartbeat`, handled as if each had come alone."""

    reports: list[AgentRegister | Heartbeat]


AgentReport = AgentRegister | Heartbeat | AgentReports


class TelemetryBatch(msgspec.Struct, tag="agent.telemetry_batch", kw_only=True, frozen=True):
    """Many agents' telemetry samples as one message (a simulated fleet's), on `names.telemetry_batch(shard)`;
    every listener takes it as the samples one after the other."""

    samples: list[Telemetry]


TelemetryMessage = Telemetry | TelemetryBatch


class Committed(msgspec.Struct, tag="placement.committed", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    at: float
    segment: int = 0  # the order's layout segment (0: none)


class Rejected(msgspec.Struct, tag="placement.rejected", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    reason: str
    at: float


class Released(msgspec.Struct, tag="placement.released", kw_only=True, frozen=True):
    job_id: str
    reason: str
    at: float
    attempt: int = 0  # the attempt whose GPUs were freed (0: the job held none)


class RankStarted(msgspec.Struct, tag="agent.started", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    node: str
    rank: int
    pid: int
    at: float


class RankExited(msgspec.Struct, tag="agent.exited", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    node: str
    rank: int
    exit_code: int
    at: float
    reason: str = ""
    # the rank was stopped because its agent shut down (node taken out of service), not by the job:
    # the queue treats it like a node loss (requeue or fail by the job's on_node_failure)
    lost: bool = False
    checkpointed: bool = False  # stopped by a checkpoint stop: the acknowledgement of a move's checkpoint
    ran_s: float = 0.0  # how long the rank ran
    time_limit: bool = False  # stopped by its agent at the job's time limit: the job ends failed, "time limit"
    cause: str = ""  # why it exited (shared.lifecycle CAUSES); "" from an agent that predates it


class NodeChanged(msgspec.Struct, tag="node.changed", kw_only=True, frozen=True):
    """inventory → anyone, on `names.node_event(node)` (JetStream): a node's state, topology or GPU health
    changed. The node's last one is its verdict in the log: a record Redis lost is made again from it and the
    agent's next registration (a drain stays drained, a fatal XID stays fatal).

    This is also THE GPU health event (there is no separate one): `gpu_health` is the node's whole map after
    the change (index → "degraded" | "down"; absent means ok), `changed_gpus` the GPUs whose health this
    event changes (index → new health, "ok" included) and `cause` what changed it: a telemetry health rule
    (`shared.health`: "xid_fatal", "fell_off_bus", "ecc_uncorrected", "nvlink_errors", "nvlink_down",
    "throttle", "temperature", "fabric"; "cleared" by an operator or a new boot), "agent" (the agent's own
    GpuReport), or "" for a change of the node's state or description only.
    """

    node: str
    state: Literal["up", "draining", "down"]
    reason: str
    at: float
    gpu_health: dict[str, str] = {}
    changed_gpus: dict[str, str] = {}
    cause: str = ""
    drained: bool = False  # NodeRecord's: an operator's drain, which outlives the node going down
    rule_health: dict[str, str] = {}  # NodeRecord's: what the health rules decided (latched faults included)
    boot_id: str = ""  # the agent's: a registration with another one clears latched faults


class JobEvent(msgspec.Struct, tag="job.event", kw_only=True, frozen=True):
    """One transition of a job's state machine; the stream of these is the job's audit log. With the job's
    submit and its inbox (placement's and the agents' messages) it is what a record is rebuilt from
    (`shared.lifecycle.replayed`), so it carries what no input carries: the queue's own decisions."""

    job_id: str
    state: JobState
    reason: str
    at: float
    attempt: int = 0
    nodes: list[NodeGpus] = []  # the allocation, while the job holds GPUs (placed, running, migrating)
    tenant: str = ""
    floor: int = 0  # JobRecord.floor: attempts up to it are over
    domains: list[str] = []
    move: MoveTicket | None = None  # while migrating: the move under way
    checkpoint: str = ""  # the newest checkpoint, and the run time it banked
    ran_s: float = 0.0
    end: str = ""  # JobRecord.end: why it ended
    segment: int = 0  # JobRecord.segment while it holds GPUs (0: none)


class Reservations(msgspec.Struct, kw_only=True):
    """The queue leader's scheduler memory, in Redis (`names.reservations_key`). For the migration planner: the
    NVLink domains, by name, that each waiting job's reservation holds (`Scheduler.promised`); it empties a
    job's own reserved domains first and keeps moved jobs out of all of them, as `rackscale sim --migration on`.
    For the next leader: those domains, the jobs the last cycle reserved and the borrowers of reserved nodes,
    so a failover keeps the reservations where they drain and can still take loans back."""

    at: float  # when the leader's cycle wrote it
    domains: dict[str, list[str]] = {}  # job id -> domain names
    reserved: list[str] = []  # the jobs the last cycle reserved (`Scheduler.reserved`)
    lent: dict[str, list[str]] = {}  # borrower job id -> the reserved jobs it borrowed from (`Scheduler.lent`)


class UsageRun(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A job attempt holding GPUs, as the usage view's fold of the log keeps it until the attempt ends (key
    `usage:open`, field the job id; shared/usage_log.py)."""

    attempt: int
    tenant: str
    gpus: int
    since: float  # its first event holding GPUs


class MigrationRecord(msgspec.Struct, kw_only=True):
    """One move (or requeue) the migration service decided: its record in JetStream and Redis, the API's view."""

    id: str
    job_id: str
    tenant: str
    kind: Literal["evacuate", "defrag", "rebalance", "consolidate", "grow"]
    why: str
    attempt: int  # the job attempt moved; the restore runs as attempt + 1
    source: list[NodeGpus]
    target: list[NodeGpus]  # empty: requeued (not checkpointable)
    state: Literal["requested", "checkpointing", "restoring", "done", "requeued", "rolled_back"] = "requested"
    created_at: float = 0.0
    updated_at: float = 0.0
    steps: dict[str, float] = {}  # step → when it was seen (requested, checkpointing, restoring, placed, running)
    error: str = ""
    cost_gpu_s: float = 0.0  # the planner's estimate: checkpoint + restore time x GPUs
    gain_gpu_s: float = 0.0
    segment: int = 0  # consolidation: the segment the job runs with on the target (0: its layout as it was)


class MigrationEvent(msgspec.Struct, tag="migration.event", kw_only=True, frozen=True):
    """migration → anyone, on `names.migration_events`: a move reached a step (the record after it)."""

    record: MigrationRecord
    at: float


Event = Committed | Rejected | Released | RankStarted | RankExited | NodeChanged | JobEvent | MigrationEvent


# -- fault plans (the sim backend's scripted faults; a file: strict) -----------------------------------------


class Fault(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One scripted fault of a simulated fleet (RACKSCALE_FAULT_PLAN: a YAML/JSON list of these).

    Target: `node` or `domain` (every node of it), and `gpu` (one GPU; unset: every GPU of the target).
    `at`: seconds after the agent starts, on the agent's (injected) clock. `for_s`: the fault ends after
    this long (unset: it lasts). Effects (at least one):
      xid: raise this XID once (79 "fell off the bus" also makes the GPU lost from then on);
      lost: the GPU falls off the bus; silent: the node stops heartbeats and telemetry;
      hot_c: add this many degrees C; temp_c: pin the temperature at this value;
      nvlink_down: this many NVLink links go down; nvlink_errors_per_s: NVLink error counters grow this fast;
      ecc_uncorrected: this many uncorrectable ECC errors now; throttle: these throttle reasons are active;
      flap: the fault is on for `flap` samples, then off for `flap` samples, and so on (a flapping sensor).
    """

    at: NonNegative = 0.0
    node: str | None = None
    domain: str | None = None
    gpu: Annotated[int, msgspec.Meta(ge=0)] | None = None
    for_s: NonNegative | None = None
    xid: Annotated[int, msgspec.Meta(ge=1)] | None = None
    lost: bool = False
    silent: bool = False
    hot_c: float = 0.0
    temp_c: float | None = None
    nvlink_down: Annotated[int, msgspec.Meta(ge=0)] = 0
    nvlink_errors_per_s: NonNegative = 0.0
    ecc_uncorrected: Annotated[int, msgspec.Meta(ge=0)] = 0
    throttle: list[str] = []
    flap: Annotated[int, msgspec.Meta(ge=0)] = 0


class DeadLetter(msgspec.Struct, tag="dead.letter", kw_only=True, frozen=True):
    service: str
    subject: str
    error: str
    data: bytes
    at: float


class LogChunk(msgspec.Struct, tag="log.chunk", kw_only=True, frozen=True):
    """agent → anyone, on `names.job_log(job, attempt, rank)` (LOGS): the next lines a process wrote (stdout and
    stderr together), in order (shared/rank_log.py)."""

    job_id: str
    attempt: int
    rank: int  # the process's RANK (per GPU: one of the node's)
    node: str
    n: int  # the chunk's index in this process's log: 0, 1, 2, ...
    first_line: int  # the index of its first line in what the process wrote (dropped lines counted)
    text: str  # whole lines, each ending in "\n"
    dropped: int = 0  # lines the agent dropped just before these (the process wrote faster than they shipped)
    at: float = 0.0


# One decoder per union, built once.
JOB_INTAKE = msgspec.msgpack.Decoder(JobIntake)
ORDERS = msgspec.msgpack.Decoder(Order)
AGENT_COMMANDS = msgspec.msgpack.Decoder(AgentCommand)
AGENT_REPORTS = msgspec.msgpack.Decoder(AgentReport)
TELEMETRY = msgspec.msgpack.Decoder(TelemetryMessage)
EVENTS = msgspec.msgpack.Decoder(Event)
NODE_ADMIN = msgspec.msgpack.Decoder(NodeAdmin)
ADMIN_REPLY = msgspec.msgpack.Decoder(AdminReply)
DRY_RUN_REQUEST = msgspec.msgpack.Decoder(DryRunRequest)
DRY_RUN_REPLY = msgspec.msgpack.Decoder(DryRunReply)
LOG_CHUNK = msgspec.msgpack.Decoder(LogChunk)
JOB_RECORD = msgspec.msgpack.Decoder(JobRecord)
ALLOCATION_RECORD = msgspec.msgpack.Decoder(AllocationRecord)
NODE_RECORD = msgspec.msgpack.Decoder(NodeRecord)
MIGRATION_RECORD = msgspec.msgpack.Decoder(MigrationRecord)
RESERVATIONS = msgspec.msgpack.Decoder(Reservations)
USAGE_RUN = msgspec.msgpack.Decoder(UsageRun)
NODE_HEALTH_STATE = msgspec.msgpack.Decoder(NodeHealthState)
JOB_BODY_JSON = msgspec.json.Decoder(JobBody)

encode = msgspec.msgpack.Encoder().encode
