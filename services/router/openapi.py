"""The router's /openapi.json: a cell's own document (the API the router forwards) with what the router adds —
`cell` parameters, `GET /v1/cells`, which cells answer in /healthz and /readyz, and the answers a router gives of
its own (503 naming an unreachable cell, 422 for an unknown `cell`, `X-Rackscale-Cells-Missing` on what it
merges)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import msgspec

from services.router.upstream import MISSING_HEADER
from shared.api import CellList, RouterHealth

REF = "#/components/schemas/{name}"  # as the gateway's document refers to its schemas

# (method, path) → what `cell` does there
CELL_PARAMS: dict[tuple[str, str], str] = {
    ("get", "/v1/jobs"): "one cell's jobs only (default: every cell's, merged in submit order)",
    ("get", "/v1/migrations"): "one cell's moves only (default: every cell's, merged newest first)",
    ("get", "/v1/events"): "one cell's events only (default: every cell's)",
    ("get", "/v1/usage"): "one cell's usage only (default: every cell's, summed by tenant and period)",
    ("get", "/v1/cluster"): "the cell shown (default: the router's first cell)",
    ("get", "/v1/cluster/summary"): "the cell summed up (default: the router's first cell)",
    ("get", "/metrics"): "the cell whose figures (default: the router's first cell)",
    ("post", "/v1/nodes/{id}/drain"): "the node's cell (required when the router has several)",
    ("post", "/v1/nodes/{id}/undrain"): "the node's cell (required when the router has several)",
    ("post", "/v1/nodes/{id}/clear-health"): "the node's cell (required when the router has several)",
}
MERGED = (("get", "/v1/jobs"), ("get", "/v1/migrations"), ("get", "/v1/events"), ("get", "/v1/usage"))


def _ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(name=name)}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("ErrorBody")}}}


def _health(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("RouterHealth")}}}


CELLS_OPERATION: dict[str, Any] = {
    "operationId": "listCells",
    "summary": "One row per cell of the router: its capacity summary (GET /v1/cluster/summary), or why it has none",
    "tags": ["cluster"],
    "responses": {
        "200": {"description": "the cells", "content": {"application/json": {"schema": _ref("CellList")}}},
        "401": _error("missing, malformed or unknown bearer token"),
    },
}


def for_router(cell_doc: dict[str, Any], cells: Sequence[str]) -> dict[str, Any]:
    """The router's document over `cells` from a cell's document (which is left as it was)."""
    doc = copy.deepcopy(cell_doc)
    info = doc.setdefault("info", {})
    info["title"] = f"{info.get('title', 'Rackscale API')} (router over cells)"
    info["description"] = (
        f"{info.get('description', '')} Served by a router in front of several cells: a job goes to its tenant's "
        "home cell or the cell with room for it; a job id names its cell (`c1-<32 hex>`; the default cell's are "
        "plain hex)."
    ).strip()
    paths: dict[str, dict[str, Any]] = doc.setdefault("paths", {})
    for path_ops in paths.values():
        for op in path_ops.values():
            op["responses"].setdefault("503", _error("a cell the request must go to is unavailable (named)"))
    for (method, path), what in CELL_PARAMS.items():
        op = paths[path][method]
        required = method == "post" and len(cells) > 1  # a node's cell: node names repeat across cells
        schema = {"type": "string", "enum": list(cells)}
        param = {"name": "cell", "in": "query", "required": required, "schema": schema, "description": what}
        op["parameters"] = [*op.get("parameters", []), param]
        op["responses"].setdefault("422", _error("unknown cell (`field`: cell), or another bad parameter"))
    for method, path in MERGED:
        ok = paths[path][method]["responses"]["200"]
        ok["headers"] = {
            **ok.get("headers", {}),
            MISSING_HEADER: {
                "description": "cells that didn't answer, comma-separated: the answer is without them",
                "schema": {"type": "string"},
            },
        }
    for path in ("/healthz", "/readyz"):
        op = paths[path]["get"]
        op["summary"] = f"{op.get('summary', path)}; which cells' gateways answer"
        op["responses"] = {"200": _health("the cells that answer")}
        if path == "/readyz":
            op["responses"]["503"] = _health("no cell's gateway is ready")
    paths["/v1/cells"] = {"get": copy.deepcopy(CELLS_OPERATION)}
    _, components = msgspec.json.schema_components((CellList, RouterHealth), ref_template=REF)
    doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
    return doc
