"""Topology from the Kubernetes node's labels, for `--topology k8s` (GPU Feature Discovery's labels).

Where NVML can't report fabric facts (a driver without `nvmlDeviceGetGpuFabricInfo`, a VM) or the provider
labels the NVLink domain itself, the agent reads its own Node object from the Kubernetes API with the pod's
service account (RBAC: get nodes, deploy/k8s/agent-rbac.yaml) and reports the domain, clique and leaf those
labels give, read by the same rules as `shared.core.topology_io.k8s` (the scheduler-side import).
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from urllib.parse import quote

import aiohttp
import msgspec

from shared.core.topology_io import DEFAULT_DOMAIN_LABEL, fabric_from_labels
from shared.schemas import AgentRegister

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class NodeLabelsError(RuntimeError):
    """The node's labels couldn't be read; the message says from where and why."""


def in_cluster_api() -> str:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise NodeLabelsError("--topology k8s: KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
    return f"https://{host}:{port}"


async def read_node_labels(
    node: str, *, api: str | None = None, account: Path = SERVICE_ACCOUNT, timeout_s: float = 10.0
) -> dict[str, str]:
    """GET /api/v1/nodes/<node> and return its labels."""
    base = api or in_cluster_api()
    headers = {"Accept": "application/json"}
    token = account / "token"
    if token.exists():
        headers["Authorization"] = f"Bearer {token.read_text().strip()}"
    ca = account / "ca.crt"
    tls: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca.exists() else True
    url = f"{base.rstrip('/')}/api/v1/nodes/{quote(node, safe='')}"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.get(url, headers=headers, ssl=tls if url.startswith("https") else None) as resp,
        ):
            body = await resp.read()
            if resp.status != 200:
                raise NodeLabelsError(f"reading node {node} from {base}: HTTP {resp.status}: {body[:200]!r}")
    except (aiohttp.ClientError, TimeoutError) as e:
        raise NodeLabelsError(f"reading node {node} from {base}: {e!r}") from e
    try:
        labels = msgspec.json.decode(body).get("metadata", {}).get("labels") or {}
    except (msgspec.DecodeError, AttributeError) as e:
        raise NodeLabelsError(f"reading node {node} from {base}: not a Node object: {e}") from e
    if not isinstance(labels, dict):
        raise NodeLabelsError(f"reading node {node} from {base}: metadata.labels is not an object")
    return {str(k): str(v) for k, v in labels.items()}


def labelled(
    reg: AgentRegister, labels: dict[str, str], domain_label: str | None = DEFAULT_DOMAIN_LABEL
) -> AgentRegister:
    """The registration with domain, clique and leaf taken from the labels (LabelError names a bad one)."""
    return with_fabric(reg, fabric_from_labels(reg.node, labels, domain_label=domain_label))


def with_fabric(reg: AgentRegister, fabric: tuple[str, int, str | None]) -> AgentRegister:
    """The registration with a (domain, clique id, leaf) read once from the labels."""
    domain, clique, leaf = fabric
    return msgspec.structs.replace(reg, cluster_uuid=domain, clique_id=clique, leaf=leaf or reg.leaf)
