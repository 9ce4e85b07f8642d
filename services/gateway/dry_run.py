"""`POST /v1/jobs?dry_run=true`: where a job would go if it were submitted now.

The body is checked exactly as a submit's (the same 4xx answers); then the queue leader is asked over NATS
(`names.dry_run`, request/reply: `DryRunRequest` → `DryRunReply`) and decides with its next cycle's own decision on
its current state (services/queue/dry_run.py). Nothing is stored or published: the job doesn't exist afterwards.
No leader answering (none, or a view being rebuilt) is a 503.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec
import nats.errors
from aiohttp import web

from services.gateway import views
from services.gateway.validation import ApiError, check_idempotency_key
from shared import api
from shared.schemas import DRY_RUN_REPLY, DryRunReply, DryRunRequest, JobBody

if TYPE_CHECKING:
    from services.gateway.service import Gateway

log = logging.getLogger("rackscale.gateway")

PARAM = "dry_run"
TIMEOUT_S = 5.0  # how long the queue leader may take: it runs a cycle (and an estimate) for the answer
_FLAG = {"true": True, "1": True, "false": False, "0": False}


def asked(query: Mapping[str, str]) -> bool | ApiError:
    """Whether the query asks for a dry run (`dry_run=true` or `1`), or the 422 naming a value that is neither."""
    value = query.get(PARAM)
    if value is None:
        return False
    flag = _FLAG.get(value.lower())
    if flag is None:
        return ApiError(422, f"{PARAM}: must be true, false, 1 or 0, got {value!r}", PARAM)
    return flag


def view_of(reply: DryRunReply, domain_of: Mapping[str, str]) -> api.DryRunView:
    return api.DryRunView(
        start=reply.start,
        allocation=views.placed(reply.allocation, domain_of),
        domains=list(reply.domains),
        gpus=reply.gpus,
        segment=reply.segment,
        forecast_start=reply.forecast_start,
        reason=reply.reason,
        reserved=reply.reserved,
        preempts=reply.preempts,
        shrinks=reply.shrinks,
    )


async def answer(gw: Gateway, request: web.Request, body: JobBody) -> api.DryRunView | ApiError:
    """The queue leader's answer for the body (already decoded, its tenant allowed), or the error to give."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and (bad := check_idempotency_key(key)) is not None:
        return bad  # as a submit would answer (a dry run names no job: the key is not looked up)
    job_id = uuid.uuid4().hex  # a fresh id, as a submit without a key gets: ties in the queue's order go by id
    checked = await gw.checked_job(body, job_id)
    if isinstance(checked, ApiError):
        return checked
    ask = DryRunRequest(job_id=job_id, spec=body, submitted_at=gw.now())
    deps = gw.deps
    try:
        raw = await deps.bus.request(deps.names.dry_run, ask, timeout=TIMEOUT_S)
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return ApiError(503, "no queue leader answered the dry run (none is running, or it is busy); try again")
    try:
        reply = DRY_RUN_REPLY.decode(raw)
    except msgspec.DecodeError:
        log.error("unreadable DryRunReply: %r", raw[:200])
        return ApiError(503, "the queue leader sent an unreadable reply")
    if not reply.ok:
        return ApiError(503, reply.error or "the queue leader could not decide; try again")
    return view_of(reply, await gw.domain_of())
