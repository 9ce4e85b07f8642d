"""The agent against real NATS JetStream: commands in, real subprocesses, RankStarted/RankExited out.

Commands are published the way placement does (JetStream, `names.agent_cmd(node)`); events are read back
from the EVENTS stream. Waits poll with a deadline; no assertion depends on elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.agent.backends import SimBackend
from services.agent.fleet import AgentFleet, sim_fleet
from services.agent.service import AgentService
from shared.names import LOG_CHUNK_BYTES, LOG_CHUNKS_PER_RANK
from shared.rank_log import render
from shared.schemas import (
    AGENT_REPORTS,
    EVENTS,
    LOG_CHUNK,
    AgentRegister,
    Heartbeat,
    Launch,
    LogChunk,
    RankExited,
    RankStarted,
    RunningRank,
    StartRank,
    StopRank,
)
from shared.tracing import Tracer, make_provider
from tests import streams
from tests.integration.test_inventory import (
    DEAD_LETTERS,
    WAIT_S,
    FakeClock,
    Harness,
    open_harness,
    stream_messages,
    wait_for_messages,
    wait_record,
    wait_until,
)

pytestmark = pytest.mark.asyncio

NODE = "d00-n00"
ENV_VARS = ("CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK", "RACKSCALE_JOB_ID")


@pytest_asyncio.fixture
async def harness(
    nats_url: str, redis_url: str, namespace: str, nats_client: NatsClient, redis_client: aioredis.Redis
) -> AsyncIterator[Harness]:
    async with open_harness(nats_url, redis_url, namespace, nats_client, redis_client) as h:
        yield h


def start(
    command: list[str],
    *,
    job: str = "job-1",
    attempt: int = 1,
    node: str = NODE,
    duration_s: float = 0.0,
    launch: Launch | None = None,
) -> StartRank:
    return StartRank(
        launch=launch or Launch(),
        job_id=job,
        attempt=attempt,
        node=node,
        gpus=[1, 3],
        rank=2,
        world_size=4,
        master_addr="d00-n07",
        command=command,
        duration_s=duration_s,
    )


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def command(h: Harness, cmd: StartRank | StopRank | bytes, node: str = NODE) -> None:
    """Publish to the node's command subject as placement does (no msg id: every publish is stored)."""
    if isinstance(cmd, bytes):
        await h.nc.jetstream().publish(h.names.agent_cmd(node), cmd)
    else:
        await h.bus.publish(h.names.agent_cmd(node), cmd)


async def rank_events(h: Harness) -> list[RankStarted | RankExited]:
    return [
        e for e in await stream_messages(h, h.names.agent_events, EVENTS) if isinstance(e, RankStarted | RankExited)
    ]


async def wait_exit(h: Harness, job: str, count: int = 1) -> list[RankStarted | RankExited]:
    def done(msgs: list[Any]) -> bool:
        return sum(isinstance(e, RankExited) and e.job_id == job for e in msgs) >= count

    msgs = await wait_for_messages(h, h.names.agent_events, EVENTS, done, f"RankExited for {job}")
    return [e for e in msgs if isinstance(e, RankStarted | RankExited) and e.job_id == job]


async def wait_started(h: Harness, job: str) -> RankStarted:
    def done(msgs: list[Any]) -> bool:
        return any(isinstance(e, RankStarted) and e.job_id == job for e in msgs)

    msgs = await wait_for_messages(h, h.names.agent_events, EVENTS, done, f"RankStarted for {job}")
    return next(e for e in msgs if isinstance(e, RankStarted) and e.job_id == job)


async def wait_file(path: Path, check: Callable[[str], bool] = bool) -> str:
    async def probe() -> str | None:
        text = path.read_text() if path.exists() else ""
        return text if check(text) else None

    return await wait_until(probe, f"{path} to be written")


# -- StartRank / StopRank ---------------------------------------------------------------------------------


