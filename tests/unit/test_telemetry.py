"""GPU telemetry from the agents' backends: the simulator's plausible values and scripted faults (fault plans),
and NVML's readings through a stand-in `pynvml` (no GPU or driver on this machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.agent.backends import SIM_MEM_MIB, SIM_NVLINKS, NvmlBackend, SimBackend
from services.agent.faults import FaultPlanError, faults_for, load_plan, parse_plan
from services.agent.fleet import sim_fleet
from shared.health import HealthRules, evaluate, verdicts
from shared.schemas import Fault, GpuSample, NodeHealthState, NvLinkSample, Telemetry
from tests.unit.test_agent_backends import FakeNVMLError, fake_pynvml

# -- the simulator -----------------------------------------------------------------------------------------


def test_sim_telemetry_is_plausible() -> None:
    b = SimBackend("d00-n00", "d00", gpus=4, seed=3)
    for _ in range(50):
        busy, idle = b.telemetry(frozenset({0, 1}))[1], b.telemetry(frozenset())[3]
        assert 0.85 <= busy.util <= 0.99 and idle.util <= 0.03
        assert 35 <= idle.temp_c < busy.temp_c <= 80
        assert busy.power_w > 800 > 200 > idle.power_w
        assert busy.mem_used_mib > idle.mem_used_mib and busy.mem_total_mib == SIM_MEM_MIB
        assert busy.nvlink == NvLinkSample(up=SIM_NVLINKS, total=SIM_NVLINKS, errors=0)
        assert (busy.fabric, busy.xids, busy.throttle, busy.lost, busy.ecc_uncorrected) == (
            "completed",
            [],
            [],
            False,
            0,
        )


def test_sim_telemetry_follows_the_seed_and_healthy_nodes_stay_healthy() -> None:
    def run(seed: int) -> list[list[GpuSample]]:
        b = SimBackend("n", "d", seed=seed)
        return [b.telemetry(frozenset({0, 2})) for _ in range(200)]

    assert run(1) == run(1) != run(2)
    state, rules = NodeHealthState(), HealthRules()
    for t, gpus in enumerate(run(1)):
        assert evaluate(rules, state, Telemetry(node="n", at=5.0 * t, gpus=gpus), 5.0 * t) == []
    assert sum(g.ecc_corrected for g in run(1)[-1]) <= 4  # correctable ECC: rare


def at(b: SimBackend, elapsed: float, busy: frozenset[int] = frozenset()) -> list[GpuSample]:
    b.advance(elapsed)
    return b.telemetry(busy)


def test_xid_79_at_its_time_then_the_gpu_is_off_the_bus() -> None:
    b = SimBackend("d02-n07", "d02", seed=1)
    b.schedule(parse_plan([{"at": 30, "node": "d02-n07", "gpu": 3, "xid": 79}]))
    assert at(b, 29.9)[3].xids == []
    first = at(b, 30.0)[3]
    assert (first.xids, first.lost) == ([79], True)
    later = at(b, 35.0)
    assert (later[3].xids, later[3].lost) == ([], True)
    assert not any(g.lost for g in later[:3])
    assert [g.health for g in b.health()] == ["ok"] * 4  # telemetry only: the inventory's rules judge it


def test_a_non_fatal_xid_is_reported_once_and_the_gpu_stays() -> None:
    b = SimBackend("n", "d")
    b.inject(Fault(node="n", gpu=0, xid=13))
    assert [g.xids for g in b.telemetry(frozenset())] == [[13], [], [], []]
    again = b.telemetry(frozenset())[0]
    assert (again.xids, again.lost) == ([], False)


def test_silent_node_for_a_while() -> None:
    b = SimBackend("d05-n11", "d05")
    b.schedule(parse_plan([{"at": 10, "node": "d05-n11", "silent": True, "for_s": 20}]))
    b.advance(9.0)
    assert not b.silent
    b.advance(10.0)
    assert b.silent
    b.advance(30.0)
    assert not b.silent


def test_hot_domain_and_pinned_temperature() -> None:
    plan = parse_plan([{"at": 0, "domain": "d01", "hot_c": 12}, {"at": 0, "node": "d01-n00", "gpu": 1, "temp_c": 95}])
    hot, cool = SimBackend("d01-n00", "d01", seed=5), SimBackend("d00-n00", "d00", seed=5)
    hot.schedule(faults_for(hot.node, hot.domain, plan))
    cool.schedule(faults_for(cool.node, cool.domain, plan))
    h, c = at(hot, 0.0, frozenset({0})), at(cool, 0.0, frozenset({0}))
    assert h[0].temp_c == pytest.approx(c[0].temp_c + 12, abs=0.11)  # same seed: same noise
    assert h[1].temp_c == 95.0


def test_a_domain_running_hot_is_no_health_fault_by_itself() -> None:
    # 12 C hot and busy: hotter than its neighbours (a rebalancing signal) but under the temperature rule
    b = SimBackend("d01-n00", "d01", seed=11)
    b.inject(Fault(domain="d01", hot_c=12))
    state, rules, temps = NodeHealthState(), HealthRules(), []
    for t in range(500):
        gpus = b.telemetry(frozenset(range(4)))
        temps += [g.temp_c for g in gpus]
        assert evaluate(rules, state, Telemetry(node=b.node, at=5.0 * t, gpus=gpus), 5.0 * t) == []
    assert 85 < sum(temps) / len(temps) < rules.temperature_c


def test_flapping_fault_alternates_sample_by_sample() -> None:
    b = SimBackend("n", "d")
    b.inject(Fault(node="n", gpu=2, temp_c=91.0, flap=2))
    temps = [b.telemetry(frozenset())[2].temp_c for _ in range(8)]
    assert [t == 91.0 for t in temps] == [True, True, False, False, True, True, False, False]


def test_nvlink_ecc_and_throttle_faults() -> None:
    b = SimBackend("n", "d")
    b.inject(Fault(node="n", gpu=0, nvlink_down=2, nvlink_errors_per_s=3.0, ecc_uncorrected=1, throttle=["hw_thermal"]))
    at(b, 0.0)
    g = at(b, 10.0)[0]
    assert g.nvlink == NvLinkSample(up=SIM_NVLINKS - 2, total=SIM_NVLINKS, errors=30)
    assert (g.ecc_uncorrected, g.throttle) == (1, ["hw_thermal"])
    assert at(b, 20.0)[0].ecc_uncorrected == 1  # one-shot: counted once
    assert at(b, 20.0)[1].nvlink.errors == 0


def test_a_fault_ends_after_for_s_and_a_lost_gpu_comes_back() -> None:
    b = SimBackend("n", "d")
    b.advance(5.0)
    b.inject(Fault(node="n", gpu=1, lost=True, for_s=10))
    assert at(b, 14.0)[1].lost
    assert not at(b, 15.0)[1].lost


def test_sim_rejects_a_fault_that_is_not_its_own() -> None:
    b = SimBackend("n", "d", gpus=4)
    with pytest.raises(ValueError, match="gpu"):
        b.inject(Fault(node="n", gpu=4, xid=79))
    with pytest.raises(ValueError, match="given to node n"):
        b.inject(Fault(node="m", xid=79))


# -- plans -------------------------------------------------------------------------------------------------


def test_plan_from_yaml_and_json(tmp_path: Path) -> None:
    entries = [
        {"at": 30, "node": "d02-n07", "gpu": 3, "xid": 79},
        {"at": 10, "node": "d05-n11", "silent": True},
        {"at": 0, "domain": "d01", "hot_c": 12},
        {"at": 5, "node": "d00-n02", "gpu": 1, "temp_c": 90, "flap": 1},
    ]
    (tmp_path / "plan.json").write_text(json.dumps(entries))
    (tmp_path / "plan.yaml").write_text(
        "- {at: 30, node: d02-n07, gpu: 3, xid: 79}\n- {at: 10, node: d05-n11, silent: true}\n"
        "- {at: 0, domain: d01, hot_c: 12}\n- {at: 5, node: d00-n02, gpu: 1, temp_c: 90, flap: 1}\n"
    )
    plan = load_plan(tmp_path / "plan.json")
    assert plan == load_plan(tmp_path / "plan.yaml")
    assert plan[0] == Fault(at=30, node="d02-n07", gpu=3, xid=79)
    assert load_plan(None) == []
    assert [f.at for f in faults_for("d01-n04", "d01", plan)] == [0]


@pytest.mark.parametrize(
    ("entry", "names"),
    [
        ({"at": 1, "xid": 79}, "[0].node"),  # no target
        ({"node": "a", "domain": "d", "xid": 79}, "[0].node"),  # two targets
        ({"node": "a"}, "no effect"),
        ({"node": "a", "xid": 79, "gpus": 3}, "gpus"),  # unknown field
        ({"node": "a", "at": -1, "xid": 79}, "at"),
        ({"node": "a", "throttle": ["too_hot"]}, "[0].throttle"),
        ({"node": "a", "gpu": 1, "silent": True}, "[0].gpu"),
    ],
)
def test_bad_plan_entries_name_the_field(entry: dict[str, Any], names: str) -> None:
    with pytest.raises(FaultPlanError, match=r"plan\.yaml\[0\]") as e:
        parse_plan([entry], "plan.yaml")
    assert names in str(e.value)


def test_the_example_plan_fits_the_default_fleet() -> None:
    plan = load_plan(Path(__file__).resolve().parents[2] / "deploy" / "faults.example.yaml")
    fleet = sim_fleet(4)
    for f in plan:
        assert any(faults_for(b.node, b.domain, [f]) for b in fleet), f
    for b in fleet:
        b.schedule(faults_for(b.node, b.domain, plan))


def test_a_plan_is_a_list(tmp_path: Path) -> None:
    with pytest.raises(FaultPlanError, match="list"):
        parse_plan({"at": 1}, "plan.yaml")
    with pytest.raises(FaultPlanError, match=r"missing\.yaml"):
        load_plan(tmp_path / "missing.yaml")


# -- NVML --------------------------------------------------------------------------------------------------


class Util:
    def __init__(self, gpu: int) -> None:
        self.gpu, self.memory = gpu, 0


class Mem:
    def __init__(self, used: int, total: int) -> None:
        self.used, self.total, self.free = used, total, total - used


class Event:
    def __init__(self, device: int, xid: int) -> None:
        self.device, self.eventData, self.eventType = device, xid, 8


def nvml_with_telemetry(*, links: int = 18, down_links: frozenset[int] = frozenset(), **kw: Any) -> Any:
    nv = fake_pynvml(**kw)
    pending: list[Event] = [Event(3, 79), Event(1, 13), Event(3, 48)]

    def wait(events: object, timeout_ms: int) -> Event:
        assert timeout_ms == 0  # never blocks the agent
        if not pending:
            raise FakeNVMLError("Timeout")
        return pending.pop(0)

    def link_state(h: int, link: int) -> int:
        if link >= links:
            raise FakeNVMLError("Not Supported")
        return 0 if link in down_links else 1

    nv.nvmlDeviceGetUtilizationRates = lambda h: Util(90 if h == 0 else 0)
    nv.nvmlDeviceGetMemoryInfo = lambda h: Mem(100 * 2**20, 1000 * 2**20)
    nv.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h
    nv.nvmlDeviceGetPowerUsage = lambda h: 700_000
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 5 if kind == 0 else h
    nv.nvmlEventSetCreate = lambda: object()
    nv.nvmlDeviceRegisterEvents = lambda h, kinds, events: None
    nv.nvmlEventSetWait = wait
    nv.nvmlDeviceGetIndex = lambda device: device
    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkErrorCounter = lambda h, link, counter: 1 if counter == 0 else 0
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x40 | 0x4 if h == 2 else 0
    return nv


def test_nvml_telemetry_reads_every_query() -> None:
    b = NvmlBackend("gb200-n1", nvml=nvml_with_telemetry(down_links=frozenset({5})))
    gpus = b.telemetry(frozenset())
    g0, g3 = gpus[0], gpus[3]
    assert (g0.util, g0.mem_used_mib, g0.mem_total_mib, g0.temp_c, g0.power_w) == (0.9, 100, 1000, 60.0, 700.0)
    assert (g0.ecc_corrected, g3.ecc_uncorrected) == (5, 3)
    assert g0.nvlink == NvLinkSample(up=17, total=18, errors=18)
    assert g0.fabric == "completed"
    assert [g.xids for g in gpus] == [[], [13], [], [79, 48]]
    assert (gpus[2].throttle, g0.throttle) == (["sw_power_cap", "hw_thermal"], [])
    assert [g.xids for g in b.telemetry(frozenset())] == [[]] * 4  # drained


def test_nvml_telemetry_tolerates_unsupported_queries() -> None:
    # the plain stand-in has none of the telemetry queries: every value reads as zero, nothing raises
    gpus = NvmlBackend("n", nvml=fake_pynvml(2)).telemetry(frozenset())
    assert gpus == [GpuSample(index=i, fabric="completed") for i in range(2)]


def test_nvml_telemetry_marks_an_unreachable_gpu_lost_and_reads_fabric_state() -> None:
    nv = nvml_with_telemetry(lost=frozenset({1}), fabric=lambda i: (b"\x01" * 16, 0, 2))
    gpus = NvmlBackend("n", nvml=nv).telemetry(frozenset())
    assert gpus[1] == GpuSample(index=1, xids=[13], lost=True)
    assert gpus[0].fabric == "in_progress"


def test_nvml_xids_feed_the_health_rules() -> None:
    b = NvmlBackend("n", nvml=nvml_with_telemetry())
    state = NodeHealthState()
    changes = evaluate(HealthRules(), state, Telemetry(node="n", at=0.0, gpus=b.telemetry(frozenset())), 0.0)
    assert [(c.gpu, c.after, c.cause) for c in changes] == [(3, "down", "xid_fatal")]
    assert verdicts(state) == {"3": "down"}
