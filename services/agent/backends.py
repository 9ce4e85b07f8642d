"""Where an agent learns about its node: a seeded simulator, or NVML on a real GPU node.

A backend answers two questions, both synchronous and cheap (the agent calls them on every heartbeat):

- `describe()`: the node's self-description for inventory (`AgentRegister`): name, NVLink fabric identity
  (cluster UUID = the NVLink domain, clique id = the partition inside it) and its GPUs.
- `health()`: one `GpuReport` per GPU, every GPU each time (a GPU that vanished is reported "down", not
  left out).

`SimBackend` is deterministic for a seed: GPU UUIDs and any random faults come from `random.Random(seed)`.
`NvmlBackend` imports `pynvml` (package `nvidia-ml-py`) only when it is built, so nothing else needs the
package or a driver.
"""

from __future__ import annotations

import ctypes
import logging
import random
import socket
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal, Protocol, runtime_checkable

from shared.schemas import AgentRegister, GpuReport

log = logging.getLogger("rackscale.agent.backend")

Health = Literal["ok", "degraded", "down"]
NVML_MISSING = "nvml backend needs an NVIDIA driver and nvidia-ml-py"


@runtime_checkable
class GpuBackend(Protocol):
    """What the agent needs from the hardware layer."""

    @property
    def node(self) -> str: ...

    @property
    def simulated(self) -> bool:
        """True when ranks with an empty command run as timers (no real GPUs to run anything on)."""
        ...

    def describe(self) -> AgentRegister: ...

    def health(self) -> list[GpuReport]: ...


class NvmlUnavailableError(RuntimeError):
    """NVML can't be used here: no `pynvml` module, no driver, or no GPU."""


# -- simulator -------------------------------------------------------------------------------------------


class SimBackend:
    """A simulated node: `gpus` GPUs in NVLink domain `domain` (its cluster UUID), clique `clique_id`.

    `fault_rate` is the chance, per GPU and per `health()` call, that a healthy GPU turns degraded
    (and a degraded one goes down); faults come from the seeded generator, so a run is reproducible.
    `set_health` injects a fault by hand (tests, demos).
    """

    backend = "sim"

    def __init__(
        self,
        node: str,
        domain: str,
        clique_id: int = 0,
        gpus: int = 4,
        seed: int = 0,
        *,
        leaf: str | None = None,
        fault_rate: float = 0.0,
    ) -> None:
        if not node:
            raise ValueError("a simulated node needs a name")
        if gpus < 1:
            raise ValueError(f"node {node!r}: gpus must be >= 1, got {gpus}")
        if clique_id < 0:
            raise ValueError(f"node {node!r}: clique_id must be >= 0, got {clique_id}")
        if not 0.0 <= fault_rate <= 1.0:
            raise ValueError(f"node {node!r}: fault_rate must be in [0, 1], got {fault_rate}")
        self._node = node
        self.domain = domain
        self.clique_id = clique_id
        self.gpus = gpus
        self.seed = seed
        self.leaf = leaf
        self.fault_rate = fault_rate
        self._rng = random.Random(seed)
        self._uuids = [f"GPU-{uuid.UUID(int=self._rng.getrandbits(128), version=4)}" for _ in range(gpus)]
        self._health: list[Health] = ["ok"] * gpus

    @property
    def node(self) -> str:
        return self._node

    @property
    def simulated(self) -> bool:
        return True

    def describe(self) -> AgentRegister:
        return AgentRegister(
            node=self._node,
            cluster_uuid=self.domain,
            clique_id=self.clique_id,
            gpus=self._reports(),
            backend=self.backend,
            leaf=self.leaf,
        )

    def health(self) -> list[GpuReport]:
        if self.fault_rate:
            for i, state in enumerate(self._health):
                if state != "down" and self._rng.random() < self.fault_rate:
                    self._health[i] = "degraded" if state == "ok" else "down"
        return self._reports()

    def set_health(self, index: int, state: Health) -> None:
        if not 0 <= index < self.gpus:
            raise IndexError(f"node {self._node!r} has GPUs 0..{self.gpus - 1}, not {index}")
        self._health[index] = state

    def _reports(self) -> list[GpuReport]:
        return [
            GpuReport(index=i, uuid=u, health=h) for i, (u, h) in enumerate(zip(self._uuids, self._health, strict=True))
        ]

    def __repr__(self) -> str:
        return f"SimBackend({self._node!r}, {self.domain!r}, clique_id={self.clique_id}, gpus={self.gpus})"


# -- NVML ------------------------------------------------------------------------------------------------


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailableError(f"{NVML_MISSING} (pip install 'rackscale[nvml]'): {e}") from e
    return pynvml


