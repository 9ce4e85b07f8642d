"""The dashboard's server side without servers: the page, the cell model it shares with the terminal picture,
the trace id of a job view, and an access log that never writes a token."""

from __future__ import annotations

import logging
from importlib import resources

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from yarl import URL

from services.cli.cluster import cluster_state
from services.gateway import dashboard
from services.gateway.auth import AccessLog, redacted
from services.gateway.views import cluster_view, trace_id
from shared.api import ClusterView
from shared.picture import SYMBOLS, Cell, gpu_cell, job_letters, render
from shared.schemas import AllocationRecord, NodeGpus, NodeRecord


def test_the_jaeger_url_is_escaped_into_the_page() -> None:
    page = dashboard.page('https://jaeger.example/"><script>alert(1)</script>/').decode()
    assert 'content="https://jaeger.example/&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in page
    assert page.count("<script") == 1  # the page's own script file only
    assert "__RACKSCALE_JAEGER_UI__" not in page


def test_the_script_never_parses_strings_as_html() -> None:
    js = resources.files("services.gateway").joinpath("static", "dashboard.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in js, sink
    assert len(js.splitlines()) < 400, "keep the dashboard small"


@pytest.mark.parametrize(
    ("owned", "gpu_down", "node_usable", "node_down", "degraded", "cell"),
    [
        (True, True, False, True, True, Cell.JOB),  # a held GPU shows its job whatever its health
        (False, True, True, False, False, Cell.DOWN),
        (False, False, False, True, False, Cell.DOWN),
        (False, False, False, False, True, Cell.DRAINING),
        (False, False, True, False, True, Cell.DEGRADED),
        (False, False, True, False, False, Cell.FREE),
    ],
)
def test_gpu_cell_precedence(
    owned: bool, gpu_down: bool, node_usable: bool, node_down: bool, degraded: bool, cell: Cell
) -> None:
    got = gpu_cell(owned=owned, gpu_down=gpu_down, node_usable=node_usable, node_down=node_down, degraded=degraded)
    assert got is cell


def _view() -> ClusterView:
    nodes = [
        NodeRecord(name="d00-n00", domain="d00", gpu_health={"1": "degraded", "3": "down"}),
        NodeRecord(name="d00-n01", domain="d00", state="draining", drained=True, gpu_health={"0": "down"}),
        NodeRecord(name="d00-n02", domain="d00", state="down", gpu_health={"2": "degraded"}),
        NodeRecord(name="d01-n00", domain="d01"),
    ]
    allocs = [
        AllocationRecord(job_id="j1", attempt=1, nodes=[NodeGpus("d00-n00", [0]), NodeGpus("d01-n00", [0, 1])],
                         committed_at=1.0),
        AllocationRecord(job_id="j2", attempt=1, nodes=[NodeGpus("d00-n01", [1])], committed_at=2.0),
    ]  # fmt: skip
    return cluster_view(nodes, allocs, generation=1)


def test_the_views_cells_are_the_terminal_pictures() -> None:
    """Cell for cell, the API's `cell` (what the dashboard draws) is what `rackscale cluster` prints."""
    view = _view()
    built = cluster_state(view)
    assert built is not None
    state, health = built
    letters = job_letters(state)
    rows = [line.split("│")[1].replace(" ", "") for line in render(state, letters, health).splitlines()]
    for domain, row in zip(view.domains, rows, strict=True):
        cells = [(g.cell, g.job) for n in domain.nodes for g in n.gpus]
        drawn = [letters[job] if cell == Cell.JOB else SYMBOLS[Cell(cell)] for cell, job in cells]
        assert "".join(drawn) == row, domain.name
    assert [g.cell for g in view.domains[0].nodes[1].gpus] == ["down", "job", "draining", "draining"]


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("", ""),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""),  # the invalid all-zero id
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""),  # W3C: lowercase only
        ("00-4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01", ""),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736", ""),
    ],
)
def test_trace_id_of_a_traceparent(traceparent: str, expected: str) -> None:
    assert trace_id(traceparent) == expected


def test_the_access_log_never_writes_a_token(caplog: pytest.LogCaptureFixture) -> None:
    assert redacted(URL("/v1/events?token=s3cret-s3cret-s3cret&x=1")) == "/v1/events?token=***&x=1"
    assert redacted(URL("/v1/jobs?state=pending")) == "/v1/jobs?state=pending"
    logger = logging.getLogger("rackscale.test.access")
    request = make_mocked_request("GET", "/v1/events?token=s3cret-s3cret-s3cret")
    with caplog.at_level(logging.INFO, logger=logger.name):
        AccessLog(logger, "").log(request, web.Response(status=200), 0.01)
    assert "/v1/events?token=***" in caplog.text and "s3cret" not in caplog.text
