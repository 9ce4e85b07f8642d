"""Where an agent learns about its node: a seeded simulator, or NVML on a real GPU node.

A backend answers these, all synchronous and cheap (the agent calls them on every heartbeat or sample):

- `describe()`: the node's self-description for inventory (`AgentRegister`): name, NVLink fabric identity
  (cluster UUID = the NVLink domain, clique id = the partition inside it) and its GPUs.
- `health()`: one `GpuReport` per GPU, every GPU each time (a GPU that vanished is reported "down", not
  left out).
- `telemetry(busy)`: one `GpuSample` per GPU (utilisation, memory, temperature, power, ECC and NVLink
  counters, XIDs since the last call, fabric state, throttle reasons); `busy` are the GPUs a rank runs on.
- `advance(elapsed_s)` / `silent`: the simulator's scripted faults run on the agent's clock (seconds since
  it started); a silent node sends nothing. Real hardware ignores the one and is never the other.

`SimBackend` is deterministic for a seed: GPU UUIDs and any random faults come from `random.Random(seed)`,
telemetry noise from its own generator.
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
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol, runtime_checkable

from services.agent.faults import check_fault
from shared.schemas import AgentRegister, Fault, GpuReport, GpuSample, NvLinkSample

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

    def telemetry(self, busy: frozenset[int]) -> list[GpuSample]: ...

    def advance(self, elapsed_s: float) -> None: ...

    @property
    def silent(self) -> bool: ...


class NvmlUnavailableError(RuntimeError):
    """NVML can't be used here: no `pynvml` module, no driver, or no GPU."""


# -- simulator -------------------------------------------------------------------------------------------


SIM_ADDR = "127.0.0.1"  # simulated nodes all run on this machine: a job's ranks meet here


class SimBackend:
    """A simulated node: `gpus` GPUs in NVLink domain `domain` (its cluster UUID), clique `clique_id`.

    `fault_rate` is the chance, per GPU and per `health()` call, that a healthy GPU turns degraded
    (and a degraded one goes down); faults come from the seeded generator, so a run is reproducible.
    `set_health` injects a fault by hand (tests, demos).

    Telemetry: a busy GPU runs at 85-99 % utilisation, 70-80 C and ~1 kW, an idle one near 0 %, 35-40 C
    and ~100 W; correctable ECC errors are rare. Scripted faults (`schedule`, `inject`: see
    services/agent/faults.py) change the telemetry only, not `health()`: the inventory's rules judge them.
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
        self._noise = random.Random(f"telemetry-{seed}")
        self._planned: list[Fault] = []  # not yet due, by `at`
        self._active: list[_ActiveFault] = []
        self._elapsed = 0.0
        self._sampled_at: float | None = None  # elapsed at the previous telemetry()
        self._ecc_corrected = [0] * gpus
        self._ecc_uncorrected = [0] * gpus
        self._nvlink_errors = [0.0] * gpus
        self._xids: list[list[int]] = [[] for _ in range(gpus)]
        self._lost = [False] * gpus

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
            addr=SIM_ADDR,
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

    # -- scripted faults ---------------------------------------------------------------------------------
    def schedule(self, faults: list[Fault]) -> None:
        """Plan entries for this node (by name or domain); each applies once the agent's clock reaches `at`."""
        for f in faults:
            self._check(f)
        self._planned = sorted([*self._planned, *faults], key=lambda f: f.at)

    def inject(self, fault: Fault) -> None:
        """Apply a fault now, whatever its `at` (tests on a running fleet)."""
        self._check(fault)
        self._start(fault)

    def advance(self, elapsed_s: float) -> None:
        self._elapsed = max(self._elapsed, elapsed_s)
        while self._planned and self._planned[0].at <= self._elapsed:
            self._start(self._planned.pop(0))
        for a in [a for a in self._active if a.ended(self._elapsed)]:
            self._active.remove(a)
            for i in a.gpus:
                if a.fault.lost or a.fault.xid == XID_FELL_OFF_BUS:
                    self._lost[i] = any(b.loses(i) for b in self._active)

    @property
    def silent(self) -> bool:
        return any(a.fault.silent for a in self._active)

    def _check(self, f: Fault) -> None:
        check_fault(f)
        if f.node not in (None, self._node) or (f.node is None and f.domain != self.domain):
            raise ValueError(f"fault for {f.node or f.domain} given to node {self._node}")
        if f.gpu is not None and f.gpu >= self.gpus:
            raise ValueError(f"gpu: node {self._node!r} has GPUs 0..{self.gpus - 1}, not {f.gpu}")

    def _start(self, f: Fault) -> None:
        a = _ActiveFault(f, self._elapsed, list(range(self.gpus)) if f.gpu is None else [f.gpu])
        self._active.append(a)
        for i in a.gpus:  # one-shot effects happen once, at the start
            if f.xid is not None:
                self._xids[i].append(f.xid)
            self._ecc_uncorrected[i] += f.ecc_uncorrected
            if a.loses(i):
                self._lost[i] = True

    # -- telemetry ---------------------------------------------------------------------------------------
    def telemetry(self, busy: frozenset[int]) -> list[GpuSample]:
        dt = 0.0 if self._sampled_at is None else max(0.0, self._elapsed - self._sampled_at)
        self._sampled_at = self._elapsed
        on = [a for a in self._active if a.on()]
        for a in self._active:
            a.samples += 1
        return [self._sample(i, i in busy, [a for a in on if i in a.gpus], dt) for i in range(self.gpus)]

    def _sample(self, i: int, busy: bool, faults: list[_ActiveFault], dt: float) -> GpuSample:
        rng = self._noise
        xids, self._xids[i] = self._xids[i], []
        for a in faults:
            self._nvlink_errors[i] += a.fault.nvlink_errors_per_s * dt
        if rng.random() < 0.002:
            self._ecc_corrected[i] += 1
        if self._lost[i]:
            return GpuSample(index=i, xids=xids, lost=True)
        util = rng.uniform(0.85, 0.99) if busy else rng.uniform(0.0, 0.03)
        temp = 36.5 + 41.0 * util + rng.uniform(-1.5, 1.5) + sum(a.fault.hot_c for a in faults)
        pinned = [a.fault.temp_c for a in faults if a.fault.temp_c is not None]
        down = max((a.fault.nvlink_down for a in faults), default=0)
        return GpuSample(
            index=i,
            util=round(util, 3),
            mem_used_mib=int(SIM_MEM_MIB * rng.uniform(0.5, 0.9)) if busy else 600,
            mem_total_mib=SIM_MEM_MIB,
            temp_c=round(pinned[-1] if pinned else temp, 1),
            power_w=round(100.0 + 900.0 * util + rng.uniform(-10.0, 10.0), 1),
            ecc_corrected=self._ecc_corrected[i],
            ecc_uncorrected=self._ecc_uncorrected[i],
            xids=xids,
            nvlink=NvLinkSample(up=max(0, SIM_NVLINKS - down), total=SIM_NVLINKS, errors=int(self._nvlink_errors[i])),
            fabric="completed",
            throttle=sorted({r for a in faults for r in a.fault.throttle}),
        )

    def __repr__(self) -> str:
        return f"SimBackend({self._node!r}, {self.domain!r}, clique_id={self.clique_id}, gpus={self.gpus})"


