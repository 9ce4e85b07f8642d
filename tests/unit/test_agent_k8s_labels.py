"""--topology k8s: the agent reads its Node's labels from a Kubernetes API (a real HTTP server here)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from services.agent.backends import SimBackend
from services.agent.k8s_labels import NodeLabelsError, labelled, read_node_labels
from shared.core.topology_io import CLIQUE_LABEL, DEFAULT_DOMAIN_LABEL, LEAF_LABEL, LabelError

UUID = "8b7a2f4e-0c1d-4e5f-9a8b-7c6d5e4f3a2b"
NODES = {
    "gb-n07": {CLIQUE_LABEL: f"{UUID}.3", LEAF_LABEL: "leaf-2", "kubernetes.io/hostname": "gb-n07"},
    "cw-n01": {CLIQUE_LABEL: f"{UUID}.1", DEFAULT_DOMAIN_LABEL: "rack-12"},
    "bad-n00": {CLIQUE_LABEL: f"{UUID}.x"},
}


@pytest_asyncio.fixture
async def api(tmp_path: Path) -> AsyncIterator[tuple[str, Path, list[str]]]:
    seen: list[str] = []

    async def node(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        name = request.match_info["name"]
        if name not in NODES:
            return web.json_response({"kind": "Status", "reason": "NotFound"}, status=404)
        return web.json_response({"kind": "Node", "metadata": {"name": name, "labels": NODES[name]}})

    app = web.Application()
    app.router.add_get("/api/v1/nodes/{name}", node)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    account = tmp_path / "sa"
    account.mkdir()
    (account / "token").write_text("s3cret\n")
    try:
        yield f"http://127.0.0.1:{port}", account, seen
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_labels_give_domain_clique_and_leaf(api: tuple[str, Path, list[str]]) -> None:
    url, account, seen = api
    labels = await read_node_labels("gb-n07", api=url, account=account)
    assert labels == NODES["gb-n07"] and seen == ["Bearer s3cret"]
    reg = labelled(SimBackend("gb-n07", "nvml-said-this", clique_id=0, gpus=4).describe(), labels)
    assert (reg.node, reg.cluster_uuid, reg.clique_id, reg.leaf, len(reg.gpus)) == ("gb-n07", UUID, 3, "leaf-2", 4)


@pytest.mark.asyncio
async def test_a_provider_domain_label_wins_over_the_cluster_uuid(api: tuple[str, Path, list[str]]) -> None:
    url, account, _ = api
    labels = await read_node_labels("cw-n01", api=url, account=account)
    reg = labelled(SimBackend("cw-n01", "x", clique_id=0, gpus=4).describe(), labels)
    assert (reg.cluster_uuid, reg.clique_id) == ("rack-12", 1)
    reg = labelled(SimBackend("cw-n01", "x", clique_id=0, gpus=4).describe(), labels, domain_label=None)
    assert reg.cluster_uuid == UUID


@pytest.mark.asyncio
async def test_errors_name_the_node_and_the_cause(api: tuple[str, Path, list[str]]) -> None:
    url, account, _ = api
    with pytest.raises(NodeLabelsError, match=r"reading node gone-n00 from http://127\.0\.0\.1:\d+: HTTP 404"):
        await read_node_labels("gone-n00", api=url, account=account)
    labels = await read_node_labels("bad-n00", api=url, account=account)
    with pytest.raises(LabelError, match=r"node bad-n00: label nvidia\.com/gpu\.clique=.*cliqueId isn't a number"):
        labelled(SimBackend("bad-n00", "x", clique_id=0, gpus=4).describe(), labels)
    with pytest.raises(NodeLabelsError, match=r"reading node n from http://127\.0\.0\.1:9: "):
        await read_node_labels("n", api="http://127.0.0.1:9", account=account, timeout_s=2)


def test_outside_a_pod_the_api_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.agent.k8s_labels import in_cluster_api

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(NodeLabelsError, match="KUBERNETES_SERVICE_HOST is not set"):
        in_cluster_api()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert in_cluster_api() == "https://10.0.0.1:6443"
