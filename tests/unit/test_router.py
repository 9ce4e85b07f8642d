"""The router's pure parts: which cell a job id names, where a submission goes given the cells' summaries and the
home cells, how cells' pages merge into one; the gateway's capacity summary it decides by; and the router's
OpenAPI document against its routes (no servers)."""

from __future__ import annotations

import random

import msgspec
import pytest

from services.gateway import openapi as gateway_openapi
from services.gateway.summary import cell_summary
from services.router import openapi
from services.router.routing import (
    BadCell,
    Cells,
    UnknownJob,
    cell_of_job,
    job_order,
    largest,
    merge_page,
    migration_order,
    named_cell,
    refusal,
    submit_order,
)
from services.router.service import Router, build_app
from shared.api import CellSummary
from shared.names import DEFAULT_CELL, cell_job_id, idempotent_job_id, job_cell
from shared.schemas import AllocationRecord, NodeGpus, NodeRecord

HEX = "0123456789abcdef" * 2
GATEWAYS = (("c0", "http://a:8080"), ("c1", "http://b:8080"), ("west-2", "http://c:8080"))


# -- job ids ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["c0", "c1", "west-2", "a_b", "x" * 64])
def test_a_job_id_says_its_cell(cell: str) -> None:
    job = cell_job_id(cell, HEX)
    assert job_cell(job) == cell
    assert job == HEX if cell == DEFAULT_CELL else job == f"{cell}-{HEX}"


@pytest.mark.parametrize(
    "job",
    [
        HEX,  # the default cell's (every id minted before cells had names)
        "c1-" + HEX[:-1],  # not a whole token
        "c1-" + HEX.upper(),  # the token is lowercase hex
        "c.1-" + HEX,  # no cell has a dot
        "-" + HEX,  # no cell name at all
        "some-name",
        "",
    ],
)
def test_an_id_without_a_cell_prefix_is_the_default_cells(job: str) -> None:
    assert job_cell(job) == DEFAULT_CELL


def test_idempotent_ids_keep_their_default_cell_form_and_take_the_cells_prefix() -> None:
    plain = idempotent_job_id("a", "k1")
    assert len(plain) == 32 and idempotent_job_id("a", "k1", DEFAULT_CELL) == plain
    assert idempotent_job_id("a", "k1", "c1") == f"c1-{plain}" and job_cell(idempotent_job_id("a", "k1", "c1")) == "c1"


# -- cells and routing ---------------------------------------------------------------------------------------------
def summary(cell: str, *, free: int, gpus: int = 72) -> CellSummary:
    return CellSummary(
        cell=cell,
        generation=1,
        gpus=gpus,
        healthy=gpus,
        busy=gpus - free,
        free=free,
        nodes=gpus // 4,
        nodes_up=gpus // 4,
        jobs_pending=0,
        jobs_running=0,
    )


def test_cells_need_a_gateway_and_home_cells_they_have() -> None:
    with pytest.raises(ValueError, match="at least one cell"):
        Cells(gateways=(), homes={})
    with pytest.raises(ValueError, match=r"bob → c9 \(cells: c0, c1, west-2\)"):
        Cells(gateways=GATEWAYS, homes={"alice": "c1", "bob": "c9"})
    cells = Cells(gateways=GATEWAYS, homes={"alice": "c1"})
    assert (cells.default, cells.url("west-2"), "c1" in cells, "c9" in cells) == ("c0", "http://c:8080", True, False)


def test_a_tenant_with_a_home_cell_goes_there_whatever_the_room_elsewhere() -> None:
    cells = Cells(gateways=GATEWAYS, homes={"alice": "c1"})
    summaries = {"c0": summary("c0", free=72), "c1": summary("c1", free=0)}
    assert submit_order(cells, "alice", summaries) == ["c1"]
    assert submit_order(cells, "alice", {}) == ["c1"]  # even when its summary is missing: the cell says why


def test_other_tenants_go_to_the_most_free_gpus_first_and_skip_cells_without_a_summary() -> None:
    cells = Cells(gateways=GATEWAYS, homes={"alice": "c1"})
    summaries = {"c0": summary("c0", free=8), "c1": summary("c1", free=64), "west-2": summary("west-2", free=8)}
    assert submit_order(cells, "bob", summaries) == ["c1", "c0", "west-2"]  # ties: the configured order
    assert submit_order(cells, None, summaries) == ["c1", "c0", "west-2"]
    del summaries["c1"]  # it didn't answer
    assert submit_order(cells, "bob", summaries) == ["c0", "west-2"]
    assert submit_order(cells, "bob", {}) == []


def test_a_refusal_of_every_cell_names_the_largest_and_its_size() -> None:
    summaries = {"c0": summary("c0", free=0, gpus=72), "c1": summary("c1", free=0, gpus=144)}
    assert largest(["c0", "c1"], summaries) == "c1"
    assert largest(["c0", "west-2"], summaries) == "c0"  # a cell without a summary is the smallest
    words = refusal("c1", summaries["c1"], "gpus: 200 GPUs need 50 nodes; the cluster has 36")
    assert words == (
        "no cell can take this job (a job never spans cells); the largest, c1 (144 GPUs): "
        "gpus: 200 GPUs need 50 nodes; the cluster has 36"
    )


