"""Validation of API input, pure: bytes (and the current topology) in, a job or an `ApiError` out.

Two stages, both before anything touches the bus:
1. Syntax and types: `schemas.JOB_BODY_JSON` (strict: unknown fields rejected). Unparseable JSON or a
   non-object → 400; anything else → 422 naming the field from msgspec's error path.
2. Semantics: `shared.core.shape.request` against the registered topology (`shared.topology_view`, the
   one the queue schedules on), so the API and the scheduler give the same verdict in the same words.
   ShapeError fields are mapped onto the body's JSON paths ("segment" → "topology.segment").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from shared import launch
from shared.api import IDEMPOTENCY_KEY
from shared.core import JobSpec, Need, ShapeError, Topology, request, segments
from shared.core.arrays import ArraySyntaxError, parse_array
from shared.core.dependencies import DependencySyntaxError, parse_dependency
from shared.core.shape import check_elastic, check_segment_order
from shared.jobs import job_spec
from shared.output_path import OutputPatternError, check_output_pattern
from shared.schemas import ENV_TOTAL_MAX, JOB_BODY_JSON, JobBody

T = TypeVar("T")

# /openapi.json states the same pattern (shared.api.IDEMPOTENCY_KEY).
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY)


MAX_SEQ = 2**63 - 1  # the largest log position a follower may name as its Last-Event-ID (JetStream's are 64-bit)


def check_idempotency_key(key: str) -> ApiError | None:
    if _IDEMPOTENCY_KEY.match(key) is None:
        return ApiError(400, "Idempotency-Key must be 1-255 printable ASCII characters", "Idempotency-Key")
    return None


# msgspec appends the location of a bad value: "Expected `int` >= 1 - at `$.topology.segment`".
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
# ... and names a missing or unknown key in the message itself.
_KEY = re.compile(r"(?:missing required field|contains unknown field) `(?P<key>[^`]+)`")

# JobSpec attribute (ShapeError.field) → where it sits in the request body.
_BODY_FIELD = {"segment": "topology.segment", "nvlink": "topology.nvlink", "level": "topology.level"}


@dataclass(frozen=True, slots=True)
class ApiError:
    status: int
    error: str
    field: str | None = None


def error_field(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    """(dotted field path or None for the document root, message without the location suffix)."""
    text = str(exc)
    path: str | None = None
    m = _AT.search(text)
    if m:
        path = m.group("path") or None
        text = text[: m.start()]
    k = _KEY.search(text)
    if k:
        path = f"{path}.{k.group('key')}" if path else k.group("key")
    return path, text


def body_field(shape_field: str) -> str:
    return _BODY_FIELD.get(shape_field, shape_field)


def decode_json(data: bytes, decoder: msgspec.json.Decoder[T]) -> T | ApiError:
    """Strict decode of a request body: 400 when it isn't a JSON object, 422 naming the field otherwise."""
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as e:  # subclass of DecodeError: catch it first
        field, message = error_field(e)
        if field is None and not _is_object(data):
            return ApiError(400, f"the body must be a JSON object: {message}")
        return ApiError(422, f"{field}: {message}" if field else message, field)
    except msgspec.DecodeError as e:
        return ApiError(400, f"the body is not valid JSON: {e}")


def decode_job(data: bytes) -> JobBody | ApiError:
    """Stage 1 for POST /v1/jobs."""
    return decode_json(data, JOB_BODY_JSON)


def _is_object(data: bytes) -> bool:
    try:
        return isinstance(msgspec.json.decode(data), dict)
    except msgspec.DecodeError:
        return False


def static_checks(spec: JobSpec) -> None:
    """The shape rules that hold on any topology (same words as `shape.request`); raises ShapeError.

    Used while no node is registered: node sizes and domain sizes are unknown then, so the default
    gpus_per_node, cluster size, domain size and level names are NOT checked; the queue re-validates
    against the real topology and fails the job with the ShapeError's words if it can never fit.
    """
    nodes: int | None = None
    if spec.gpus_per_node is not None:
        if spec.gpus % spec.gpus_per_node:
            raise ShapeError("gpus", f"{spec.gpus} is not a multiple of gpus_per_node {spec.gpus_per_node}")
        nodes = spec.gpus // spec.gpus_per_node
    if spec.segment is not None:
        if spec.nvlink is Need.NONE:
            raise ShapeError("segment", "a segmented job needs topology nvlink required or preferred")
        check_segment_order(spec)
        for seg in segments(spec):
            if nodes is not None and nodes % seg:
                raise ShapeError("segment", f"{nodes} nodes is not a multiple of segment {seg}")
    check_elastic(spec, spec.gpus_per_node)


def check_launch(body: JobBody) -> ApiError | None:
    """The 422 naming the field when the body's launch settings can't start a process (shared/launch.py)."""
    for name, value in body.env.items():
        shown = name if len(name) <= 64 else name[:64] + "…"
        if not launch.valid_name(name):
            return ApiError(
                422, f"env.{shown}: not a variable name (letters, digits and _, not first a digit)", f"env.{shown}"
            )
        if launch.reserved(name):
            return ApiError(
                422, f"env.{shown}: set by the scheduler (the launch contract), not by a job", f"env.{shown}"
            )
        if "\0" in value:
            return ApiError(422, f"env.{shown}: a value may not hold a NUL character", f"env.{shown}")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in body.env.items())
    if size > ENV_TOTAL_MAX:
        return ApiError(422, f"env: {size} bytes of names and values, at most {ENV_TOTAL_MAX}", "env")
    if body.workdir and (not body.workdir.startswith("/") or "\0" in body.workdir):
        return ApiError(422, "workdir: an absolute path (or empty: the agent's own)", "workdir")
    if body.output:
        try:
            check_output_pattern(body.output)
        except OutputPatternError as e:
            return ApiError(422, f"output: {e}", "output")
    return check_array_and_dependency(body)


def check_array_and_dependency(body: JobBody) -> ApiError | None:
    """The 422 naming `array` or `dependency` when its Slurm-syntax value doesn't parse."""
    try:
        if body.array is not None:
            parse_array(body.array)
    except ArraySyntaxError as e:
        return ApiError(422, f"array: {body.array!r} {e}", "array")
    try:
        parse_dependency(body.dependency)
    except DependencySyntaxError as e:
        return ApiError(422, f"dependency: {e}", "dependency")
    return None


def check_job(body: JobBody, job_id: str, topology: Topology | None) -> JobSpec | ApiError:
    """Stage 2: the body's JobSpec, or the 422 naming the field when its launch settings are unusable or its
    shape can never be placed on `topology` (the one the queue schedules on, `shared.topology_view`); None
    means no node is registered yet (static checks only)."""
    if (bad := check_launch(body)) is not None:
        return bad
    spec = job_spec(body, job_id)
    try:
        if topology is None:
            static_checks(spec)
        else:
            request(spec, topology)
    except ShapeError as e:
        field = body_field(e.field)
        return ApiError(422, f"{field}: {e.message}", field)
    return spec
