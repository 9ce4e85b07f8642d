"""The one translation from an API job body (`schemas.JobBody`), or a job's record, to the core's `JobSpec`."""

from __future__ import annotations

from shared.core.shape import JobSpec, Need
from shared.schemas import JobBody, JobRecord


def job_spec(body: JobBody, job_id: str, submit_time: float = 0.0) -> JobSpec:
    """The scheduler plans with the user's estimate, or the simulated duration when there is none."""
    return JobSpec(
        id=job_id,
        gpus=body.gpus,
        gpus_per_node=body.gpus_per_node,
        nvlink=Need(body.topology.nvlink),
        level=body.topology.level,
        segment=body.topology.segment,
        exclusive=body.exclusive,
        priority=body.priority,
        tenant=body.tenant,
        checkpointable=body.checkpointable,
        expected_runtime_s=body.expected_runtime_s if body.expected_runtime_s is not None else body.duration_s,
        submit_time=submit_time,
    )


def record_spec(rec: JobRecord) -> JobSpec:
    """The core's view of a job record: its body, submitted when the queue accepted it."""
    return job_spec(rec.spec, rec.id, rec.submitted_at)
