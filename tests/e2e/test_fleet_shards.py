"""A simulated fleet in child processes of its own (`StackOptions.fleet_processes`, as `rackscale up` runs a large
one): each shard registers its domains' nodes through batched reports, takes only its own nodes' commands, and
a job spanning both shards runs on both."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import StackFactory

pytestmark = pytest.mark.asyncio


async def test_a_fleet_in_two_processes_comes_up_and_runs_a_job_across_both(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=2, fleet_processes=2)
    stack = e2e.stack
    assert stack.fleet is None and [p.poll() for p in stack.fleet_shards] == [None, None]  # both shards alive
    js, names = e2e.nc.jetstream(), stack.settings.names()
    version = e2e.nc.connected_server_version
    filtered = (version.major, version.minor) >= (2, 10)  # filter subjects came with NATS 2.10 (2.9 ignores them)
    for shard, domain in (("d0-d0", "d00"), ("d1-d1", "d01")):
        info = await js.consumer_info(names.stream_for(names.agent_cmd_all), names.consumer("agent", f"fleet-{shard}"))
        own = sorted(names.agent_cmd(f"{domain}-n{n:02d}") for n in range(18))
        assert sorted(info.config.filter_subjects or []) == (own if filtered else [])
    # all 144 GPUs: ranks on every node of both shards
    job = await e2e.submit({"name": "wide", "tenant": "t", "gpus": 144, "topology": {"segment": 18}, "duration_s": 1.0})
    done = await e2e.wait_state(job, {"succeeded", "failed"}, timeout=60)
    assert done["state"] == "succeeded", done
    assert {ng["node"][:3] for ng in done["allocation"]} == {"d00", "d01"}