async def test_start_rank_runs_the_command_with_the_placement_env(harness: Harness, tmp_path: Path) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump({{k: os.environ[k] for k in {ENV_VARS!r}}}, open({str(out)!r}, 'w'))"
    await command(h, start(py(code)))
    started, exited = await wait_exit(h, "job-1")
    assert isinstance(started, RankStarted) and isinstance(exited, RankExited)
    assert (started.node, started.attempt, started.rank) == (NODE, 1, 2) and started.pid > 0
    assert (exited.node, exited.attempt, exited.rank, exited.exit_code, exited.reason) == (NODE, 1, 2, 0, "exited 0")
    assert exited.cause == "completed"
    assert json.loads(out.read_text()) == {
        "CUDA_VISIBLE_DEVICES": "1,3",
        "RANK": "2",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "d00-n07",
        "LOCAL_RANK": "0",
        "RACKSCALE_JOB_ID": "job-1",
    }


async def test_failing_command_reports_its_exit_code(harness: Harness) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    await command(h, start(py("raise SystemExit(7)")))
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and (exited.exit_code, exited.reason) == (7, "exited with code 7")
    assert exited.cause == "failed"

    await command(h, start(["/nonexistent/rackscale-no-such-binary"], job="job-2"))
    (only,) = await wait_exit(h, "job-2")  # never started: the exit alone
    assert isinstance(only, RankExited) and only.exit_code == 127 and "command not found" in only.reason


async def test_stop_rank_kills_a_long_sleep(harness: Harness) -> None:
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"), stop_grace_s=WAIT_S)
    await command(h, start(["sleep", "30"]))
    await wait_started(h, "job-1")
    assert [(r.job_id, r.attempt) for r in agent.held_ranks()] == [("job-1", 1)]
    await command(h, StopRank(job_id="job-1", node=NODE, reason="cancelled by user", cause="cancelled"))
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited)
    assert exited.exit_code == -signal.SIGTERM and exited.cause == "cancelled"
    assert exited.reason == "stopped (cancelled by user): killed by SIGTERM"
    assert agent.held_ranks() == []  # ended, and its exit stored


async def test_a_rank_past_its_time_limit_is_stopped_and_says_so(harness: Harness, tmp_path: Path) -> None:
    """SIGTERM at the limit; a rank that ignores it is killed after the stop grace. Only the outcome is asserted
    (no elapsed time): the exit is marked `time_limit`, and the queue fails the job with "time limit"."""
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"), stop_grace_s=0.3)
    await command(h, start(["sleep", "30"], launch=Launch(time_limit_s=0.3)))
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and exited.time_limit and exited.cause == "time limit"
    assert (exited.exit_code, exited.reason) == (-signal.SIGTERM, "stopped (time limit): killed by SIGTERM")
    ready = tmp_path / "ready"
    stubborn = (
        f"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open({str(ready)!r}, 'w'); time.sleep(30)"
    )
    await command(h, start(py(stubborn), job="job-2", launch=Launch(time_limit_s=1.0)))
    _, exited = await wait_exit(h, "job-2")
    assert ready.exists() and isinstance(exited, RankExited) and exited.time_limit
    assert exited.exit_code == -signal.SIGKILL
    # a simulated rank (no command) longer than its limit is stopped the same way; one within it is not
    await command(h, start([], job="job-3", duration_s=30.0, launch=Launch(time_limit_s=0.2)))
    await command(h, start([], job="job-4", duration_s=0.1, launch=Launch(time_limit_s=30.0)))
    (_, three), (_, four) = await wait_exit(h, "job-3"), await wait_exit(h, "job-4")
    assert isinstance(three, RankExited) and three.time_limit and three.exit_code == -signal.SIGTERM
    assert isinstance(four, RankExited) and not four.time_limit and four.exit_code == 0
    assert agent.held_ranks() == []


async def _log_chunks(h: Harness, job: str) -> list[LogChunk]:
    entries = await streams.read_stream(h.nc, h.names, h.names.job_logs(job))
    return [LOG_CHUNK.decode(e.data) for e in entries]


async def test_a_ranks_output_is_in_the_log_before_its_exit_is_told(harness: Harness) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    code = "import sys; print('one'); print('two', file=sys.stderr, flush=True); sys.stdout.write('three')"
    await command(h, start(py(code)))
    await wait_exit(h, "job-1")
    chunks = await _log_chunks(h, "job-1")
    assert {(c.job_id, c.attempt, c.rank, c.node) for c in chunks} == {("job-1", 1, 2, NODE)}
    lines = render(chunks, prefix=False)
    assert sorted(lines) == sorted(["one\n", "two\n", "three\n"]) and lines[-1] == "three\n"


