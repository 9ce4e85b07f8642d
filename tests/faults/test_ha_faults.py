"""Faults of replicated servers under the mixed burst (issue 21), each on servers of the test's own (it breaks
them, whatever RACKSCALE_NATS_URL / RACKSCALE_REDIS_URL say), each judged by the history checker:

- a 3-node NATS cluster on loopback (every stream R3) whose JOBS stream leader is SIGKILLed: the system keeps
  serving on the two others without a restart of anything; nothing accepted is lost;
- a Valkey primary + replica + 3 Sentinels (`RACKSCALE_REDIS_URL` the `redis+sentinel://` URL) whose primary is
  SIGKILLed: the replica promoted, nothing lost, no GPU twice, 5xx only inside the failover's window;
- every Redis connection of the stack killed (`CLIENT KILL`) mid-burst: no 5xx answered to a request made
  more than 1 s after a kill (from the recorded requests' times).

Each fault is a class whose `nats_url` / `redis_url` fixtures override the session's for its test only.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import nats
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

import tests.e2e.conftest as e2e_conftest
from shared.embedded import EmbeddedNats, EmbeddedValkey
from shared.schemas import AGENT_COMMANDS, RankExited
from shared.settings import Settings
from tests.e2e.conftest import E2E, StackFactory
from tests.faults.burst import Burst
from tests.faults.harness import finish, under_burst
from tests.history import Recorder, Request, _t
from tests.servers import NatsCluster, SentinelSet

pytestmark = pytest.mark.asyncio

DOMAINS, NODES = 2, 18
FAULT_AFTER = 30  # jobs accepted before the fault


@pytest.fixture
def own_valkey() -> Iterator[EmbeddedValkey]:
    with EmbeddedValkey() as server:
        yield server


@pytest.fixture
def own_nats() -> Iterator[EmbeddedNats]:
    with EmbeddedNats() as server:
        yield server


def _unserved(requests: list[Request]) -> list[Request]:
    """Requests answered 5xx or not at all. A job read answered 503 "not recorded yet" is served: the job was
    accepted and its submit waits in the queue's inbox, so the answer is "retry", as the history checker takes it."""
    return [r for r in requests if (r.status == 0 or r.status >= 500) and not r.not_yet]


async def _explain(e2e: E2E, rec: Recorder, burst: Burst, jobs: dict[str, dict[str, Any]]) -> None:
    """For each job that did not succeed: its ask, its log (job events, StartRanks with their stream times,
    the agents' rank reports), against the fault windows: the evidence shown with a failure."""
    bad = [i for i, j in jobs.items() if j["state"] != "succeeded"]
    if not bad:
        return
    history = await rec.history(e2e.nc, e2e.names)
    starts = await e2e.stream(e2e.names.agent_cmd_all)
    print("faults:", "; ".join(str(f) for f in history.faults))
    for job in bad:
        print(f"job {job} {jobs[job]['state']} ({jobs[job]['reason']}); asked {burst.spec.get(job)}")
        for le in history.job_events:
            ev = le.event
            if ev.job_id == job:
                nodes = [n.node for n in ev.nodes]
                print(f"  event #{le.seq} {_t(le.at)}: {ev.state.value} attempt {ev.attempt} {nodes} {ev.reason!r}")
        for m in starts:
            cmd = AGENT_COMMANDS.decode(m.data)
            if getattr(cmd, "job_id", "") == job:
                print(f"  command {type(cmd).__name__} attempt {cmd.attempt} on {cmd.node} stored {_t(m.at)}")
        for r in history.rank_events:
            if r.job_id == job:
                print(f"  {type(r).__name__} attempt {r.attempt} rank {r.rank} on {r.node} at {_t(r.at)}", end="")
                print(f" ran {r.ran_s:.3f}s reason {r.reason!r} lost {r.lost}" if isinstance(r, RankExited) else "")


def _all_succeeded(jobs: dict[str, dict], accepted: list[str]) -> None:
    bad = {i: (j["state"], j["reason"]) for i, j in jobs.items() if j["state"] != "succeeded"}
    missing = set(accepted) - set(jobs)
    assert not bad and not missing, f"{len(missing)} jobs unknown, {len(bad)} did not succeed: {list(bad.items())[:10]}"


# -- 1. a NATS cluster losing a stream leader ---------------------------------------------------------------


