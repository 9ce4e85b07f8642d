"""The OpenAPI 3.2 document served at /openapi.json (3.2: event streams are typed, event by event).

Schemas come from the msgspec Structs themselves (`msgspec.json.schema_components`), so the JobBody
schema is exactly what the decoder accepts. Operations are written out here; a unit test checks that
they and the aiohttp routes name the same (method, path) pairs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from services.gateway import dashboard
from services.gateway.auth import PUBLIC_PATHS, QUERY_TOKEN, SCHEME
from services.gateway.jobfiles import SCHEMA_PATH
from services.gateway.validation import IDEMPOTENCY_KEY, MAX_SEQ
from shared import api, sse
from shared.jobfile import SCRIPT, SCRIPT_MAX_BYTES, YAML
from shared.jobfile.schema import described
from shared.schemas import JobBody, JobEvent, JobState, NodeChanged

REF = "#/components/schemas/{name}"
API_VERSION = "1.0.0"

_SCHEMA_TYPES: tuple[Any, ...] = (
    JobBody,
    api.Accepted,
    api.JobView,
    api.DryRunView,
    api.JobList,
    api.MigrationList,
    api.UsageView,
    api.ClusterView,
    api.CellSummary,
    api.DrainBody,
    api.NodeAdminResult,
    api.ErrorBody,
    api.Health,
    JobEvent,
    NodeChanged,
    api.LogLine,
    api.LogEnd,
)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def _json(schema: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


def _error(description: str) -> dict[str, Any]:
    return _json("ErrorBody", description)


def _events(kinds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An event stream (OpenAPI 3.2: `itemSchema` describes each event). `kinds`: event name → the schema of its
    `data`, one line of JSON. Comments (`: connected`, `: keep-alive`) are not events."""
    return {
        sse.MEDIA_TYPE: {
            "itemSchema": {
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"enum": list(kinds)},
                    "data": {"type": "string"},
                    "id": {"type": "string"},
                    "retry": {"type": "integer", "minimum": 0},
                },
                "oneOf": [
                    {
                        "properties": {
                            "event": {"const": kind},
                            "data": {"contentMediaType": "application/json", "contentSchema": schema},
                        }
                    }
                    for kind, schema in kinds.items()
                ],
            }
        }
    }


_JOB_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "job id"}
_NODE_ID = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}, "description": "node name"}
_IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": IDEMPOTENCY_KEY},
    "description": "Retries with the same key (per tenant) name the same job and are accepted once. Printable "
    "ASCII. The same key with another job's body answers 422.",
}
_LIST_PARAMS = [
    {"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "state", "in": "query", "required": False, "schema": _ref("JobState")},
    {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0, "default": 0}},
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": api.MAX_PAGE, "default": api.DEFAULT_PAGE},
    },
]


def _admin(action: str, op: str = "", summary: str = "") -> dict[str, Any]:
    return {
        "operationId": op or f"{action}Node",
        "summary": summary or f"{action.capitalize()} a node (asks inventory)",
        "tags": ["nodes"],
        "parameters": [_NODE_ID],
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": _ref("DrainBody")}},
        },
        "responses": {
            "200": _json("NodeAdminResult", "the node's state after the change"),
            "400": _error("body is not a JSON object"),
            "403": _error("not an admin token"),
            "404": _error("unknown node"),
            "409": _error("inventory refused the change"),
            "422": _error("invalid body"),
            "503": _error("inventory did not answer"),
        },
    }


EXAMPLE_SCRIPT = """#!/bin/bash
#SBATCH --job-name=hello --nodes=1 --gpus-per-node=4 --time=10
#RACKSCALE --duration=1
echo "rank $RANK of $WORLD_SIZE on $RACKSCALE_NODE"
"""

OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/v1/jobs"): {
        "operationId": "submitJob",
        "summary": "Submit a job (with `dry_run`: where it would go now, without submitting it)",
        "description": "The body is a JobBody as JSON, the same as YAML (`application/yaml`), or an sbatch script "
        "(`text/x-shellscript`): its `#SBATCH` and `#RACKSCALE` lines say what the job needs and the script becomes "
        "its command (docs/jobs.md). A script without `--account` is the token's tenant's. Errors in a YAML body or "
        f"a script name the file's line: `line 7: ...`. A script is at most {SCRIPT_MAX_BYTES} bytes. "
        "With `dry_run=true` (or `1`) the body is checked as a submit's (the same errors), then the "
        "queue leader answers where the job would start now, or when and why it would wait (DryRunView), by its next "
        "cycle's own decision on its current state. Nothing is stored or published: the job doesn't exist afterwards. "
        "With `array` (Slurm's --array: `0-99%8`) one submit is an array of tasks, jobs `<id>_<index>` "
        "that differ only in their index (RACKSCALE_ARRAY_TASK_ID), at most `%N` of them running at once; its id "
        "names no job (its tasks: `GET /v1/jobs?array=<id>`; a cancel of it cancels every task). With `dependency` "
        "(Slurm's: `afterok:ID:ID,afterany:ID,afternotok:ID,singleton`) the job waits until it holds; every ID "
        "must name a job or an array that exists (else 422), and a dependency that can never be met cancels the "
        "job with the reason.",
        "tags": ["jobs"],
        "parameters": [
            _IDEMPOTENCY_KEY,
            {
                "name": "dry_run",
                "in": "query",
                "required": False,
                "schema": {"type": "string", "enum": ["true", "false", "1", "0"]},
                "description": "true or 1: answer where the job would go (200 DryRunView) instead of submitting it",
            },
        ],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _ref("JobBody")},
                YAML: {"schema": _ref("JobBody")},
                SCRIPT: {"schema": {"type": "string", "maxLength": SCRIPT_MAX_BYTES}, "example": EXAMPLE_SCRIPT},
            },
        },
        "responses": {
            "202": _json("Accepted", "accepted: the job (or every task of the array) is pending"),
            "200": {
                "description": "a dry run: where the job would go (DryRunView); or an earlier submit with this "
                "Idempotency-Key: the job as it is now (JobView; an array's retried submit answers 202 again)",
                "content": {"application/json": {"schema": {"anyOf": [_ref("DryRunView"), _ref("JobView")]}}},
            },
            "400": _error("not JSON (or YAML, or UTF-8 text), not an object, or a bad Idempotency-Key"),
            "403": _error("a user token submitting for another tenant"),
            "413": {"description": "body larger than 1 MiB"},
            "422": _error(
                "invalid job or dry_run value; `field` names the offending input (and a job file's line starts `error`)"
            ),
            "503": _error("the bus or Redis is unavailable; for a dry run, no queue leader answered"),
        },
    },
    ("get", "/v1/jobs"): {
        "operationId": "listJobs",
        "summary": "List jobs in submit order (an array's tasks with `array`, in index order)",
        "tags": ["jobs"],
        "parameters": [
            *_LIST_PARAMS,
            {
                "name": "array",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "only this array's tasks (the id its submit answered), in index order",
            },
        ],
        "responses": {"200": _json("JobList", "one page of jobs"), "422": _error("bad filter or page")},
    },
    ("get", "/v1/jobs/{id}"): {
        "operationId": "getJob",
        "summary": "Read a job (also after it ended)",
        "tags": ["jobs"],
        "parameters": [_JOB_ID],
        "responses": {
            "200": _json("JobView", "the job"),
            "404": _error("unknown job, or another tenant's; for an array's id, where its tasks are listed"),
            "503": _error("the job is not recorded yet (Retry-After), or a backend is unavailable"),
        },
    },
    ("delete", "/v1/jobs/{id}"): {
        "operationId": "cancelJob",
        "summary": "Cancel a job; an array's id cancels every task of it not ended",
        "tags": ["jobs"],
        "parameters": [_JOB_ID],
        "responses": {
            "202": _json("Accepted", "the cancel is on its way (state: cancelling)"),
            "404": _error("unknown job, or another tenant's"),
            "409": _error("the job (every task of the array) already ended"),
            "503": _error("the bus is unavailable"),
        },
    },
    ("get", "/v1/jobs/{id}/logs"): {
        "operationId": "getJobLogs",
        "summary": "What a job's processes wrote (stdout and stderr), as text; with `follow`, as events while it ships",
        "description": "Lines of an attempt (default the latest), in the order they shipped. Without `rank` each "
        "text line starts with `<rank>: `. Missing lines are marked: `[rackscale: N lines dropped: ...]`. Kept a "
        "week at most, the newest 1,024 chunks (at most 16 MiB) a process. With `follow=true` the answer is "
        "server-sent events: `line` (LogLine) for each line, the lines so far first, then as they ship; `end` "
        "(LogEnd) once the job has ended and its last lines were sent, and the stream closes. A `line` event's "
        "`id` is its place in the log: a reconnect sending it as `Last-Event-ID` goes on after it.",
        "tags": ["jobs"],
        "parameters": [
            _JOB_ID,
            {"name": "rank", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
            {"name": "tail", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
            {
                "name": "since",
                "in": "query",
                "required": False,
                "schema": {"type": "number", "minimum": 0},
                "description": "lines shipped from this Unix time on",
            },
            {"name": "attempt", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
            {
                "name": "follow",
                "in": "query",
                "required": False,
                "schema": {"type": "boolean"},
                "description": "answer server-sent events, lines as they ship, until the job has ended",
            },
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
                "description": "with `follow`: the id of the last `line` event a client has (its reconnect goes on "
                "after it)",
            },
        ],
        "responses": {
            "200": {
                "description": "the lines: text, or events with `follow`",
                "content": {
                    "text/plain": {"schema": {"type": "string"}},
                    **_events({"line": _ref("LogLine"), "end": _ref("LogEnd")}),
                },
            },
            "404": _error("unknown job, or another tenant's"),
            "422": _error("a bad parameter; `field` names it"),
            "503": _error("the job is not recorded yet, or the bus is unavailable"),
        },
    },
    ("get", "/v1/cluster"): {
        "operationId": "getCluster",
        "summary": "Domains, nodes and GPUs with health, owners, allocations and utilisation",
        "tags": ["cluster"],
        "responses": {"200": _json("ClusterView", "the cluster")},
    },
    ("get", "/v1/cluster/summary"): {
        "operationId": "getClusterSummary",
        "summary": "The cell's capacity in figures: GPUs total, healthy, busy and free, nodes up, jobs pending and "
        "running",
        "description": "Counts only (no job, tenant or node named), so any token reads it: what a router over "
        "several cells places jobs by (services/router).",
        "tags": ["cluster"],
        "responses": {
            "200": _json("CellSummary", "the cell's figures"),
            "503": _error("the view is being rebuilt, or Redis is unavailable"),
        },
    },
    ("get", "/v1/migrations"): {
        "operationId": "listMigrations",
        "summary": "Moves of running jobs (evacuation, defragmentation), newest first: job, from, to, why, state, "
        "timings",
        "tags": ["migrations"],
        "parameters": [
            {"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}},
            {"name": "job", "in": "query", "required": False, "schema": {"type": "string"}},
            *_LIST_PARAMS[-2:],
        ],
        "responses": {"200": _json("MigrationList", "one page of moves"), "422": _error("bad page")},
    },
    ("get", "/v1/usage"): {
        "operationId": "getUsage",
        "summary": "GPU-hours per tenant and day or week, from the job log; CSV on request",
        "description": "Runs of GPUs held (a job attempt from its first event holding GPUs to the event that shows "
        "it past them), per tenant and UTC day or ISO week (from Monday); runs still holding count up to now. "
        "`from` is rounded down and `to` up to a period's start: the answer covers whole periods [from, to). A user "
        "token's answer is of its own tenant (another tenant's: no rows). CSV (`format=csv`, or `Accept: "
        "text/csv`): `tenant,period,start,gpu_hours,jobs`.",
        "tags": ["usage"],
        "parameters": [
            {"name": "tenant", "in": "query", "required": False, "schema": {"type": "string"}},
            {
                "name": "from",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "an ISO date (2025-01-06) or time (UTC unless it says), or Unix seconds; default "
                "(or blank): 7 days before `to`",
            },
            {
                "name": "to",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "as `from`, exclusive; default (or blank): now. At most 731 days after `from`",
            },
            {"name": "by", "in": "query", "required": False, "schema": {"enum": ["day", "week"], "default": "day"}},
            {"name": "format", "in": "query", "required": False, "schema": {"enum": ["json", "csv"]}},
        ],
        "responses": {
            "200": {
                "description": "the figures",
                "content": {
                    "application/json": {"schema": _ref("UsageView")},
                    "text/csv": {"schema": {"type": "string"}},
                },
            },
            "422": _error("a bad parameter; `field` names it"),
            "503": _error("the usage view is being built from the job log, or Redis is unavailable"),
        },
    },
    ("post", "/v1/nodes/{id}/drain"): _admin("drain"),
    ("post", "/v1/nodes/{id}/undrain"): _admin("undrain"),
    ("post", "/v1/nodes/{id}/clear-health"): _admin(
        "clear_health", "clearNodeHealth", "Lift the GPU health rules' verdicts on a node, latched faults too"
    ),
    ("get", "/v1/events"): {
        "operationId": "streamEvents",
        "summary": "Server-sent events: `event: job` (JobEvent), `event: node` (NodeChanged), `event: cluster`",
        "description": "Each `data:` line is the JSON of a JobEvent or NodeChanged schema. A comment line "
        "(`: keep-alive`) comes every 15 s; `: connected` once the stream is live. A user token hears only its "
        "tenant's job events; for another tenant's it gets `event: cluster` (`data: {}`): /v1/cluster changed.",
        "tags": ["events"],
        "parameters": [
            {
                "name": QUERY_TOKEN,
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "The bearer token, for clients that can't set headers (a browser's EventSource); "
                "this path only. The Authorization header wins when both are given.",
            }
        ],
        "responses": {
            "200": {
                "description": "the events, until the client goes away",
                "content": _events(
                    {
                        "job": _ref("JobEvent"),
                        "node": _ref("NodeChanged"),
                        "cluster": {"type": "object", "maxProperties": 0},
                    }
                ),
            }
        },
    },
    ("get", "/"): {
        "operationId": "root",
        "summary": "Redirects to the dashboard, keeping the query (`?token=`)",
        "tags": ["dashboard"],
        "responses": {"302": {"description": "to /dashboard"}},
    },
    ("get", "/dashboard"): {
        "operationId": "dashboard",
        "summary": "The live dashboard: domains as GPU grids, the pending queue, a job's placement and trace",
        "description": "A static page (no data in it): its script reads /v1/cluster and /v1/jobs and listens to "
        "/v1/events with the token given once as `?token=` (kept in the tab's sessionStorage).",
        "tags": ["dashboard"],
        "responses": {"200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}},
    },
    **{
        ("get", path): {
            "operationId": "dashboard" + path.rsplit(".", 1)[1].capitalize(),
            "summary": "The dashboard's " + path.rsplit(".", 1)[1].upper(),
            "tags": ["dashboard"],
            "responses": {"200": {"description": kind, "content": {kind: {"schema": {"type": "string"}}}}},
        }
        for path, kind in dashboard.ASSETS.items()
    },
    ("get", "/openapi.json"): {
        "operationId": "getOpenApi",
        "summary": "This document",
        "tags": ["meta"],
        "responses": {"200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {}}}}},
    },
    ("get", SCHEMA_PATH): {
        "operationId": "getJobSchema",
        "summary": "The job body's JSON Schema (the JobBody of this document, on its own): editors validate YAML job "
        "files with it (docs/job.schema.json is a copy)",
        "tags": ["meta"],
        "responses": {
            "200": {"description": "JSON Schema 2020-12", "content": {"application/schema+json": {"schema": {}}}}
        },
    },
    ("get", "/healthz"): {
        "operationId": "healthz",
        "summary": "Liveness: the process is up",
        "tags": ["meta"],
        "responses": {"200": _json("Health", "up")},
    },
    ("get", "/metrics"): {
        "operationId": "metrics",
        "summary": "Prometheus metrics: this process's and the cluster's (jobs, queue, GPUs per domain, fragmentation)",
        "tags": ["meta"],
        "responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {}}}},
            "403": _error("not an admin token (they span every tenant)"),
        },
    },
    ("get", "/readyz"): {
        "operationId": "readyz",
        "summary": "Readiness: NATS connected and Redis answers PING",
        "tags": ["meta"],
        "responses": {"200": _json("Health", "ready"), "503": _json("Health", "not ready")},
    },
}


def document() -> dict[str, Any]:
    _, components = msgspec.json.schema_components(_SCHEMA_TYPES, ref_template=REF)
    components = described(components)  # each job field's meaning (shared/jobfile/schema.py)
    components.setdefault("JobState", {"enum": [s.value for s in JobState]})
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), op in OPERATIONS.items():
        op = dict(op)
        if path in PUBLIC_PATHS:
            op["security"] = []  # probes and scrapers carry no token
        else:
            op["responses"] = {**op["responses"], "401": _error("missing, malformed or unknown bearer token")}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.2.0",
        "info": {
            "title": "Rackscale API",
            "version": API_VERSION,
            "description": "Topology-aware GPU scheduler for rack-scale NVLink systems.",
        },
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.2/dialect/2025-09-17",
        "paths": paths,
        # Bearer tokens map to a tenant and a role (services/gateway/auth.py); with no tokens file the API is open.
        "security": [{SCHEME: []}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from RACKSCALE_TOKENS_FILE: users act within their tenant, admins on all.",
                }
            },
        },
    }