async def test_a_rank_printing_20_mb_fast_finishes_and_its_log_keeps_the_newest_lines(harness: Harness) -> None:
    """The process never waits on its log (no time is asserted: that it ends, and what the log then holds)."""
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    code = (
        "import sys; w = sys.stdout.write\n"
        "for i in range(200_000): w(f'{i:08d} ' + 'x' * 91 + '\\n')\n"
        "print('END', flush=True)"
    )
    await command(h, start(py(code)))
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and exited.exit_code == 0
    chunks = await _log_chunks(h, "job-1")
    assert len(chunks) <= LOG_CHUNKS_PER_RANK  # the cap: the newest chunks of the rank
    lines = render(chunks, prefix=False)
    assert lines[-1] == "END\n" and lines[-2].startswith("00199999 ")
    markers = [line for line in lines if line.startswith("[rackscale: ")]
    assert markers and all("dropped" in m for m in markers)  # what is missing is said, not hidden
    assert sum(len(c.text) for c in chunks) <= LOG_CHUNKS_PER_RANK * LOG_CHUNK_BYTES
    numbers = [int(line[:8]) for line in lines if line[:8].isdigit()]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


async def test_redelivered_start_rank_runs_one_process(harness: Harness, tmp_path: Path) -> None:
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"))
    runs, release = tmp_path / "runs", tmp_path / "release"
    # appends a line per process, then waits for the test to let it finish
    code = (
        f"import os, time; open({str(runs)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        f"while not os.path.exists({str(release)!r}): time.sleep(0.01)"
    )
    cmd = start(py(code))
    await command(h, cmd)
    await command(h, cmd)  # redelivered while running
    started = await wait_started(h, "job-1")
    await wait_until(lambda: _processed(agent, h), "both deliveries handled")
    release.touch()
    await wait_exit(h, "job-1")
    await command(h, cmd)  # redelivered after the end: the exit is published again, nothing runs
    await wait_until(lambda: _consumer_idle(h), "the third delivery handled")
    assert (await wait_file(runs)).split() == [str(started.pid)]
    events = await rank_events(h)
    assert [type(e).__name__ for e in events] == ["RankStarted", "RankExited"]  # msg ids dedupe the re-publish


async def _consumer_idle(h: Harness) -> bool:
    info = await h.nc.jsm().consumer_info(h.names.stream_for(h.names.agent_cmd(NODE)), f"agent-{NODE}")
    return info.num_pending == 0 and info.num_ack_pending == 0


async def _processed(agent: AgentService, h: Harness) -> bool:
    return await _consumer_idle(h) and len(agent.runs) == 1


async def test_empty_command_on_a_sim_node_is_a_timer(harness: Harness) -> None:
    h = harness
    await h.agent(SimBackend(NODE, "d00"))
    await command(h, start([], duration_s=0.05))
    started, exited = await wait_exit(h, "job-1")
    assert isinstance(started, RankStarted) and started.pid == 0
    assert isinstance(exited, RankExited) and exited.exit_code == 0

    await command(h, start([], job="job-2", duration_s=3600))
    await wait_started(h, "job-2")
    await command(h, StopRank(job_id="job-2", node=NODE, reason="preempted", checkpoint=True))
    _, exited = await wait_exit(h, "job-2")
    assert isinstance(exited, RankExited) and exited.exit_code == -signal.SIGTERM
    assert exited.reason == "stopped (preempted (checkpoint)): killed by SIGTERM"


