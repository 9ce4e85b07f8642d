"""Arrays and dependencies at the gateway (what the queue does with them: services/queue/gate.py).

An array is accepted as one submit whose id names no job: its tasks are the jobs, `<id>_<index>`. A read of the
array's id answers 404 pointing at its tasks (`GET /v1/jobs?array=<id>`); a cancel of it cancels every task not
ended. A submit's dependency may only name jobs (or arrays) that exist and the caller may see: any other id is a
422 naming it, as Slurm refuses a dependency on an unknown job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from services.gateway.validation import ApiError
from shared.core.dependencies import parse_dependency
from shared.schemas import JobBody, JobRecord
from shared.store import Store


async def tasks(store: Store, array_id: str) -> tuple[list[str], list[JobRecord]]:
    """The array's task ids (none: no array has this id) and the records of those written so far."""
    ids = await store.array_task_ids(array_id)
    return ids, (await store.get_jobs(ids) if ids else [])


def not_a_job(array_id: str, ids: Sequence[str]) -> str:
    """The 404's words for a read of an array's id."""
    shown = f"{ids[0]} … {ids[-1]}" if len(ids) > 1 else ids[0]
    return (
        f"{array_id} is an array of {len(ids)} task(s), {shown}, not a job: list them with "
        f"GET /v1/jobs?array={array_id}, or read one as /v1/jobs/{array_id}_<index>"
    )


async def unknown_dependency(body: JobBody, exists: Callable[[str], Awaitable[bool]]) -> ApiError | None:
    """The 422 naming the first job the body's dependency names that doesn't exist (or isn't the caller's to
    see: its existence isn't told). The syntax is checked before (validation.check_array_and_dependency)."""
    for cond in parse_dependency(body.dependency):
        for job_id in cond.job_ids:
            if not await exists(job_id):
                return ApiError(422, f"dependency: {cond.kind}:{job_id} names no job (nor array) known", "dependency")
    return None
