"""The one translation from an API job body (`schemas.JobBody`), or a job's record, to the core's `JobSpec`, and
to how its processes start (`schemas.Launch`)."""

from __future__ import annotations

import msgspec

from shared.core.arrays import parse_array, task_order
from shared.core.shape import JobSpec, Need, with_segment, with_size
from shared.schemas import ArrayTask, JobBody, JobRecord, JobState, Launch


def body_segments(body: JobBody) -> tuple[int, ...]:
    """The segment sizes the body accepts, preferred first (empty: no segments)."""
    seg = body.topology.segment
    if seg is None:
        return ()
    return (seg,) if isinstance(seg, int) else tuple(seg)


def job_spec(body: JobBody, job_id: str, submit_time: float = 0.0) -> JobSpec:
    """The scheduler plans with the user's estimate, or the simulated duration when there is none; never past
    the time limit (the job is stopped there), as Slurm's backfill plans with `--time`."""
    estimate = body.expected_runtime_s if body.expected_runtime_s is not None else body.duration_s
    if body.time_limit_s is not None:
        estimate = min(estimate, body.time_limit_s)
    segments = body_segments(body)
    return JobSpec(
        id=job_id,
        gpus=body.gpus,
        gpus_per_node=body.gpus_per_node,
        nvlink=Need(body.topology.nvlink),
        level=body.topology.level,
        segment=segments[0] if segments else None,
        fallback_segments=segments[1:],
        elastic=(body.min_gpus, body.gpus) if body.min_gpus is not None else None,
        exclusive=body.exclusive,
        priority=body.priority,
        tenant=body.tenant,
        checkpointable=body.checkpointable,
        expected_runtime_s=estimate,
        submit_time=submit_time,
    )


def record_spec(rec: JobRecord) -> JobSpec:
    """The core's view of a job record: its body, submitted when the queue accepted it. A job holding (or
    being given) GPUs is the rigid job of the layout its attempt got; a waiting one may take any of its
    segments again."""
    spec = job_spec(rec.spec, rec.id, submit_order(rec))
    laid_out = rec.state is not JobState.PENDING or rec.inflight_since is not None
    if not laid_out:
        return spec
    if rec.segment is not None:
        spec = with_segment(spec, rec.segment)
    if spec.elastic is not None and rec.allocation:  # the size it has
        spec = with_size(spec, sum(len(ng.gpus) for ng in rec.allocation))
    return spec


def launch_of(body: JobBody) -> Launch:
    """What every node's agent needs of the body to start the job's processes."""
    return Launch(
        env=dict(body.env),
        workdir=body.workdir,
        time_limit_s=body.time_limit_s,
        processes=body.processes,
        slurm_env=body.slurm_env,
        output=body.output,
        job_name=body.name,
    )


def submit_order(rec: JobRecord) -> float:
    """When the job counts as submitted, for ordering (listing, the cycle): its submit time, an array's tasks
    apart by index so that they list and start in index order."""
    return rec.submitted_at if rec.array_index is None else task_order(rec.submitted_at, rec.array_index)


def record_launch(rec: JobRecord) -> Launch:
    """`launch_of` the record's body, and for an array's task what its processes are told of the array."""
    launch = launch_of(rec.spec)
    if rec.array_index is None or rec.spec.array is None:
        return launch
    indices = parse_array(rec.spec.array).indices
    task = ArrayTask(
        array_id=rec.array_id, index=rec.array_index, count=len(indices), first=indices[0], last=indices[-1]
    )
    return msgspec.structs.replace(launch, array=task)
