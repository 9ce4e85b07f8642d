"""POST /v1/jobs bodies that are job files: YAML (`application/yaml`) and sbatch scripts (`text/x-shellscript`).

Read by the one reader (shared/jobfile/), then decoded exactly as a JSON body is (`validation.decode_job`, the
strict decoder). Whatever is wrong answers as a JSON submit's would — 400 when the file can't be read as a body
(not UTF-8, not YAML, not a mapping), 422 naming the field otherwise — with the file's line in front: `line 7: ...`.
Any other content type is JSON, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from services.gateway.validation import ApiError, decode_job
from shared.jobfile import (
    SCRIPT_TYPES,
    YAML_TYPES,
    JobFile,
    JobFileError,
    load_script_text,
    load_yaml_text,
    parse_script,
    parse_yaml,
)
from shared.jobfile.errors import where
from shared.schemas import JobBody

SCHEMA_PATH = "/v1/schemas/job.json"  # the body's JSON Schema (shared/jobfile/schema.py), public as /openapi.json is


@dataclass(frozen=True, slots=True)
class Submission:
    """A submitted body, decoded; `file`: the job file it came from (None for JSON), to say where a field was."""

    body: JobBody
    file: JobFile | None = None

    def located(self, e: ApiError) -> ApiError:
        return located(e, self.file)


def located(e: ApiError, file: JobFile | None) -> ApiError:
    """`e` with the line of the file that set its field in front (when a file did)."""
    if file is None:
        return e
    return ApiError(e.status, where(file.line_of(e.field)) + e.error, e.field)


def decode_submission(data: bytes, content_type: str, tenant: str = "") -> Submission | ApiError:
    """The body of POST /v1/jobs in any of its forms. `tenant`: a script's when it names no --account (the
    caller's token's; "" in open mode: then the script must name one)."""
    if content_type in YAML_TYPES:
        try:
            file = parse_yaml(load_yaml_text(data))
        except JobFileError as e:
            return ApiError(400, str(e), e.field)
    elif content_type in SCRIPT_TYPES:
        try:
            text = load_script_text(data)
        except JobFileError as e:
            return ApiError(400, str(e))
        try:
            file = parse_script(text, defaults={"tenant": tenant} if tenant else None)
        except JobFileError as e:
            return ApiError(422, str(e), e.field)
    else:
        body = decode_job(data)
        return body if isinstance(body, ApiError) else Submission(body)
    try:
        encoded = msgspec.json.encode(file.body)
    except (msgspec.EncodeError, OverflowError, TypeError) as e:
        return ApiError(422, f"a value JSON can't carry: {e}")
    decoded = decode_job(encoded)
    if isinstance(decoded, ApiError):
        return located(decoded, file)
    return Submission(decoded, file)