class NvmlBackend:
    """The GPUs of this machine, through NVML.

    The NVLink domain is the GPUs' fabric `clusterUuid` and the clique their `cliqueId`
    (`nvmlDeviceGetGpuFabricInfoV`, or the older `nvmlDeviceGetGpuFabricInfo`). A GPU without a multi-node
    fabric (HGX, PCIe, or a fabric not yet registered) gives cluster_uuid "" and inventory makes the node
    its own one-node domain. Health: a GPU NVML can't reach is "down"; pending page retirement or row
    remapping is "degraded", a row-remapping failure "down"; a check NVML doesn't support counts as ok.
    """

    backend = "nvml"

    def __init__(self, node: str | None = None, *, leaf: str | None = None, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml if nvml is not None else _import_pynvml()
        try:
            self.nvml.nvmlInit()
            self.count = int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as e:
            raise NvmlUnavailableError(f"{NVML_MISSING}: NVML failed to start: {e}") from e
        if self.count < 1:
            raise NvmlUnavailableError(f"{NVML_MISSING}: NVML sees no GPU on this machine")
        self._node = node or socket.gethostname().split(".")[0]
        self.leaf = leaf

    @property
    def node(self) -> str:
        return self._node

    @property
    def simulated(self) -> bool:
        return False

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            log.debug("nvmlShutdown failed", exc_info=True)

    def describe(self) -> AgentRegister:
        cluster, clique = "", 0
        for i in range(self.count):
            fabric = self._fabric(i)
            if fabric is None:
                continue
            if not cluster:
                cluster, clique = fabric
            elif fabric != (cluster, clique):
                log.warning("GPU %d reports fabric %s, GPU 0 %s: using the first", i, fabric, (cluster, clique))
        return AgentRegister(
            node=self._node,
            cluster_uuid=cluster,
            clique_id=clique,
            gpus=self.health(),
            backend=self.backend,
            leaf=self.leaf,
        )

    def health(self) -> list[GpuReport]:
        return [self._gpu(i) for i in range(self.count)]

    # -- per GPU -----------------------------------------------------------------------------------------
    def _handle(self, index: int) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def _gpu(self, index: int) -> GpuReport:
        nv = self.nvml
        try:
            handle = self._handle(index)
            raw = nv.nvmlDeviceGetUUID(handle)
        except nv.NVMLError as e:
            log.warning("GPU %d unreachable through NVML: %s", index, e)
            return GpuReport(index=index, health="down")
        gpu_uuid = raw.decode() if isinstance(raw, bytes) else str(raw)
        return GpuReport(index=index, uuid=gpu_uuid, health=self._health_of(handle))

    def _health_of(self, handle: Any) -> Health:
        nv = self.nvml
        state: Health = "ok"
        pending = self._optional(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
        if pending == getattr(nv, "NVML_FEATURE_ENABLED", 1):
            state = "degraded"
        remap = self._optional(lambda: nv.nvmlDeviceGetRemappedRows(handle))
        if remap is not None:
            _corrected, _uncorrected, is_pending, failed = remap
            if failed:
                return "down"
            if is_pending:
                state = "degraded"
        return state

    def _optional(self, query: Callable[[], Any]) -> Any:
        """A query's answer, or None when this GPU or driver doesn't support it."""
        try:
            return query()
        except self.nvml.NVMLError as e:
            log.debug("NVML query unsupported: %s", e)
            return None
        except AttributeError:  # an older pynvml without this function
            return None

    def _fabric(self, index: int) -> tuple[str, int] | None:
        """(clusterUuid, cliqueId) of a GPU whose fabric registration completed, else None."""
        nv = self.nvml
        try:
            handle = self._handle(index)
        except nv.NVMLError:
            return None
        variants = (
            ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
            ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
        )
        for fn_name, struct_name in variants:
            fn, struct = getattr(nv, fn_name, None), getattr(nv, struct_name, None)
            if fn is None or struct is None:
                continue
            info = struct()
            try:
                fn(handle, ctypes.byref(info))
            except nv.NVMLError as e:
                log.debug("%s on GPU %d: %s", fn_name, index, e)
                continue
            if info.state != getattr(nv, "NVML_GPU_FABRIC_STATE_COMPLETED", 3):
                return None  # no fabric, or not registered yet: a one-node domain until it is
            if getattr(info, "status", 0) != getattr(nv, "NVML_SUCCESS", 0):
                return None
            cluster = _fabric_uuid(info.clusterUuid)
            return (cluster, int(info.cliqueId)) if cluster else None
        return None


def _fabric_uuid(raw: Any) -> str:
    """NVML's 16 raw bytes as a UUID string; "" for all zeros (no fabric)."""
    data = bytes(raw)[:16].ljust(16, b"\0")
    return "" if not any(data) else str(uuid.UUID(bytes=data))


def make_backend(
    kind: str,
    *,
    node: str | None = None,
    domain: str | None = None,
    clique: int = 0,
    gpus: int = 4,
    seed: int = 0,
    leaf: str | None = None,
) -> GpuBackend:
    """The backend the `--backend` flag names; a sim node without a domain is its own one-node domain."""
    if kind == "sim":
        name = node or socket.gethostname().split(".")[0]
        return SimBackend(name, domain or name, clique, gpus, seed, leaf=leaf)
    if kind == "nvml":
        return NvmlBackend(node, leaf=leaf)
    raise ValueError(f"unknown backend {kind!r}: sim or nvml")
