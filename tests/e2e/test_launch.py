"""Real distributed jobs on the running system (issue 22): ranks that find each other with the launch contract's
variables alone, one process per node or per GPU, and a time limit that stops a job.

The simulated fleet's nodes all run on this machine (their agents register `addr` 127.0.0.1), so a job's
real subprocess ranks meet over loopback TCP exactly as they would across nodes: rank 0 listens on
MASTER_ADDR:MASTER_PORT, every other rank connects and sends its rank, rank 0 sends back the sum, and every
rank prints it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from services.cli.main import main as cli_main
from shared import sse
from shared.launch import hostlist
from tests.e2e.conftest import E2E, StackFactory, wait_until
from tests.openapi_events import assert_conforms

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
    assert job["state"] == "succeeded" and job["end"] == "completed", job
    assert [(e["rank"], e["exit_code"], e["cause"]) for e in job["exits"]] == [
        (r, 0, "completed") for r in range(nodes)
    ]
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
    # every rank's line in the log, through the API and the CLI
    said = {f"rank {r} of {world}: total {sum(range(world))}\n" for r in range(world)}
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job['id']}/logs") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        lines = (await r.text()).splitlines(keepends=True)
    assert {line.split(": ", 1)[1] for line in lines} == said and len(lines) == world
    assert all(line.startswith(f"{line.split()[2]}: ") for line in lines)  # "<rank>: rank <rank> of ..."
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job['id']}/logs", params={"rank": 1}) as r:
        assert await r.text() == f"rank 1 of {world}: total {sum(range(world))}\n"
    out: list[str] = []
    code = await asyncio.to_thread(
        cli_main, ["logs", job["id"], "--tail", "1", "--rank", "0", "--url", e2e.url], out.append, out.append
    )
    assert (code, out) == (0, [f"rank 0 of {world}: total {sum(range(world))}"])


TOKENS = """
tokens:
  - {token: "alice-logs-token-000001", tenant: alice, role: user}
  - {token: "bob-logs-token-0000002", tenant: bob, role: user}
"""


async def test_follow_sends_lines_as_they_ship_until_the_job_ends_and_only_to_its_tenant(
    open_stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    e2e = await open_stack(domains=1, token="alice-logs-token-000001", settings={"tokens_file": str(tokens)})
    ticker = "import time\nfor i in range(6):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.3)"
    job = await e2e.submit({"name": "ticker", "tenant": "alice", "gpus": 4, "command": [sys.executable, "-c", ticker]})
    await e2e.wait_state(job, {"running", "succeeded"})
    events = await follow(e2e, job)  # the answer ends once the job has ended and its last lines shipped
    ticks = [f"tick {i}" for i in range(6)]
    assert [(e.event, msgspec.json.decode(e.data)) for e in events] == [
        *[("line", {"rank": 0, "text": t, "dropped": 0}) for t in ticks],
        ("end", {"state": "succeeded", "end": "completed"}),
    ]
    assert (await e2e.job(job))["state"] == "succeeded"
    async with e2e.http.get(f"{e2e.url}/openapi.json") as r:
        doc = await r.json()
    for ev in events:  # each as a schema-checking client reads it against the document
        assert_conforms(doc, "/v1/jobs/{id}/logs", ev)
    # a follower reconnecting after an event's id gets the lines after it, each once
    first = next(i for i, e in enumerate(events) if e.id is not None)
    again = await follow(e2e, job, last_event_id=events[first].id)
    assert [msgspec.json.decode(e.data)["text"] for e in again[:-1]] == ticks[first + 1 :]
    out: list[str] = []
    monkeypatch.setenv("RACKSCALE_TOKEN", "alice-logs-token-000001")
    code = await asyncio.to_thread(cli_main, ["logs", job, "-f", "--url", e2e.url], out.append, out.append)
    assert (code, out) == (0, [f"0: {t}" for t in ticks])
    fleet = e2e.stack.fleet  # the agents that wrote them go away: the logs stay (they are in JetStream)
    assert fleet is not None
    await fleet.stop()
    await fleet.deps.close()
    e2e.stack.fleet = None
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs", params={"tail": 2}) as r:
        assert (await r.text()).splitlines() == ["0: tick 4", "0: tick 5"]
    bob = {"Authorization": "Bearer bob-logs-token-0000002"}
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs", headers=bob) as r:
        assert r.status == 404  # another tenant's job: unknown, its logs too
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs", params={"tail": "-1"}) as r:
        assert r.status == 422 and (await r.json())["field"] == "tail"


async def follow(e2e: E2E, job: str, last_event_id: str | None = None) -> list[sse.Event]:
    """The events of GET logs?follow=true (rank 0) until the stream closes."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else None
    reader, events = sse.Reader(), []
    params = {"follow": "true", "rank": 0}
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs", params=params, headers=headers) as r:
        assert r.status == 200 and r.content_type == sse.MEDIA_TYPE
        async for raw in r.content:
            ev = reader.feed(raw.decode())
            if ev is not None:
                events.append(ev)
    return events