async def test_checkpoint_stop_is_acknowledged_and_a_stop_spares_newer_attempts(harness: Harness) -> None:
    """A move: StopRank(checkpoint) takes checkpoint_s on a sim node, then the exit says checkpointed with
    how long the rank ran (the queue's ack); a late stop of attempt 1 leaves the restored attempt 2 alone."""
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"))
    await command(h, start([], job="job-m", attempt=1, duration_s=3600))
    started = await wait_started(h, "job-m")
    await command(h, StopRank(job_id="job-m", node=NODE, reason="migrating", checkpoint=True, attempt=1, ack=True))
    _, exited = await wait_exit(h, "job-m")
    assert isinstance(exited, RankExited) and exited.checkpointed and not exited.lost, exited
    assert exited.ran_s >= agent.deps.settings.checkpoint_s, exited  # the checkpoint took its time
    assert exited.ran_s == pytest.approx(exited.at - started.at, abs=0.05), exited

    await command(h, start([], job="job-m", attempt=2, duration_s=3600))
    await wait_for_messages(
        h,
        h.names.agent_events,
        EVENTS,
        lambda msgs: any(isinstance(e, RankStarted) and e.attempt == 2 for e in msgs),
        "attempt 2 started",
    )
    await command(h, StopRank(job_id="job-m", node=NODE, reason="late release", attempt=1))
    await wait_until(lambda: _consumer_idle(h), "the late stop handled")
    assert agent.runs[("job-m", 2)].running
    await command(h, StopRank(job_id="job-m", node=NODE, reason="cancelled", attempt=2))
    last = (await wait_exit(h, "job-m", count=2))[-1]
    assert isinstance(last, RankExited) and last.attempt == 2 and not last.checkpointed, last


async def test_malformed_command_is_dead_lettered_and_the_agent_goes_on(harness: Harness) -> None:
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"))
    await command(h, b"\xc1 not msgpack")
    await command(h, msgspec.msgpack.encode({"type": "agent.start", "job_id": "x"}))  # fields missing
    await command(h, start(py("pass")))
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and exited.exit_code == 0
    assert agent.bus.dead_letters == 2
    letters = await wait_for_messages(h, h.names.dead_letter("agent"), DEAD_LETTERS, lambda m: len(m) == 2, "DLQ")
    assert [(d.service, d.subject) for d in letters] == [("agent", h.names.agent_cmd(NODE))] * 2
    assert letters[0].data == b"\xc1 not msgpack"
    assert "missing required field" in letters[1].error


async def test_command_for_another_node_is_ignored(harness: Harness) -> None:
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"))
    await command(h, start(py("pass"), node="d00-n01"), node=NODE)  # misrouted onto this node's subject
    await wait_until(lambda: _consumer_idle(h), "the command handled")
    assert agent.runs == {}


async def test_agent_stop_stops_its_ranks_and_reports_them(harness: Harness) -> None:
    h = harness
    agent = await h.agent(SimBackend(NODE, "d00"), stop_grace_s=WAIT_S)
    await command(h, start(["sleep", "30"]))
    await wait_started(h, "job-1")
    await agent.stop(grace_s=WAIT_S)
    _, exited = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and exited.reason == "stopped (agent stopped): killed by SIGTERM"
    assert exited.lost  # the queue requeues it like a node loss, instead of failing the job


# -- reports ------------------------------------------------------------------------------------------------


async def test_agent_registers_then_heartbeats_with_the_ranks_it_holds(harness: Harness) -> None:
    h = harness
    seen: list[AgentRegister | Heartbeat] = []

    async def collect(m: Msg) -> None:
        seen.append(AGENT_REPORTS.decode(m.data))

    for subject in (h.names.agent_register, h.names.agent_heartbeat):
        await h.nc.subscribe(subject, cb=collect)
    await h.nc.flush()
    backend = SimBackend(NODE, "d00", gpus=2)
    agent = await h.agent(backend, register_every=3)
    await command(h, start(["sleep", "30"]))
    await wait_started(h, "job-1")
    backend.set_health(1, "degraded")

    async def enough() -> bool:
        told = any(
            isinstance(r, Heartbeat) and r.ranks == [held] and r.gpus[1].health == "degraded" and r.boot_id == boot
            for r in seen
        )
        return told and len(seen) >= 7

    held = RunningRank("job-1", 1, 2, [1, 3])  # what `start` launches: rank 2 on GPUs 1 and 3
    boot = agent.boot_id

    await wait_until(enough, "a heartbeat naming the running job and the degraded GPU")
    # The very first report can beat this test's subscription to other connections (see Harness.until_serving),
    # so find the first registration among the first three reports.
    first = next(i for i, r in enumerate(seen[:3]) if isinstance(r, AgentRegister))
    reg = seen[first]
    assert isinstance(reg, AgentRegister) and (reg.node, reg.cluster_uuid, len(reg.gpus)) == (NODE, "d00", 2)
    kinds = [type(r).__name__ for r in seen[first : first + 4]]
    assert kinds == ["AgentRegister", "Heartbeat", "Heartbeat", "AgentRegister"]  # every 3rd beat registers
    later = [r for r in seen[first:] if isinstance(r, AgentRegister) and r.ranks]
    assert later and later[0].ranks == [held] and later[0].boot_id == boot  # registrations carry the ranks too


