"""Every message and record, as msgspec Structs with explicit dotted tags. Defined once, here.

Rules: every field added later gets a default (old messages still decode); bus messages are one tagged
union per subject family with one Decoder built once; `forbid_unknown_fields` only on external input
(the HTTP API), so services of different versions can talk.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

import msgspec

# -- API input (external: strict) --------------------------------------------------------------------------

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class TopologyBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    nvlink: Literal["required", "preferred", "none"] = "required"
    segment: Positive | None = None
    level: Name = "domain"


class JobBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """POST /v1/jobs."""

    name: Name
    tenant: Name
    gpus: Positive
    gpus_per_node: Positive | None = None
    topology: TopologyBody = TopologyBody()
    priority: Annotated[int, msgspec.Meta(ge=-1000, le=1000)] = 0
    checkpointable: bool = False
    exclusive: bool = False
    command: Annotated[list[str], msgspec.Meta(max_length=256)] = []
    duration_s: NonNegative = 60.0  # how long a simulated agent runs it
    expected_runtime_s: NonNegative | None = None  # the user's estimate; defaults to duration_s
    on_node_failure: Literal["requeue", "fail"] = "requeue"


class NodeAdmin(msgspec.Struct, kw_only=True, frozen=True):
    """gateway → inventory (request/reply): drain or undrain a node."""

    node: str
    action: Literal["drain", "undrain"]
    reason: str = ""


class AdminReply(msgspec.Struct, kw_only=True, frozen=True):
    ok: bool
    error: str = ""
    state: str = ""


# -- records in Redis --------------------------------------------------------------------------------------


class JobState(StrEnum):
    PENDING = "pending"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class NodeGpus(msgspec.Struct, frozen=True, array_like=True):
    node: str
    gpus: list[int]


class JobRecord(msgspec.Struct, kw_only=True):
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
    allocation: list[NodeGpus] = []
    domains: list[str] = []
    exit_codes: dict[str, int] = {}  # "node/rank" → exit code
    started_ranks: list[int] = []
    inflight_since: float | None = None  # a PlaceOrder is out for this attempt
    trace: str = ""  # traceparent of the submit, so later hops join the job's trace


class AllocationRecord(msgspec.Struct, kw_only=True, frozen=True):
    """What placement keeps per job holding GPUs (key `alloc:{id}`)."""

    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    committed_at: float


class NodeRecord(msgspec.Struct, kw_only=True):
    """What inventory keeps per node (key `node:{name}`)."""

    name: str
    domain: str
    clique: int = 0
    gpus: int = 4
    gpu_health: dict[str, str] = {}  # GPU index → "degraded" | "down"; absent means ok
    state: Literal["up", "draining", "down"] = "up"
    drained: bool = False  # an operator's drain survives the node going down and up
    reason: str = ""
    last_heartbeat: float = 0.0
    backend: str = "sim"
    leaf: str | None = None


# -- bus messages ------------------------------------------------------------------------------------------


class JobSubmitted(msgspec.Struct, tag="job.submitted", kw_only=True, frozen=True):
    job_id: str
    spec: JobBody
    submitted_at: float


class JobCancel(msgspec.Struct, tag="job.cancel", kw_only=True, frozen=True):
    job_id: str
    at: float
    reason: str = "cancelled by user"


JobIntake = JobSubmitted | JobCancel


class PlaceOrder(msgspec.Struct, tag="order.place", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    master_addr: str
    command: list[str]
    duration_s: float
    decided_at: float


class ReleaseOrder(msgspec.Struct, tag="order.release", kw_only=True, frozen=True):
    """Free a job's GPUs now and stop its ranks (cancel, preemption, end, node failure)."""

    job_id: str
    reason: str
    checkpoint: bool = False


Order = PlaceOrder | ReleaseOrder


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


class StopRank(msgspec.Struct, tag="agent.stop", kw_only=True, frozen=True):
    job_id: str
    node: str
    reason: str
    checkpoint: bool = False


AgentCommand = StartRank | StopRank


class GpuReport(msgspec.Struct, kw_only=True, frozen=True):
    index: int
    uuid: str = ""
    health: Literal["ok", "degraded", "down"] = "ok"


class AgentRegister(msgspec.Struct, tag="agent.register", kw_only=True, frozen=True):
    node: str
    cluster_uuid: str
    clique_id: int
    gpus: list[GpuReport]
    backend: str = "sim"
    leaf: str | None = None
    at: float = 0.0


class Heartbeat(msgspec.Struct, tag="agent.heartbeat", kw_only=True, frozen=True):
    node: str
    at: float
    running: list[str] = []  # job ids with a live rank on the node
    gpus: list[GpuReport] = []


AgentReport = AgentRegister | Heartbeat


class Committed(msgspec.Struct, tag="placement.committed", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    nodes: list[NodeGpus]
    at: float


class Rejected(msgspec.Struct, tag="placement.rejected", kw_only=True, frozen=True):
    job_id: str
    attempt: int
    reason: str
    at: float


class Released(msgspec.Struct, tag="placement.released", kw_only=True, frozen=True):
    job_id: str
    reason: str
    at: float


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


class NodeChanged(msgspec.Struct, tag="node.changed", kw_only=True, frozen=True):
    node: str
    state: Literal["up", "draining", "down"]
    reason: str
    at: float


class JobEvent(msgspec.Struct, tag="job.event", kw_only=True, frozen=True):
    """One transition of a job's state machine; the stream of these is the job's audit log."""

    job_id: str
    state: JobState
    reason: str
    at: float
    attempt: int = 0
    nodes: list[NodeGpus] = []
    tenant: str = ""


Event = Committed | Rejected | Released | RankStarted | RankExited | NodeChanged | JobEvent


class DeadLetter(msgspec.Struct, tag="dead.letter", kw_only=True, frozen=True):
    service: str
    subject: str
    error: str
    data: bytes
    at: float


# One decoder per union, built once.
JOB_INTAKE = msgspec.msgpack.Decoder(JobIntake)
ORDERS = msgspec.msgpack.Decoder(Order)
AGENT_COMMANDS = msgspec.msgpack.Decoder(AgentCommand)
AGENT_REPORTS = msgspec.msgpack.Decoder(AgentReport)
EVENTS = msgspec.msgpack.Decoder(Event)
NODE_ADMIN = msgspec.msgpack.Decoder(NodeAdmin)
ADMIN_REPLY = msgspec.msgpack.Decoder(AdminReply)
JOB_RECORD = msgspec.msgpack.Decoder(JobRecord)
ALLOCATION_RECORD = msgspec.msgpack.Decoder(AllocationRecord)
NODE_RECORD = msgspec.msgpack.Decoder(NodeRecord)
JOB_BODY_JSON = msgspec.json.Decoder(JobBody)

encode = msgspec.msgpack.Encoder().encode