async def test_a_job_past_its_time_limit_fails_and_frees_its_gpus(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    job = await e2e.submit(
        {"name": "sleeper", "tenant": "a", "gpus": 8, "command": ["sleep", "600"], "time_limit_s": 1.0}
    )
    done = (await e2e.wait_terminal([job]))[job]
    assert (done["state"], done["reason"], done["end"]) == ("failed", "time limit", "time limit")
    assert [(e["signal"], e["cause"]) for e in done["exits"]][:1] == [("SIGTERM", "time limit")]

    async def freed() -> bool:
        view = await e2e.cluster()
        return not any(g.get("job") == job for d in view["domains"] for n in d["nodes"] for g in n["gpus"])

    await wait_until(freed, "the time-limited job's GPUs freed")
    again = await e2e.submit({"name": "after", "tenant": "a", "gpus": 72, "duration_s": 0.1})
    assert (await e2e.wait_terminal([again]))[again]["state"] == "succeeded"  # the whole domain was free


async def test_a_cancelled_jobs_ranks_each_say_they_were_cancelled(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    job = await e2e.submit({"name": "sleepers", "tenant": "a", "gpus": 8, "command": ["sleep", "600"]})
    await e2e.wait_state(job, {"running"})
    async with e2e.http.delete(f"{e2e.url}/v1/jobs/{job}") as r:
        assert r.status == 202

    async def both_told() -> dict[str, Any] | None:
        view = await e2e.job(job)
        return view if len(view["exits"]) == 2 else None

    done = await wait_until(both_told, "both ranks' exits recorded after the cancel")
    assert (done["state"], done["end"]) == ("cancelled", "cancelled")
    assert [(e["rank"], e["signal"], e["cause"]) for e in done["exits"]] == [
        (0, "SIGTERM", "cancelled"),
        (1, "SIGTERM", "cancelled"),
    ]
    out: list[str] = []
    assert await asyncio.to_thread(cli_main, ["job", job, "--url", e2e.url], out.append, out.append) == 0
    text = "\n".join(out)
    assert "rank 0 on " in text and text.count("SIGTERM (cancelled)") == 2, text  # each rank's exit, and why


SEGMENT_ENV = r"""
import json, os, sys
e = os.environ
json.dump({k: e.get(k) for k in ("RACKSCALE_SEGMENT", "RACKSCALE_DOMAIN", "RACKSCALE_NVLINK_DOMAIN")},
          open(os.path.join(sys.argv[1], e["RANK"]), "w"))
"""


async def test_a_flexible_job_starts_on_its_smaller_segments_and_its_ranks_are_told(
    open_stack: StackFactory, tmp_path: Path
) -> None:
    """Two domains of 18 nodes with 10 busy in each: no run of 16, two of 8. A 16-node job that accepts
    segments of 16 or 8 and is expected to run 60 s starts now on two 8s (waiting ~10 min for a 16 would end
    later); the job view, the CLI and every rank's RACKSCALE_SEGMENT say which layout it got."""
    e2e = await open_stack(domains=2)
    blockers = [
        await e2e.submit({"name": f"blocker{i}", "tenant": "a", "gpus": 40, "duration_s": 600}) for i in range(2)
    ]
    for b in blockers:
        await e2e.wait_state(b, {"running"})
    job = await e2e.submit(
        {
            "name": "flexible",
            "tenant": "a",
            "gpus": 64,
            "topology": {"segment": [16, 8]},
            "expected_runtime_s": 60,
            "command": [sys.executable, "-c", SEGMENT_ENV, str(tmp_path)],
            "time_limit_s": 120,
        }
    )
    done = (await e2e.wait_terminal([job]))[job]
    async with e2e.http.get(f"{e2e.url}/v1/jobs/{job}/logs") as r:
        assert done["state"] == "succeeded", await r.text()
    assert done["segment"] == 8 and done["topology"]["segment"] == [16, 8]
    domains = [a["domain"] for a in done["allocation"]]
    assert domains[:8] == [domains[0]] * 8 and domains[8:] == [domains[8]] * 8 and domains[0] != domains[8]
    seen = [json.loads((tmp_path / str(r)).read_text()) for r in range(16)]
    assert [s["RACKSCALE_SEGMENT"] for s in seen] == [str(r // 8) for r in range(16)]
    assert [s["RACKSCALE_DOMAIN"] for s in seen] == domains
    assert {s["RACKSCALE_NVLINK_DOMAIN"] for s in seen} == {None}  # the job spans two domains
    out: list[str] = []
    code = await asyncio.to_thread(cli_main, ["job", job, "--url", e2e.url], out.append, out.append)
    assert code == 0 and "segments of 16 or 8 nodes; this attempt has 8" in "\n".join(out), out
    for b in blockers:
        await e2e.cancel(b)