async def test_trace_context_continues_through_the_agent(harness: Harness) -> None:
    h = harness
    exporter = InMemorySpanExporter()
    upstream = Tracer(make_provider("placement", span_exporter=exporter), "placement")
    deps = await h.connect("agent")
    deps.tracer = Tracer(make_provider("agent", span_exporter=exporter), "agent")
    agent = AgentService(deps, SimBackend(NODE, "d00"))
    await h.start(agent)
    await asyncio.wait_for(agent.ready.wait(), WAIT_S)
    with upstream.span("placement.commit") as parent:
        await h.bus.publish(h.names.agent_cmd(NODE), start(py("pass")), headers=upstream.headers())
    await wait_exit(h, "job-1")
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "agent.start_rank"]
    assert span.context.trace_id == parent.get_span_context().trace_id


# -- agent + inventory, and a fleet in one process ----------------------------------------------------------


async def test_fleet_registers_every_node_and_runs_commands(harness: Harness) -> None:
    h = harness
    inv = await h.inventory(FakeClock())
    fleet = AgentFleet(await h.connect("agent"), sim_fleet(1, nodes_per_domain=3, gpus=4))
    await h.start(fleet)
    await asyncio.wait_for(fleet.ready.wait(), WAIT_S)
    for node in ("d00-n00", "d00-n01", "d00-n02"):
        rec = await wait_record(inv, node)
        assert (rec.domain, rec.gpus, rec.state) == ("d00", 4, "up")
    for i, node in enumerate(("d00-n00", "d00-n02")):
        await command(h, start(py("pass"), job=f"job-{i}", node=node), node=node)
    for i, node in enumerate(("d00-n00", "d00-n02")):
        _, exited = await wait_exit(h, f"job-{i}")
        assert isinstance(exited, RankExited) and (exited.node, exited.exit_code) == (node, 0)
    await command(h, start(py("pass"), job="job-x", node="d09-n09"), node="d09-n09")

    async def misrouted() -> bool:
        return fleet.misrouted == 1

    await wait_until(misrouted, "the command for a node the fleet doesn't run")


async def test_fleet_shards_take_only_their_own_nodes_commands_and_send_reports_in_batches(harness: Harness) -> None:
    h = harness
    inv = await h.inventory(FakeClock())
    shards = [
        AgentFleet(await h.connect("agent"), sim_fleet(1, nodes_per_domain=18, first_domain=d), shard=f"d{d}")
        for d in (0, 1)
    ]
    for fleet in shards:
        await h.start(fleet)
        await asyncio.wait_for(fleet.ready.wait(), WAIT_S)
    for node in ("d00-n00", "d00-n17", "d01-n00", "d01-n17"):
        assert (await wait_record(inv, node)).state == "up"
    await command(h, start(py("pass"), job="job-1", node="d01-n02"), node="d01-n02")
    (_, exited) = await wait_exit(h, "job-1")
    assert isinstance(exited, RankExited) and (exited.node, exited.exit_code) == ("d01-n02", 0)
    # filter subjects came with NATS 2.10: there shard d0's consumer never takes d01-n02's command; an older server
    # (a dev machine's 2.9) ignores them, and shard d0 passes it over on its own consumer
    version = h.nc.connected_server_version
    filtered = (version.major, version.minor) >= (2, 10)
    assert [await f.takes_own_commands_only() for f in shards] == [filtered, filtered]
    assert [f.misrouted for f in shards] == ([0, 0] if filtered else [1, 0])
    # 18 nodes' registrations went out as one message, and their beats share messages by slot of the period
    reports = sum(a.beats + a.samples for f in shards for a in f.agents.values())
    assert 0 < sum(f.sent for f in shards) < reports
