"""Every service's /metrics after a workload, checked against what the API says (the whole system, real servers).

Each in-process service gets the `OpsServer` that `shared.runtime.run` starts on RACKSCALE_METRICS_PORT in
a deployment; the gateway also serves /metrics on its API port. The workload ends in a steady state
(long jobs running, one job pending, short ones done, one cancelled, a node drained), so the scraped
figures and the API's answers describe the same moment.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from shared.metrics import OpsServer
from tests.e2e.conftest import E2E, StackFactory, open_stack, wait_until  # noqa: F401 (open_stack: a fixture)

pytestmark = pytest.mark.asyncio

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards" / "rackscale.json"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


@pytest_asyncio.fixture
async def system(open_stack: StackFactory) -> AsyncIterator[tuple[E2E, dict[str, OpsServer]]]:  # noqa: F811
    e2e = await open_stack(domains=2)
    services = {**e2e.stack.services}
    assert e2e.stack.fleet is not None
    services["agent"] = e2e.stack.fleet
    ops = {
        name: await OpsServer(s.metrics_text, s.healthy, host="127.0.0.1", port=0).start()
        for name, s in services.items()
    }
    try:
        yield e2e, ops
    finally:
        for o in ops.values():
            await o.stop()


async def scrape(e2e: E2E, url: str) -> Samples:
    async with e2e.http.get(url) as r:
        assert r.status == 200, url
        assert r.headers["Content-Type"].startswith("text/plain")
        return parse(await r.text())


async def test_metrics_match_the_api_after_a_workload(system: tuple[E2E, dict[str, OpsServer]]) -> None:
    e2e, ops = system
    await e2e.wait_nodes(36)
    short = [await e2e.submit({"name": f"s{i}", "tenant": "alice", "gpus": 8, "duration_s": 0.3}) for i in range(2)]
    long_bob = await e2e.submit({"name": "lb", "tenant": "bob", "gpus": 64, "duration_s": 600})
    long_alice = await e2e.submit({"name": "la", "tenant": "alice", "gpus": 8, "duration_s": 600})
    doomed = await e2e.submit({"name": "c", "tenant": "bob", "gpus": 4, "duration_s": 600})
    await e2e.wait_terminal(short)
    for job in (long_bob, long_alice, doomed):
        await e2e.wait_state(job, {"running"})
    status, _ = await e2e.cancel(doomed)
    assert status == 202
    await e2e.wait_state(doomed, {"cancelled"})
    # 18 nodes in one domain: no domain has them free while bob's 16 and alice's 2 nodes run
    waiting = await e2e.submit({"name": "w", "tenant": "bob", "gpus": 72, "topology": {"nvlink": "required"}})
    await e2e.wait_state(waiting, {"pending"}, check=lambda j: bool(j["reason"]))
    await e2e.admin("d01-n17", "drain")

    jobs = await e2e.all_jobs()
    cluster = await e2e.cluster()
    gateway = await scrape(e2e, f"{e2e.url}/metrics")

    # the figures compared below (a pending job's reason and timestamps may move on: they aren't compared)
    def steady(js: dict[str, Any], c: dict[str, Any]) -> tuple[object, object]:
        nodes = [n for d in c["domains"] for n in d["nodes"]]
        gpus = [(n["name"], n["state"], [(g["health"], g["job"]) for g in n["gpus"]]) for n in nodes]
        return {i: (j["state"], j["tenant"]) for i, j in js.items()}, gpus

    assert steady(await e2e.all_jobs(), await e2e.cluster()) == steady(jobs, cluster), "the system was still changing"

    # jobs by state and tenant, the queue
    api_jobs = Counter((j["state"], j["tenant"]) for j in jobs.values())
    got_jobs = {dict(k)["state"] + "/" + dict(k)["tenant"]: v for k, v in series(gateway, "rackscale_jobs").items()}
    assert got_jobs == {f"{s}/{t}": float(n) for (s, t), n in api_jobs.items()}
    assert value(gateway, "rackscale_queue_depth") == sum(j["state"] == "pending" for j in jobs.values()) == 1
    assert value(gateway, "rackscale_queue_oldest_pending_seconds") >= 0

    # GPUs free/busy/down per domain, nodes by state, whole free nodes, large-job slots
    for d in cluster["domains"]:
        states: Counter[str] = Counter()
        whole = 0
        for n in d["nodes"]:
            for g in n["gpus"]:
                down = n["state"] == "down" or g["health"] == "down"
                states["down" if down else "busy" if g["job"] else "free"] += 1
            if n["state"] == "up" and all(g["job"] is None and g["health"] != "down" for g in n["gpus"]):
                whole += 1
        for state in ("free", "busy", "down"):
            assert value(gateway, "rackscale_gpus", domain=d["name"], state=state) == states[state], (d["name"], state)
        assert value(gateway, "rackscale_domain_free_nodes", domain=d["name"]) == whole
        assert value(gateway, "rackscale_large_job_slots", domain=d["name"]) == whole // 16
    nodes = [n for d in cluster["domains"] for n in d["nodes"]]
    for state in ("up", "draining", "down"):
        assert value(gateway, "rackscale_nodes", state=state) == sum(n["state"] == state for n in nodes)
    assert value(gateway, "rackscale_nodes", state="draining") == 1
    free = sum(value(gateway, "rackscale_gpus", domain=d["name"], state="free") for d in cluster["domains"])
    on_whole = 4 * sum(value(gateway, "rackscale_domain_free_nodes", domain=d["name"]) for d in cluster["domains"])
    # the drained node's GPUs are free but not placeable: neither whole-free nor counted in the ratio's base
    assert value(gateway, "rackscale_fragmentation_ratio") == pytest.approx(1 - on_whole / (free - 4), abs=1e-6)
    assert value(gateway, "rackscale_dead_letter_messages") == 0

    # each service's own endpoint: health, its spans, no dead letters
    started = [j for j in jobs.values() if j["state"] in ("running", "succeeded", "cancelled")]
    ranks = sum(len(j["allocation"]) for j in jobs.values() if j["state"] == "running") + 2 * 2 + 1  # ended: s0,s1,c
    per: dict[str, Samples] = {}
    for name, o in ops.items():
        async with e2e.http.get(f"{o.url}/healthz") as r:
            assert r.status == 200, name
        per[name] = await scrape(e2e, f"{o.url}/metrics")
        assert value(per[name], "rackscale_dead_letters_total", service=name) == 0, name
    assert value(per["placement"], "rackscale_placement_commits_total", outcome="ok") >= len(started)
    assert value(per["placement"], "rackscale_span_seconds_count", span="placement.commit") >= len(started)
    assert value(per["queue"], "rackscale_span_seconds_count", span="queue.decide") >= len(started)
    assert value(per["queue"], "rackscale_queue_wait_seconds_count") >= len(started)
    assert value(per["agent"], "rackscale_span_seconds_count", span="agent.start_rank") == ranks
    assert value(per["gateway"], "rackscale_span_seconds_count", span="gateway.submit") == len(jobs)
    assert ("rackscale_migrations_in_flight", ()) in per["migration"], "the migration service counts its moves"
    assert "rackscale_gpus" in {n for n, _ in per["gateway"]}, "the gateway's ops port serves the cluster too"
    assert "rackscale_gpus" not in {n for n, _ in per["queue"]}, "only the gateway exports cluster figures"

    # every metric the Grafana dashboard queries is one the services export
    exported = {n for samples in (gateway, *per.values()) for n, _ in samples}
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"rackscale_\w+", t["expr"])}
    assert queried and queried <= exported, f"the dashboard queries metrics nobody exports: {queried - exported}"


async def test_a_service_process_serves_metrics_and_health_on_its_port(
    open_stack: StackFactory,  # noqa: F811
) -> None:
    import socket

    with socket.socket() as sock:  # a free port for RACKSCALE_METRICS_PORT of the child process
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    e2e = await open_stack(domains=1, in_process=("inventory", "queue", "gateway"), settings={"metrics_port": port})
    assert "placement" in e2e.stack.processes  # `python -m services.placement`, through shared.runtime.run
    url = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        try:
            async with e2e.http.get(f"{url}/healthz") as r:
                return r.status == 200
        except OSError:
            return False

    await wait_until(healthy, "the placement process's /healthz")
    await e2e.wait_nodes(18)
    job = await e2e.submit({"name": "m", "tenant": "a", "gpus": 8, "duration_s": 0.2})
    await e2e.wait_state(job, {"succeeded"})
    samples = await scrape(e2e, f"{url}/metrics")
    assert value(samples, "rackscale_placement_commits_total", outcome="ok") >= 1
    assert value(samples, "rackscale_dead_letters_total", service="placement") == 0
