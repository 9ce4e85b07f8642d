"""The launch contract (shared/launch.py): every variable a process starts with, table-tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import launch
from shared.schemas import ArrayTask, Launch, NodeGpus, StartRank

LAUNCH_DOC = Path(__file__).resolve().parents[2] / "docs" / "launch.md"

NODES = [NodeGpus("d00-n00", [0, 1, 2, 3]), NodeGpus("d00-n01", [0, 1, 2, 3]), NodeGpus("d00-n02", [2, 3])]


def start(rank: int, *, domains: list[str] | None = None, segments: list[int] | None = None, **kw: object) -> StartRank:
    ng = NODES[rank]
    return StartRank(
        job_id="j1",
        attempt=2,
        node=ng.node,
        gpus=ng.gpus,
        rank=rank,
        world_size=len(NODES),
        master_addr=NODES[0].node,
        command=["python", "train.py"],
        duration_s=0.0,
        launch=Launch(**kw),  # type: ignore[arg-type]
        nodes=NODES,
        domains=["d00"] * 3 if domains is None else domains,
        segments=segments or [],
        master_port=launch.master_port("j1", 2),
    )


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["d00-n00"], "d00-n00"),
        (["d00-n00", "d00-n01", "d00-n02"], "d00-n[00-02]"),
        (["d00-n00", "d00-n01", "d00-n03", "d01-n00", "d01-n01"], "d00-n[00-01,03],d01-n[00-01]"),
        (["d00-n05", "d00-n04"], "d00-n[05,04]"),  # the allocation's order is kept
        (["gpu7", "gpu8", "gpu10"], "gpu[7-8],gpu10"),  # another width is another group
        (["login", "d00-n00"], "login,d00-n00"),
    ],
)
def test_hostlist_compresses_runs_in_order(names: list[str], expected: str) -> None:
    assert launch.hostlist(names) == expected


def test_one_process_per_node() -> None:
    envs = [launch.process_env(start(r)) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"} and {e["NNODES"] for e in envs} == {"3"}
    assert {e["LOCAL_RANK"] for e in envs} == {"0"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"1"}
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["GPUS_PER_NODE"] for e in envs] == ["4", "4", "2"]
    assert envs[2]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert {e["MASTER_ADDR"] for e in envs} == {"d00-n00"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1  # every node agrees on the rendezvous
    assert envs[0]["RACKSCALE_NODELIST"] == "d00-n[00-02]"
    assert envs[1]["RACKSCALE_NODE"] == "d00-n01" and envs[1]["RACKSCALE_ATTEMPT"] == "2"
    assert envs[0]["RACKSCALE_RESTORE"] == "" and envs[0]["RACKSCALE_JOB_ID"] == "j1"


def test_one_process_per_gpu_counts_ranks_node_by_node() -> None:
    cmd = start(1, processes="per_gpu")
    assert launch.processes_on(cmd) == 4
    envs = [launch.process_env(cmd, local) for local in range(4)]
    assert [e["RANK"] for e in envs] == ["4", "5", "6", "7"]  # after node 0's four
    assert {e["WORLD_SIZE"] for e in envs} == {"10"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"4"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {"0,1,2,3"}  # each picks its own by LOCAL_RANK
    last = start(2, processes="per_gpu")
    assert [launch.process_env(last, i)["RANK"] for i in range(2)] == ["8", "9"]


def test_one_nvlink_domain_is_said_and_nccl_is_told() -> None:
    env = launch.process_env(start(0))
    assert env["RACKSCALE_DOMAIN"] == "d00" and env["RACKSCALE_NVLINK_DOMAIN"] == "d00"
    assert env["NCCL_MNNVL_ENABLE"] == "1"
    split = launch.process_env(start(2, domains=["d00", "d00", "d01"]))
    assert split["RACKSCALE_DOMAIN"] == "d01"
    assert "RACKSCALE_NVLINK_DOMAIN" not in split and "NCCL_MNNVL_ENABLE" not in split
    segmented = launch.process_env(start(2, segments=[0, 0, 1]))
    assert segmented["RACKSCALE_SEGMENT"] == "1" and launch.process_env(start(2))["RACKSCALE_SEGMENT"] == "0"


def test_the_jobs_env_goes_over_the_hints_and_under_the_contract() -> None:
    env = launch.process_env(start(0, env={"NCCL_MNNVL_ENABLE": "0", "OMP_NUM_THREADS": "8"}))
    assert env["NCCL_MNNVL_ENABLE"] == "0" and env["OMP_NUM_THREADS"] == "8"
    merged = launch.merged_env({"PATH": "/bin", "RANK": "stale"}, start(1))
    assert merged["PATH"] == "/bin" and merged["RANK"] == "1"


def test_slurm_aliases_only_when_asked() -> None:
    assert not any(k.startswith("SLURM") for k in launch.process_env(start(1)))
    env = launch.process_env(start(1, processes="per_gpu", slurm_env=True), 2)
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NTASKS"]) == ("6", "2", "10")
    assert (env["SLURM_NODEID"], env["SLURM_NNODES"], env["SLURM_JOB_NODELIST"]) == ("1", "3", "d00-n[00-02]")
    assert (env["SLURM_JOB_ID"], env["SLURMD_NODENAME"], env["SLURM_RESTART_COUNT"]) == ("j1", "d00-n01", "1")


def test_master_port_per_job_and_attempt_in_range() -> None:
    ports = {launch.master_port(f"job{i}", a) for i in range(200) for a in (1, 2)}
    assert all(launch.MASTER_PORT_BASE <= p <= launch.MASTER_PORT_LAST for p in ports)
    assert len(ports) > 350  # spread, not one port for everyone
    assert launch.master_port("j", 1) == launch.master_port("j", 1) != launch.master_port("j", 2)


@pytest.mark.parametrize(
    ("name", "valid", "reserved"),
    [
        ("OMP_NUM_THREADS", True, False),
        ("_x1", True, False),
        ("1A", False, False),
        ("A-B", False, False),
        ("", False, False),
        ("RANK", True, True),
        ("MASTER_PORT", True, True),
        ("RACKSCALE_ANYTHING", True, True),
        ("SLURM_PROCID", True, True),
        ("NCCL_MNNVL_ENABLE", True, False),  # a hint: the job may set it
    ],
)
def test_env_names(name: str, valid: bool, reserved: bool) -> None:
    assert (launch.valid_name(name), launch.reserved(name)) == (valid, reserved)


TASK = ArrayTask(array_id="a1", index=7, count=20, first=0, last=19)


def test_an_array_task_is_told_its_array_and_other_jobs_nothing_of_arrays() -> None:
    assert not any(k.startswith(("RACKSCALE_ARRAY_", "SLURM_ARRAY_")) for k in launch.process_env(start(0)))
    env = launch.process_env(start(0, array=TASK))
    got = {k: env[k] for k in launch.ARRAY_VARIABLES}
    assert got == {
        "RACKSCALE_ARRAY_JOB_ID": "a1",
        "RACKSCALE_ARRAY_TASK_ID": "7",
        "RACKSCALE_ARRAY_TASK_COUNT": "20",
        "RACKSCALE_ARRAY_TASK_MIN": "0",
        "RACKSCALE_ARRAY_TASK_MAX": "19",
    }
    assert not any(k.startswith("SLURM") for k in env)  # the Slurm names only when asked
    slurm = launch.process_env(start(0, array=TASK, slurm_env=True))
    assert (slurm["SLURM_ARRAY_JOB_ID"], slurm["SLURM_ARRAY_TASK_ID"], slurm["SLURM_ARRAY_TASK_COUNT"]) == (
        "a1",
        "7",
        "20",
    )
    assert (slurm["SLURM_ARRAY_TASK_MIN"], slurm["SLURM_ARRAY_TASK_MAX"]) == ("0", "19")
    assert "SLURM_ARRAY_TASK_ID" not in launch.process_env(start(0, slurm_env=True))


def test_every_contract_variable_is_set_and_the_docs_carry_the_table() -> None:
    env = launch.process_env(start(0, array=TASK))
    assert {v.name for v in launch.CONTRACT} <= set(env)
    assert set(launch.ARRAY_VARIABLES) == {v.name for v in launch.CONTRACT if "ARRAY" in v.name}
    assert launch.contract_table() in LAUNCH_DOC.read_text(), "docs/launch.md's contract table drifted: regenerate it"
