"""Real distributed jobs on the running system (issue 22): ranks that find each other with the launch contract's
variables alone, one process per node or per GPU, and a time limit that stops a job.

The simulated fleet's nodes all run on this machine (their agents register `addr` 127.0.0.1), so a job's
real subprocess ranks meet over loopback TCP exactly as they would across nodes: rank 0 listens on
MASTER_ADDR:MASTER_PORT, every other rank connects and sends its rank, rank 0 sends back the sum, and every
rank prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from shared.launch import hostlist
from tests.e2e.conftest import E2E, StackFactory, wait_until

pytestmark = pytest.mark.asyncio

RENDEZVOUS = r"""
import json, os, socket, sys, time
e = os.environ
rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    peers = [server.accept()[0] for _ in range(world - 1)]
    files = [p.makefile("rw") for p in peers]
    total = sum(int(f.readline()) for f in files)
    for f in files:
        f.write(f"{total}\n")
        f.flush()
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    f = peer.makefile("rw")
    f.write(f"{rank}\n")
    f.flush()
    total = int(f.readline())
print(f"rank {rank} of {world}: total {total}", flush=True)
keys = ("NNODES", "NODE_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GPUS_PER_NODE", "RACKSCALE_NODELIST",
        "RACKSCALE_NVLINK_DOMAIN", "NCCL_MNNVL_ENABLE", "OMP_NUM_THREADS")
seen = {k: e.get(k) for k in keys} | {"total": total, "cwd": os.getcwd()}
json.dump(seen, open(os.path.join(sys.argv[1], str(rank)), "w"))
"""


async def _run(e2e: E2E, out: Path, **body: Any) -> dict[str, Any]:
    job = await e2e.submit(
        {
            "name": "rendezvous",
            "tenant": "a",
            "command": [sys.executable, "-c", RENDEZVOUS, str(out)],
            "env": {"OMP_NUM_THREADS": "2"},
            "workdir": str(out),
            "time_limit_s": 120,
            **body,
        }
    )
    done = await e2e.wait_terminal([job])
    return done[job]


@pytest.mark.parametrize(
    ("body", "nodes", "per_node"),
    [
        pytest.param({"gpus": 16}, 4, 1, id="per-node"),
        pytest.param({"gpus": 8, "processes": "per_gpu"}, 2, 4, id="per-gpu"),
    ],
)
async def test_ranks_meet_with_the_contracts_variables_alone(
    open_stack: StackFactory, tmp_path: Path, body: dict[str, Any], nodes: int, per_node: int
) -> None:
    e2e = await open_stack(domains=1)
    job = await _run(e2e, tmp_path, **body)
    assert job["state"] == "succeeded", job
    world = nodes * per_node
    seen = [json.loads((tmp_path / str(r)).read_text()) for r in range(world)]
    assert {s["total"] for s in seen} == {sum(range(world))}  # every rank reached rank 0 and heard back
    allocation = [a["node"] for a in job["allocation"]]
    assert len(allocation) == nodes
    assert {s["RACKSCALE_NODELIST"] for s in seen} == {hostlist(allocation)}
    assert [s["NODE_RANK"] for s in seen] == [str(r // per_node) for r in range(world)]
    assert [s["LOCAL_RANK"] for s in seen] == [str(r % per_node) for r in range(world)]
    assert {(s["NNODES"], s["LOCAL_WORLD_SIZE"], s["GPUS_PER_NODE"]) for s in seen} == {
        (str(nodes), str(per_node), "4")
    }
    # one NVLink domain, and said so; the job's own env and workdir
    assert {(s["RACKSCALE_NVLINK_DOMAIN"], s["NCCL_MNNVL_ENABLE"]) for s in seen} == {("d00", "1")}
    assert {(s["OMP_NUM_THREADS"], s["cwd"]) for s in seen} == {("2", str(tmp_path))}


async def test_a_job_past_its_time_limit_fails_and_frees_its_gpus(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    job = await e2e.submit(
        {"name": "sleeper", "tenant": "a", "gpus": 8, "command": ["sleep", "600"], "time_limit_s": 1.0}
    )
    done = (await e2e.wait_terminal([job]))[job]
    assert (done["state"], done["reason"]) == ("failed", "time limit")

    async def freed() -> bool:
        view = await e2e.cluster()
        return not any(g.get("job") == job for d in view["domains"] for n in d["nodes"] for g in n["gpus"])

    await wait_until(freed, "the time-limited job's GPUs freed")
    again = await e2e.submit({"name": "after", "tenant": "a", "gpus": 72, "duration_s": 0.1})
    assert (await e2e.wait_terminal([again]))[again]["state"] == "succeeded"  # the whole domain was free
