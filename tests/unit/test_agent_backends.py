"""Agent backends: the seeded simulator, and NVML through a stand-in `pynvml` (no driver needed)."""

from __future__ import annotations

import ctypes
import sys
import types
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from services.agent.backends import (
    NVML_MISSING,
    GpuBackend,
    NvmlBackend,
    NvmlUnavailableError,
    SimBackend,
    make_backend,
)
from shared.schemas import AgentRegister, GpuReport

# -- sim ---------------------------------------------------------------------------------------------------


def test_sim_describes_the_node() -> None:
    b = SimBackend("d03-n07", "d03", clique_id=1, gpus=4, seed=7)
    reg = b.describe()
    assert isinstance(b, GpuBackend) and b.simulated
    assert (reg.node, reg.cluster_uuid, reg.clique_id, reg.backend, reg.leaf) == ("d03-n07", "d03", 1, "sim", None)
    assert [g.index for g in reg.gpus] == [0, 1, 2, 3]
    assert all(g.health == "ok" and g.uuid.startswith("GPU-") for g in reg.gpus)
    assert len({g.uuid for g in reg.gpus}) == 4


def test_sim_is_deterministic_for_a_seed() -> None:
    a, b, c = SimBackend("n", "d", seed=1), SimBackend("n", "d", seed=1), SimBackend("n", "d", seed=2)
    assert a.describe() == b.describe()
    assert a.health() == b.health()
    assert [g.uuid for g in a.describe().gpus] != [g.uuid for g in c.describe().gpus]


def test_sim_faults_follow_the_seed() -> None:
    def history(seed: int) -> list[list[str]]:
        b = SimBackend("n", "d", gpus=8, seed=seed, fault_rate=0.2)
        return [[g.health for g in b.health()] for _ in range(20)]

    assert history(5) == history(5)
    seen = {h for row in history(5) for h in row}
    assert seen == {"ok", "degraded", "down"}  # ok → degraded → down, never back by itself


def test_sim_health_can_be_set_by_hand() -> None:
    b = SimBackend("n", "d", gpus=2)
    b.set_health(1, "down")
    assert [g.health for g in b.health()] == ["ok", "down"]
    with pytest.raises(IndexError):
        b.set_health(2, "down")


@pytest.mark.parametrize(
    "kwargs", [{"node": ""}, {"gpus": 0}, {"clique_id": -1}, {"fault_rate": 1.5}], ids=lambda k: next(iter(k))
)
def test_sim_rejects_impossible_nodes(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"node": "n", "domain": "d"} | kwargs
    with pytest.raises(ValueError):
        SimBackend(**args)


def test_make_backend_sim_defaults_to_a_one_node_domain() -> None:
    b = make_backend("sim", node="box1", gpus=8)
    assert isinstance(b, SimBackend)
    assert (b.node, b.domain, b.gpus) == ("box1", "box1", 8)
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("rocm")


# -- nvml --------------------------------------------------------------------------------------------------