def test_requests_name_their_cell_by_job_id_or_parameter() -> None:
    cells = Cells(gateways=GATEWAYS, homes={})
    assert cell_of_job(cells, HEX) == "c0" and cell_of_job(cells, f"west-2-{HEX}") == "west-2"
    with pytest.raises(UnknownJob, match="its cell c9 is not one of this router's"):
        cell_of_job(cells, f"c9-{HEX}")
    assert named_cell(cells, None) == "c0" and named_cell(cells, "c1") == "c1"
    for bad in ("c9", ""):
        with pytest.raises(BadCell, match=f"unknown cell '{bad}', not one of c0, c1, west-2"):
            named_cell(cells, bad)
    with pytest.raises(BadCell, match="name the cell"):
        named_cell(cells, None, required=True)
    assert named_cell(Cells(gateways=GATEWAYS[:1], homes={}), None, required=True) == "c0"


def test_merged_pages_are_the_pages_of_the_cells_lists_merged() -> None:
    rng = random.Random(7)
    cells = [
        sorted(({"id": f"{c}-{i}", "submitted_at": rng.uniform(0, 100)} for i in range(n)), key=job_order)
        for c, n in (("a", 30), ("b", 5), ("c", 0))
    ]
    whole = sorted((j for jobs in cells for j in jobs), key=job_order)
    for offset in (0, 3, 17, 34, 35, 50):
        for limit in (1, 7, 50):
            heads = [jobs[: offset + limit] for jobs in cells]  # what the router asks each cell for
            assert merge_page(heads, job_order, offset, limit) == whole[offset : offset + limit]
    moves = [{"id": "m1", "created_at": 5.0}, {"id": "m2", "created_at": 9.0}, {"id": "m3", "created_at": 1.0}]
    assert [m["id"] for m in merge_page([moves[:2], moves[2:]], migration_order, 0, 3)] == ["m2", "m1", "m3"]


# -- the gateway's summary -----------------------------------------------------------------------------------------
def node(name: str, *, state: str = "up", drained: bool = False, health: dict[str, str] | None = None) -> NodeRecord:
    return NodeRecord(name=name, domain="d00", gpus=4, state=state, drained=drained, gpu_health=health or {})


def test_a_cells_summary_counts_free_healthy_gpus_on_nodes_up() -> None:
    nodes = [
        node("n0"),  # 4 free
        node("n1", health={"2": "down", "3": "degraded"}),  # 2 held, 1 down, 1 degraded and free (it may be placed)
        node("n2", state="draining", drained=True),  # healthy, but no job may start there
        node("n3", state="down"),  # nothing healthy
    ]
    allocs = [AllocationRecord(job_id="j1", attempt=1, nodes=[NodeGpus("n1", (0, 1))], committed_at=0.0)]
    got = cell_summary("c1", nodes, allocs, generation=7, active=5)
    assert msgspec.structs.asdict(got) == {
        "cell": "c1",
        "generation": 7,
        "gpus": 16,
        "healthy": 4 + 3 + 4,
        "busy": 2,
        "free": 4 + 1,
        "nodes": 4,
        "nodes_up": 2,
        "jobs_pending": 4,
        "jobs_running": 1,
    }


# -- the router's document -----------------------------------------------------------------------------------------
def test_the_routers_document_is_a_cells_with_the_routers_additions_and_names_every_route() -> None:
    import openapi_spec_validator as validator

    cell_doc = gateway_openapi.document()
    doc = openapi.for_router(cell_doc, ["c0", "c1", "west-2"])
    validator.validate(doc)
    assert "/v1/cells" not in cell_doc["paths"], "the cell's own document is left as it was"
    app = build_app(Router(Cells(gateways=GATEWAYS, homes={})))
    served = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        served.add((route.method.lower(), str(info.get("path") or info.get("formatter"))))
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented
    cluster = doc["paths"]["/v1/cluster"]["get"]
    assert cluster["parameters"] == [
        {
            "name": "cell",
            "in": "query",
            "required": False,
            "schema": {"type": "string", "enum": ["c0", "c1", "west-2"]},
            "description": "the cell shown (default: the router's first cell)",
        }
    ]
    assert "422" in cluster["responses"]
    drain = doc["paths"]["/v1/nodes/{id}/drain"]["post"]["parameters"]
    assert [(p["name"], p["required"]) for p in drain] == [("id", True), ("cell", True)]  # node names repeat
    assert "X-Rackscale-Cells-Missing" in doc["paths"]["/v1/jobs"]["get"]["responses"]["200"]["headers"]
    assert {"CellList", "CellStatus", "CellSummary", "RouterHealth"} <= set(doc["components"]["schemas"])
