"""The launch contract: the environment every process of a job starts with, the same on every agent.

Pure: a `StartRank` (one node's share of an attempt) and the process's index on its node in, variables out.
The agents (simulated and NVML) call `process_env`; docs/launch.md's table is `contract_table()`'s output, and a
job body may not set any name the contract sets (`reserved`).

A job runs one process per node (`per_node`, torchrun style: the node's process starts its own workers and
sees every GPU of the node) or one per GPU (`per_gpu`, srun style: each process still sees every GPU of its
node and picks its own by `LOCAL_RANK`, so NCCL can use NVLink between them). Global ranks count node by node
in the allocation's order: a node's processes get consecutive ranks after those of the nodes before it.

When every node of the attempt lies in one NVLink domain, the job is told so (`RACKSCALE_NVLINK_DOMAIN`) and
NCCL is asked to use multi-node NVLink (`NCCL_MNNVL_ENABLE=1`, NCCL 2.21+; a job's own `env` may override it).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shared.schemas import NodeGpus, StartRank

MASTER_PORT_BASE = 20_000  # below Linux's ephemeral range (32768-60999): a listener there rarely collides
MASTER_PORT_SPAN = 10_000
MASTER_PORT_LAST = MASTER_PORT_BASE + MASTER_PORT_SPAN - 1


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    meaning: str


CONTRACT: tuple[Variable, ...] = (
    Variable("RANK", "the process's rank in the job: 0 … WORLD_SIZE-1, node by node"),
    Variable("WORLD_SIZE", "processes in the job: one per node (`per_node`) or one per GPU (`per_gpu`)"),
    Variable("LOCAL_RANK", "the process's index on its node (always 0 with `per_node`)"),
    Variable("LOCAL_WORLD_SIZE", "processes on this node"),
    Variable("NODE_RANK", "the node's index in the allocation: 0 … NNODES-1"),
    Variable("NNODES", "nodes in the allocation"),
    Variable("GPUS_PER_NODE", "GPUs allocated on this node"),
    Variable("MASTER_ADDR", "node 0's name: rank 0 listens there"),
    Variable("MASTER_PORT", f"a port chosen per job and attempt ({MASTER_PORT_BASE}-{MASTER_PORT_LAST})"),
    Variable("CUDA_VISIBLE_DEVICES", "this node's allocated GPUs"),
    Variable("RACKSCALE_JOB_ID", "the job's id"),
    Variable("RACKSCALE_ATTEMPT", "the attempt: 1 for the first run, one more for each requeue or move"),
    Variable("RACKSCALE_NODE", "this node's name"),
    Variable("RACKSCALE_NODELIST", "the allocation's nodes in order, a compressed hostlist (`d00-n[00-03]`)"),
    Variable("RACKSCALE_DOMAIN", "this node's NVLink domain"),
    Variable("RACKSCALE_SEGMENT", "this node's segment: its group of `topology.segment` nodes (0 without)"),
    Variable("RACKSCALE_NVLINK_DOMAIN", "the domain every node of the job is in, if they share one (else unset)"),
    Variable("RACKSCALE_RESTORE", "the checkpoint to resume from; set but empty for a fresh start"),
    # a task of an array (`"array": "0-99%8"`) is told its array; unset for any other job
    Variable("RACKSCALE_ARRAY_JOB_ID", "an array task's array: the submit's id (the task's own is `<that>_<index>`)"),
    Variable("RACKSCALE_ARRAY_TASK_ID", "an array task's index"),
    Variable("RACKSCALE_ARRAY_TASK_COUNT", "tasks in the array"),
    Variable("RACKSCALE_ARRAY_TASK_MIN", "the array's lowest index"),
    Variable("RACKSCALE_ARRAY_TASK_MAX", "the array's highest index"),
)
ARRAY_VARIABLES = tuple(v.name for v in CONTRACT if v.name.startswith("RACKSCALE_ARRAY_"))

# Scripts written for Slurm (`slurm_env: true`): the same facts under Slurm's names.
SLURM_ALIASES: tuple[tuple[str, str], ...] = (
    ("SLURM_JOB_ID", "RACKSCALE_JOB_ID"),
    ("SLURM_PROCID", "RANK"),
    ("SLURM_LOCALID", "LOCAL_RANK"),
    ("SLURM_NTASKS", "WORLD_SIZE"),
    ("SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE"),
    ("SLURM_NODEID", "NODE_RANK"),
    ("SLURM_NNODES", "NNODES"),
    ("SLURM_JOB_NUM_NODES", "NNODES"),
    ("SLURM_JOB_NODELIST", "RACKSCALE_NODELIST"),
    ("SLURM_NODELIST", "RACKSCALE_NODELIST"),
    ("SLURM_GPUS_ON_NODE", "GPUS_PER_NODE"),
    ("SLURMD_NODENAME", "RACKSCALE_NODE"),
    # an array task's only
    ("SLURM_ARRAY_JOB_ID", "RACKSCALE_ARRAY_JOB_ID"),
    ("SLURM_ARRAY_TASK_ID", "RACKSCALE_ARRAY_TASK_ID"),
    ("SLURM_ARRAY_TASK_COUNT", "RACKSCALE_ARRAY_TASK_COUNT"),
    ("SLURM_ARRAY_TASK_MIN", "RACKSCALE_ARRAY_TASK_MIN"),
    ("SLURM_ARRAY_TASK_MAX", "RACKSCALE_ARRAY_TASK_MAX"),
)

NCCL_HINTS = ("NCCL_MNNVL_ENABLE",)  # set by the contract, but a job's own env may override them

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def reserved(name: str) -> bool:
    """Whether the contract sets `name` (a job's env may not)."""
    return name in _RESERVED or name.startswith(("RACKSCALE_", "SLURM_"))


_RESERVED = frozenset(v.name for v in CONTRACT) | frozenset(a for a, _ in SLURM_ALIASES) | {"SLURMD_NODENAME"}


def valid_name(name: str) -> bool:
    return bool(_NAME.match(name))


def master_port(job_id: str, attempt: int) -> int:
    """The same on every node (no agent asks another); a new attempt gets another (the old listener may linger)."""
    return MASTER_PORT_BASE + zlib.crc32(f"{job_id}:{attempt}".encode()) % MASTER_PORT_SPAN


def hostlist(names: Iterable[str]) -> str:
    """Slurm's compressed hostlist, order kept: ["d00-n00", "d00-n01", "d00-n03", "d01-n00"] →
    "d00-n[00-01,03],d01-n00". A name without a trailing number stands alone."""
    groups: list[tuple[str, int, list[int]]] = []  # (prefix, digits, numbers), consecutive names only
    for name in names:
        m = re.match(r"^(.*?)(\d+)$", name)
        if m is None:
            groups.append((name, -1, []))
            continue
        prefix, digits = m.group(1), m.group(2)
        last = groups[-1] if groups else None
        if last is not None and last[0] == prefix and last[1] == len(digits):
            last[2].append(int(digits))
        else:
            groups.append((prefix, len(digits), [int(digits)]))
    out = []
    for prefix, width, numbers in groups:
        if width < 0:
            out.append(prefix)
        elif len(numbers) == 1:
            out.append(f"{prefix}{numbers[0]:0{width}d}")
        else:
            out.append(f"{prefix}[{','.join(_runs(numbers, width))}]")
    return ",".join(out)


def _runs(numbers: Sequence[int], width: int) -> list[str]:
    runs: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        runs.append(f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}")
        if n is not None:
            start = prev = n
    return runs


def processes_on(cmd: StartRank) -> int:
    """How many processes this node starts for the attempt."""
    return len(cmd.gpus) if cmd.launch.processes == "per_gpu" else 1


def _nodes(cmd: StartRank) -> list[NodeGpus]:
    # a StartRank from before the whole allocation rode along names only its own node: one node of world_size
    return cmd.nodes or [NodeGpus(cmd.node, cmd.gpus)]


def _ranks(cmd: StartRank) -> tuple[int, int]:
    """(processes on the nodes before this one, processes in the job)."""
    if cmd.nodes:
        counts = [len(ng.gpus) if cmd.launch.processes == "per_gpu" else 1 for ng in cmd.nodes]
        return sum(counts[: cmd.rank]), sum(counts)
    # a StartRank from before the whole allocation rode along: the other nodes taken to be like this one
    return cmd.rank * processes_on(cmd), cmd.world_size * processes_on(cmd)


def global_rank(cmd: StartRank, local_rank: int = 0) -> int:
    """The RANK of this node's `local_rank`th process."""
    return _ranks(cmd)[0] + local_rank


def process_env(cmd: StartRank, local_rank: int = 0) -> dict[str, str]:
    """The contract's variables for one process (`local_rank` on this node), hints and the job's env included;
    the caller puts them over the agent's own environment."""
    nodes = _nodes(cmd)
    node_rank = cmd.rank
    before, world = _ranks(cmd)
    domains = list(cmd.domains) or [""] * len(nodes)
    domain = domains[node_rank] if node_rank < len(domains) else ""
    shared_domain = domains[0] if domains and all(d and d == domains[0] for d in domains) else ""
    env: dict[str, str] = {}
    if shared_domain:
        env["NCCL_MNNVL_ENABLE"] = "1"
    env.update(cmd.launch.env)  # over the hints, under the contract (validated: the contract's names aren't in it)
    contract = {
        "RANK": str(before + local_rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(processes_on(cmd)),
        "NODE_RANK": str(node_rank),
        "NNODES": str(len(nodes) if cmd.nodes else cmd.world_size),
        "GPUS_PER_NODE": str(len(cmd.gpus)),
        "MASTER_ADDR": cmd.master_addr,
        "MASTER_PORT": str(cmd.master_port or master_port(cmd.job_id, cmd.attempt)),
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in cmd.gpus),
        "RACKSCALE_JOB_ID": cmd.job_id,
        "RACKSCALE_ATTEMPT": str(cmd.attempt),
        "RACKSCALE_NODE": cmd.node,
        "RACKSCALE_NODELIST": hostlist(ng.node for ng in nodes),
        "RACKSCALE_DOMAIN": domain,
        "RACKSCALE_SEGMENT": str(cmd.segments[node_rank]) if node_rank < len(cmd.segments) else "0",
        "RACKSCALE_RESTORE": cmd.restore,
    }
    if shared_domain:
        contract["RACKSCALE_NVLINK_DOMAIN"] = shared_domain
    task = cmd.launch.array
    if task is not None:
        contract.update(
            zip(ARRAY_VARIABLES, map(str, (task.array_id, task.index, task.count, task.first, task.last)), strict=True)
        )
    env.update(contract)
    if cmd.launch.slurm_env:
        env.update({alias: contract[name] for alias, name in SLURM_ALIASES if name in contract})
        env["SLURM_RESTART_COUNT"] = str(max(0, cmd.attempt - 1))
    return env


def contract_table(variables: Sequence[Variable] = CONTRACT) -> str:
    """docs/launch.md's table (a test checks the page carries it as generated here)."""
    rows = [f"| `{v.name}` | {v.meaning} |" for v in variables]
    return "\n".join(["| variable | meaning |", "| --- | --- |", *rows])


def merged_env(base: Mapping[str, str], cmd: StartRank, local_rank: int = 0) -> dict[str, str]:
    """`base` (the agent's environment) with the process's variables over it."""
    return {**base, **process_env(cmd, local_rank)}