class TestNatsCluster:
    @pytest_asyncio.fixture
    async def cluster(self) -> AsyncIterator[NatsCluster]:
        cluster = NatsCluster(3)
        await asyncio.to_thread(cluster.start)
        try:
            nc = await nats.connect(cluster.url.split(","), connect_timeout=5)
            try:
                await cluster.wait_ready(nc)
            finally:
                await nc.close()
            yield cluster
        finally:
            await asyncio.to_thread(cluster.stop)

    @pytest.fixture
    def nats_url(self, cluster: NatsCluster) -> str:
        # the harness's own connections; the stack's settings name every node (stack_on_every_node)
        return cluster.nodes[0].url

    @pytest.fixture
    def redis_url(self, own_valkey: EmbeddedValkey) -> str:
        return own_valkey.url

    @pytest.fixture(autouse=True)
    def stack_on_every_node(self, cluster: NatsCluster, monkeypatch: pytest.MonkeyPatch) -> None:
        """The stack's RACKSCALE_NATS_URL names every node (the services' Bus splits it); the harness's own
        connections (`nats.connect(nats_url)`, which takes no comma-separated list) get node 0 only."""
        settings = e2e_conftest.e2e_settings

        def on_cluster(nats_url: str, redis_url: str, prefix: str, **overrides: Any) -> Settings:
            return settings(cluster.url, redis_url, prefix, **{"stream_replicas": 3, **overrides})

        monkeypatch.setattr(e2e_conftest, "e2e_settings", on_cluster)

    async def test_nats_stream_leader_sigkilled_under_a_burst(
        self, open_stack: StackFactory, cluster: NatsCluster
    ) -> None:
        """The JOBS stream's leader (R3) SIGKILLed mid-burst and left down: the two others elect a leader, every
        service and agent moves to them by itself, every accepted job is readable and succeeds.

        Fails 2 runs in 8 (the checker itself passes): a job placed just as the leader dies has its StartRanks
        stored in AGENT only ~5 s later (no leader meanwhile), its ranks left out of the agents' reports past
        the reconcile grace (5 s), so inventory publishes them lost and an `on_node_failure: fail` job fails
        ("its agent on d00-n12 no longer runs it") though no node was lost."""
        e2e: E2E = await open_stack(domains=DOMAINS, nodes_per_domain=NODES)
        assert e2e.stack.settings.nats_url == cluster.url and e2e.stack.settings.stream_replicas == 3
        own = e2e.nc
        e2e.nc = await nats.connect(cluster.url.split(","), connect_timeout=5, max_reconnect_attempts=-1)
        await own.close()
        jobs_stream = e2e.names.stream_for(e2e.names.job_submit)
        info = await e2e.nc.jsm().stream_info(jobs_stream)
        assert info.config.num_replicas == 3, info.config
        victim = -1
        try:
            rec, burst = await under_burst(e2e, seed=21)
            async with burst:
                await burst.wait_accepted(FAULT_AFTER)
                victim = await cluster.stream_leader(e2e.nc, jobs_stream)
                async with rec.fault(f"sigkill nats node {victim} (leader of JOBS)", recovery_s=10):
                    await asyncio.to_thread(cluster.kill, victim)
                    new = await cluster.stream_leader(e2e.nc, jobs_stream)
                    assert new != victim
            jobs = await finish(e2e, rec, burst)
            await _explain(e2e, rec, burst, jobs)
            _all_succeeded(jobs, burst.accepted)
            fault = rec.faults[-1]
            unserved = _unserved(rec.requests)
            spread = [round(r.end - fault.start, 3) for r in unserved]
            first, last = min(spread, default=0), max(spread, default=0)
            print(f"{fault}: {len(unserved)} unserved, answered {first}-{last} s after the kill")
        finally:
            if victim >= 0 and not cluster.nodes[victim].running:
                await asyncio.to_thread(cluster.restart, victim)  # teardown deletes the streams through node 0


# -- 2. a Sentinel set failing over ---------------------------------------------------------------------------


