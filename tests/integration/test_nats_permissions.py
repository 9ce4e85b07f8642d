"""The NATS permissions of the deploy files, enforced by a real nats-server, against the real services.

A server runs with `shared.permissions.authorization_conf()` (what deploy/nats/auth.conf and the k8s
ConfigMap carry); every service connects as its own user. A job goes all the way through (gateway →
queue → placement → agent → succeeded), a drain round-trips to inventory and a dry run to the queue with no permission
violation in any client's log or the server's: each service is allowed all it does. Then a service
tries what it must not do and is refused: each is allowed no more than it should.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import nats
import nats.errors
import nats.js.errors
import pytest
import pytest_asyncio

from services.stack import Stack, StackOptions
from shared.embedded import EmbeddedNats
from shared.names import Names
from shared.permissions import SERVICES, authorization_conf, password_env
from shared.runtime import Deps
from shared.settings import Settings
from tests.e2e.conftest import wait_until
from tests.integration.conftest import delete_redis_namespace

pytestmark = pytest.mark.asyncio

PASSWORDS = {s: uuid.uuid4().hex for s in SERVICES}


class AuthNats(EmbeddedNats):
    """The embedded server plus the generated authorization block; passwords defined as config variables."""

    def __init__(self, names: Names) -> None:
        super().__init__()
        self.names = names

    def _command(self, port: int) -> list[str]:
        cmd = super()._command(port)
        passwords = "".join(f'{password_env(s)}: "{pw}"\n' for s, pw in PASSWORDS.items())
        base = self.config_path.read_text()
        self.config_path.write_text(passwords + base + authorization_conf(self.names))
        return cmd

    def url_for(self, service: str) -> str:
        return f"nats://{service}:{PASSWORDS[service]}@{self.host}:{self.port}"


class PerUserStack(Stack):
    """The whole system, each service connected as its own NATS user."""

    def __init__(self, opts: StackOptions, server: AuthNats) -> None:
        super().__init__(opts)
        self.server = server

    async def _deps(self, name: str) -> Deps:
        s = self.settings
        return await Deps.connect(s, name, self.server.url_for(name), self.redis_url, s.names())


@pytest_asyncio.fixture
async def secured(redis_url: str, namespace: str) -> AsyncIterator[tuple[PerUserStack, AuthNats]]:
    names = Names(prefix=namespace)
    server = AuthNats(names).start()
    settings = Settings(
        prefix=namespace,
        nats_url=server.url_for("gateway"),  # Stack needs one; every service gets its own in _deps
        redis_url=redis_url,
        gateway_port=0,
        heartbeat_s=0.2,
        cycle_interval_s=0.2,
        missed_heartbeats=10,
    )
    stack = PerUserStack(StackOptions(domains=1, settings=settings), server)
    try:
        await stack.start()
        yield stack, server
    finally:
        await stack.stop()
        server.stop()
        await delete_redis_namespace(redis_url, namespace)


async def test_every_service_does_its_work_within_its_permissions(
    secured: tuple[PerUserStack, AuthNats], caplog: pytest.LogCaptureFixture
) -> None:
    stack, server = secured
    async with aiohttp.ClientSession() as http:
        url = stack.gateway_url

        async def nodes_up() -> int:
            async with http.get(f"{url}/v1/cluster") as r:
                c = await r.json()
            return sum(n["state"] == "up" for d in c["domains"] for n in d["nodes"]) == 18

        await wait_until(nodes_up, "18 nodes up")
        async with http.post(f"{url}/v1/jobs", json={"name": "p", "tenant": "a", "gpus": 8, "duration_s": 0.5}) as r:
            assert r.status == 202, await r.text()
            job = (await r.json())["id"]

        async def done() -> bool:
            async with http.get(f"{url}/v1/jobs/{job}") as r:
                return r.status == 200 and (await r.json())["state"] == "succeeded"

        await wait_until(done, f"job {job} succeeded under per-service NATS users")
        # a dependant: the queue reads the end it waited for back from the log (the last event on its subject)
        body = {"name": "d", "tenant": "a", "gpus": 4, "duration_s": 0.1, "dependency": f"afterok:{job}"}
        async with http.post(f"{url}/v1/jobs", json=body) as r:
            assert r.status == 202, await r.text()
            dependant = (await r.json())["id"]

        async def ran() -> bool:
            async with http.get(f"{url}/v1/jobs/{dependant}") as r:
                return r.status == 200 and (await r.json())["state"] == "succeeded"

        await wait_until(ran, f"job {dependant} (afterok:{job}) succeeded under per-service NATS users")
        async with http.post(f"{url}/v1/nodes/d00-n03/drain") as r:
            assert r.status == 200, await r.text()  # gateway → inventory request/reply, and inventory's answer
        async with http.post(f"{url}/v1/jobs?dry_run=true", json={"name": "d", "tenant": "a", "gpus": 4}) as r:
            assert r.status == 200, await r.text()  # gateway → queue leader request/reply, and the leader's answer

        # a move: migration → queue → placement → agents and back, with the migration record and its events
        body = {"name": "m", "tenant": "a", "gpus": 4, "checkpointable": True, "duration_s": 30}
        async with http.post(f"{url}/v1/jobs", json=body) as r:
            assert r.status == 202, await r.text()
            movable = (await r.json())["id"]

        async def view(attempt: int) -> dict[str, Any] | None:
            async with http.get(f"{url}/v1/jobs/{movable}") as r:
                v = await r.json()
            return v if r.status == 200 and v["state"] == "running" and v["attempt"] >= attempt else None

        first = await wait_until(lambda: view(1), f"job {movable} running")
        assert stack.fleet is not None
        backend = stack.fleet.agents[first["allocation"][0]["node"]].backend
        backend.set_health(first["allocation"][0]["gpus"][0], "down")  # type: ignore[attr-defined]
        await wait_until(lambda: view(2), f"job {movable} moved off its failed GPU")
    violations = [r.getMessage() for r in caplog.records if "permission" in str(r.exc_info or r.getMessage()).lower()]
    assert not violations, violations
    assert "Violation" not in server.log_tail(100_000), server.log_tail()


async def test_a_service_cannot_act_outside_its_permissions(secured: tuple[PerUserStack, AuthNats]) -> None:
    stack, server = secured
    names = stack.settings.names()
    errors: list[Exception] = []

    async def on_error(e: Exception) -> None:
        errors.append(e)

    agent = await nats.connect(server.url_for("agent"), error_cb=on_error, max_reconnect_attempts=0)
    try:
        js = agent.jetstream(timeout=1.0)
        # an agent cancelling a job: no ack comes back (the server drops the publish)
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)):
            await js.publish(names.job_cancel, b"\x80", timeout=1.0)
        # ... nor read another service's consumer, nor delete a stream
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await agent.request(f"$JS.API.STREAM.DELETE.{names.stream_for(names.job_submit)}", b"", timeout=1.0)
        await agent.subscribe(names.job_submit)
        await agent.flush()
        await asyncio.sleep(0.2)
    finally:
        await agent.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors
    log = server.log_tail(100_000)
    assert "Publish Violation" in log and "Subscription Violation" in log, log[-2000:]
    # the stream is still there
    queue = await nats.connect(server.url_for("queue"), max_reconnect_attempts=0)
    try:
        await queue.jetstream().stream_info(names.stream_for(names.job_submit))
    finally:
        await queue.close()