SIM_MEM_MIB = 189_440  # 185 GiB of HBM3e, a GB200 GPU
SIM_NVLINKS = 18  # NVLink 5 links per Blackwell GPU
XID_FELL_OFF_BUS = 79


@dataclass(slots=True)
class _ActiveFault:
    fault: Fault
    since: float  # agent-clock seconds when it started
    gpus: list[int]
    samples: int = 0  # telemetry samples taken while active (drives `flap`)

    def ended(self, elapsed: float) -> bool:
        return self.fault.for_s is not None and elapsed >= self.since + self.fault.for_s

    def on(self) -> bool:
        """Flapping faults are on for `flap` samples, then off for as many; others always."""
        flap = self.fault.flap
        return not flap or (self.samples // flap) % 2 == 0

    def loses(self, gpu: int) -> bool:
        return gpu in self.gpus and (self.fault.lost or self.fault.xid == XID_FELL_OFF_BUS)


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

    Telemetry reads utilisation, memory, temperature, power, volatile ECC counts, NVLink link state and
    replay/recovery/CRC counters, fabric state and clock throttle reasons, each query optional (a value NVML
    doesn't support reads as zero); XIDs come from an NVML event set registered for critical XID events
    and drained without waiting on every sample.
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
        self._events = self._xid_events()

    @property
    def node(self) -> str:
        return self._node

    @property
    def simulated(self) -> bool:
        return False

    def close(self) -> None:
        if self._events is not None:
            self._optional(lambda: self.nvml.nvmlEventSetFree(self._events))
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            log.debug("nvmlShutdown failed", exc_info=True)

    @property
    def silent(self) -> bool:
        return False

    def advance(self, elapsed_s: float) -> None:
        """Real hardware has no script to run."""

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

    # -- telemetry ---------------------------------------------------------------------------------------
    def telemetry(self, busy: frozenset[int]) -> list[GpuSample]:
        xids = self._drain_xids()
        return [self._sample(i, xids.get(i, [])) for i in range(self.count)]

    def _sample(self, index: int, xids: list[int]) -> GpuSample:
        nv, opt = self.nvml, self._optional
        try:
            h = self._handle(index)
        except nv.NVMLError as e:
            log.warning("GPU %d unreachable through NVML: %s", index, e)
            return GpuSample(index=index, xids=xids, lost=True)
        util = opt(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = opt(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        temp = opt(lambda: nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))
        power_mw = opt(lambda: nv.nvmlDeviceGetPowerUsage(h))
        volatile = getattr(nv, "NVML_VOLATILE_ECC", 0)
        corrected = opt(
            lambda: nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0), volatile)
        )
        uncorrected = opt(
            lambda: nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1), volatile)
        )
        fabric = self._fabric_info(h)
        return GpuSample(
            index=index,
            util=(util.gpu / 100.0) if util is not None else 0.0,
            mem_used_mib=int(mem.used) // MIB if mem is not None else 0,
            mem_total_mib=int(mem.total) // MIB if mem is not None else 0,
            temp_c=float(temp or 0),
            power_w=float(power_mw or 0) / 1000.0,
            ecc_corrected=int(corrected or 0),
            ecc_uncorrected=int(uncorrected or 0),
            xids=xids,
            nvlink=self._nvlink(h),
            fabric=self._fabric_state(fabric),
            throttle=self._throttle(h),
        )

    def _fabric_state(self, info: Any) -> str:
        """GpuSample.fabric: the registration state; "failed" when it completed with an error status."""
        if info is None:
            return ""
        state = FABRIC_STATES.get(int(info.state), "")
        failed = getattr(info, "status", 0) != getattr(self.nvml, "NVML_SUCCESS", 0)
        return "failed" if state == "completed" and failed else state

    def _nvlink(self, h: Any) -> NvLinkSample:
        """Links up of the links this GPU has (NVML answers NOT_SUPPORTED past the last), and their error sum."""
        nv = self.nvml
        up = total = errors = 0
        enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
        counters = [getattr(nv, name, i) for i, name in enumerate(NVLINK_ERROR_COUNTERS)]
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            state = self._optional(lambda link=link: nv.nvmlDeviceGetNvLinkState(h, link))
            if state is None:
                break
            total += 1
            up += state == enabled
            for c in counters:
                errors += int(
                    self._optional(lambda link=link, c=c: nv.nvmlDeviceGetNvLinkErrorCounter(h, link, c)) or 0
                )
        return NvLinkSample(up=up, total=total, errors=errors)

    def _throttle(self, h: Any) -> list[str]:
        nv = self.nvml
        mask = self._optional(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        if mask is None:
            mask = self._optional(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if not mask:
            return []
        return [name for name, (const, default) in THROTTLE_BITS.items() if mask & int(getattr(nv, const, default))]

    def _xid_events(self) -> Any:
        """An event set registered for critical XIDs on every GPU, or None where NVML has no events."""
        nv = self.nvml
        events = self._optional(lambda: nv.nvmlEventSetCreate())
        if events is None:
            return None
        kind = getattr(nv, "nvmlEventTypeXidCriticalError", 8)
        for i in range(self.count):
            self._optional(lambda i=i: nv.nvmlDeviceRegisterEvents(self._handle(i), kind, events))
        return events

    def _drain_xids(self) -> dict[int, list[int]]:
        """XIDs since the last call, per GPU index (waits for none: timeout 0)."""
        nv, out = self.nvml, {}
        if self._events is None:
            return out
        for _ in range(1024):  # bounded: a storm of XIDs must not stall the agent
            try:
                ev = nv.nvmlEventSetWait(self._events, 0)
            except (nv.NVMLError, AttributeError):  # NVML_ERROR_TIMEOUT: nothing (more) pending
                break
            index = self._optional(lambda ev=ev: nv.nvmlDeviceGetIndex(ev.device))
            if index is not None:
                out.setdefault(int(index), []).append(int(ev.eventData))
        return out

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
        info = self._fabric_info(handle)
        if info is None or info.state != getattr(nv, "NVML_GPU_FABRIC_STATE_COMPLETED", 3):
            return None  # no fabric, or not registered yet: a one-node domain until it is
        if getattr(info, "status", 0) != getattr(nv, "NVML_SUCCESS", 0):
            return None
        cluster = _fabric_uuid(info.clusterUuid)
        return (cluster, int(info.cliqueId)) if cluster else None

    def _fabric_info(self, handle: Any) -> Any:
        """The GPU's fabric info struct (state, clusterUuid, cliqueId), or None where NVML has none."""
        nv = self.nvml
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
                log.debug("%s: %s", fn_name, e)
                continue
            return info
        return None


MIB = 1024 * 1024
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
NVLINK_ERROR_COUNTERS = (
    "NVML_NVLINK_ERROR_DL_REPLAY",
    "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT",
)
# GpuSample.throttle name → (pynvml constant, its value where the module lacks it)
THROTTLE_BITS = {
    "sw_power_cap": ("nvmlClocksThrottleReasonSwPowerCap", 0x4),
    "hw_slowdown": ("nvmlClocksThrottleReasonHwSlowdown", 0x8),
    "sw_thermal": ("nvmlClocksThrottleReasonSwThermalSlowdown", 0x20),
    "hw_thermal": ("nvmlClocksThrottleReasonHwThermalSlowdown", 0x40),
    "hw_power_brake": ("nvmlClocksThrottleReasonHwPowerBrakeSlowdown", 0x80),
}


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