class TestSentinelFailover:
    @pytest_asyncio.fixture
    async def sentinels(self) -> AsyncIterator[SentinelSet]:
        servers = SentinelSet()
        await asyncio.to_thread(servers.start)
        try:
            await servers.wait_ready()
            yield servers
        finally:
            await asyncio.to_thread(servers.stop)

    @pytest.fixture
    def nats_url(self, own_nats: EmbeddedNats) -> str:
        return own_nats.url

    @pytest.fixture
    def redis_url(self, sentinels: SentinelSet) -> str:
        return sentinels.url

    async def test_valkey_primary_sigkilled_under_a_burst(
        self, open_stack: StackFactory, sentinels: SentinelSet
    ) -> None:
        """The primary SIGKILLed mid-burst: the Sentinels promote the replica, the stack follows them (and catches
        the view up from the log where the replica was behind); nothing lost, no GPU twice, 5xx only inside
        the window (kill → the Sentinels name the new primary, +5 s)."""
        e2e: E2E = await open_stack(domains=DOMAINS, nodes_per_domain=NODES)
        rec, burst = await under_burst(e2e, seed=22)
        async with burst:
            await burst.wait_accepted(FAULT_AFTER)
            old = await sentinels.primary()
            async with rec.fault("sigkill valkey primary (Sentinel failover)"):
                await asyncio.to_thread(sentinels.primary_server.kill)
                new = await sentinels.wait_failover(old)
            assert sentinels.replica is not None and new == (sentinels.replica.host, sentinels.replica.port)
        jobs = await finish(e2e, rec, burst)
        await _explain(e2e, rec, burst, jobs)
        _all_succeeded(jobs, burst.accepted)
        fault = rec.faults[-1]
        unserved = _unserved(rec.requests)
        late = max((r.end - fault.end for r in unserved), default=None)
        print(f"{fault}: {len(unserved)} unserved, the last {late} s after the failover")
        for r in rec.requests:
            if r.status == 404:
                accepted = next((a.end for a in rec.requests if a.accepted and a.job_id == r.job_id), None)
                print(f"404: {r.method} {r.path} at {r.start:.3f}-{r.end:.3f}, accepted at {accepted}, {fault}")


# -- 3. every Redis connection killed -------------------------------------------------------------------------

KILLS = 3  # CLIENT KILL rounds, KILL_EVERY_S apart
KILL_EVERY_S = 2.0
ANSWER_WITHIN_S = 1.0  # the acceptance: no 503 more than 1 s after a kill


class TestRedisClientKill:
    @pytest.fixture
    def nats_url(self, own_nats: EmbeddedNats) -> str:
        return own_nats.url

    @pytest.fixture
    def redis_url(self, own_valkey: EmbeddedValkey) -> str:
        return own_valkey.url

    async def test_redis_connections_killed_under_a_burst(self, open_stack: StackFactory, redis_url: str) -> None:
        """`CLIENT KILL` of every client but the test's own, KILLS times mid-burst: the pools reconnect on the
        command that finds its connection broken, so no request made more than 1 s after a kill answers 5xx
        (before the clients retried: 503s for 20+ s after a broken pool)."""
        e2e: E2E = await open_stack(domains=DOMAINS, nodes_per_domain=NODES)
        admin = aioredis.from_url(redis_url)  # a plain client: the one the kill spares
        try:
            rec, burst = await under_burst(e2e, seed=23)
            kills: list[tuple[float, int]] = []
            async with burst:
                await burst.wait_accepted(FAULT_AFTER)
                for _ in range(KILLS):
                    async with rec.fault("CLIENT KILL every client", recovery_s=ANSWER_WITHIN_S):
                        at = time.time()
                        killed = int(await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))
                        killed += int(await admin.execute_command("CLIENT", "KILL", "TYPE", "pubsub", "SKIPME", "yes"))
                        kills.append((at, killed))
                    await asyncio.sleep(KILL_EVERY_S)
        finally:
            await admin.aclose()
        assert all(n > 0 for _, n in kills), f"a kill found no client: {kills}"
        jobs = await finish(e2e, rec, burst)
        await _explain(e2e, rec, burst, jobs)
        _all_succeeded(jobs, burst.accepted)
        late = []
        for r in _unserved(rec.requests):
            since = max((r.start - at for at, _ in kills if at <= r.start), default=None)
            if since is not None and since > ANSWER_WITHIN_S:
                late.append(f"{r.method} {r.path} made {since:.3f} s after a kill answered {r.status}")
        unserved = _unserved(rec.requests)
        print(f"kills {[n for _, n in kills]} clients; {len(unserved)} requests unserved in all")
        assert not late, f"{len(late)} requests made more than {ANSWER_WITHIN_S:g} s after a kill unserved: {late[:10]}"