def test_nvml_without_pynvml_says_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` now raises ImportError
    with pytest.raises(NvmlUnavailableError, match=NVML_MISSING):
        NvmlBackend()
    with pytest.raises(NvmlUnavailableError, match="nvml backend needs an NVIDIA driver and nvidia-ml-py"):
        make_backend("nvml")


class FakeNVMLError(Exception):
    pass


class FakeFabricInfo(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]


CLUSTER = uuid.UUID("12345678-1234-5678-1234-567812345678")


def fake_pynvml(
    count: int = 4,
    *,
    fabric: Callable[[int], tuple[bytes, int, int] | None] = lambda i: (CLUSTER.bytes, 3, 3),
    lost: frozenset[int] = frozenset(),
    pending_pages: frozenset[int] = frozenset(),
    remap: dict[int, tuple[int, int, int, int]] | None = None,
    init_error: bool = False,
) -> types.ModuleType:
    """A `pynvml` stand-in: `fabric(i)` gives (clusterUuid bytes, cliqueId, state) or None for NOT_SUPPORTED."""
    nv = types.ModuleType("pynvml")
    ns: Any = nv
    ns.NVMLError = FakeNVMLError
    ns.NVML_SUCCESS = 0
    ns.NVML_FEATURE_ENABLED = 1
    ns.NVML_GPU_FABRIC_STATE_COMPLETED = 3
    ns.c_nvmlGpuFabricInfoV_t = FakeFabricInfo

    def init() -> None:
        if init_error:
            raise FakeNVMLError("Driver Not Loaded")

    def handle(i: int) -> int:
        if i in lost:
            raise FakeNVMLError("GPU is lost")
        return i

    def fabric_info(h: int, ref: Any) -> int:
        got = fabric(h)
        if got is None:
            raise FakeNVMLError("Not Supported")
        info = ref._obj
        raw, clique, state = got
        ctypes.memmove(info.clusterUuid, raw, 16)
        info.cliqueId, info.state, info.status = clique, state, 0
        return 0

    def remapped(h: int) -> tuple[int, int, int, int]:
        if remap is None or h not in remap:
            raise FakeNVMLError("Not Supported")
        return remap[h]

    ns.nvmlInit = init
    ns.nvmlShutdown = lambda: None
    ns.nvmlDeviceGetCount = lambda: count
    ns.nvmlDeviceGetHandleByIndex = handle
    ns.nvmlDeviceGetUUID = lambda h: f"GPU-fake-{h}".encode()
    ns.nvmlDeviceGetGpuFabricInfoV = fabric_info
    ns.nvmlDeviceGetRetiredPagesPendingStatus = lambda h: 1 if h in pending_pages else 0
    ns.nvmlDeviceGetRemappedRows = remapped
    return nv


def test_nvml_reads_fabric_identity_and_gpus() -> None:
    b = NvmlBackend("gb200-n1", nvml=fake_pynvml())
    reg = b.describe()
    assert not b.simulated
    assert reg == AgentRegister(
        node="gb200-n1",
        cluster_uuid=str(CLUSTER),
        clique_id=3,
        gpus=[GpuReport(index=i, uuid=f"GPU-fake-{i}") for i in range(4)],
        backend="nvml",
    )


def test_nvml_without_fabric_is_a_one_node_domain() -> None:
    # HGX: NOT_SUPPORTED; a fabric still registering; an all-zero UUID: none is a domain.
    for fabric in (lambda i: None, lambda i: (CLUSTER.bytes, 1, 2), lambda i: (bytes(16), 0, 3)):
        reg = NvmlBackend("hgx-1", nvml=fake_pynvml(8, fabric=fabric)).describe()
        assert (reg.cluster_uuid, reg.clique_id, len(reg.gpus)) == ("", 0, 8)


def test_nvml_health() -> None:
    nv = fake_pynvml(4, lost=frozenset({0}), pending_pages=frozenset({1}), remap={2: (0, 1, 0, 1), 3: (5, 0, 1, 0)})
    assert [g.health for g in NvmlBackend("n", nvml=nv).health()] == ["down", "degraded", "down", "degraded"]


def test_nvml_driver_failure_is_the_clear_error() -> None:
    with pytest.raises(NvmlUnavailableError, match=f"{NVML_MISSING}: NVML failed to start: Driver Not Loaded"):
        NvmlBackend(nvml=fake_pynvml(init_error=True))
    with pytest.raises(NvmlUnavailableError, match="no GPU"):
        NvmlBackend(nvml=fake_pynvml(0))


def test_a_nodes_address_is_what_its_registration_says() -> None:
    """Simulated nodes meet on this machine; `--addr` (the DaemonSet passes the host IP) overrides any backend's,
    after a Kubernetes relabel, so a job's MASTER_ADDR is reachable whether or not node names resolve."""
    from services.agent.__main__ import _relabels, build_parser

    sim = SimBackend("d00-n00", "d00")
    assert sim.describe().addr == "127.0.0.1"
    assert build_parser().parse_args([]).addr == ""
    bump = _relabels(
        lambda r: msgspec.structs.replace(r, clique_id=7), lambda r: msgspec.structs.replace(r, addr="10.0.0.9")
    )
    assert bump is not None and _relabels(None, None) is None
    reg = bump(sim.describe())
    assert (reg.clique_id, reg.addr) == (7, "10.0.0.9")
