"""Fault tests (issue 21): the e2e harness (tests/e2e/conftest.py) plus servers of the test's own.

Tests that kill a service run on the session's servers (`nats_url`, `redis_url`: RACKSCALE_NATS_URL /
RACKSCALE_REDIS_URL, else embedded). Tests that kill a server need their own, whatever those variables
say: such a module overrides the session's with them (`nats_url = own_nats_url`, `redis_url = own_redis_url`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from shared.embedded import EmbeddedNats, EmbeddedValkey
from tests.e2e.conftest import namespace, nats_url, open_stack, redis_url

__all__ = [
    "Servers",
    "namespace",
    "nats_url",
    "open_stack",
    "own_nats_url",
    "own_redis_url",
    "own_servers",
    "redis_url",
]


@dataclass
class Servers:
    nats: EmbeddedNats  # its JetStream store survives kill() + restart()
    valkey: EmbeddedValkey  # no persistence: restart() brings it back empty


@pytest_asyncio.fixture
async def own_servers(tmp_path: Path) -> AsyncIterator[Servers]:
    """A nats-server (store under tmp_path, fsync always) and a Valkey of this test's own, stopped after it."""
    servers = Servers(EmbeddedNats(store_dir=tmp_path / "jetstream"), EmbeddedValkey())
    try:
        await asyncio.to_thread(servers.nats.start)
        await asyncio.to_thread(servers.valkey.start)
        yield servers
    finally:
        await asyncio.to_thread(servers.valkey.stop)
        await asyncio.to_thread(servers.nats.stop)


@pytest.fixture
def own_nats_url(own_servers: Servers) -> str:
    return own_servers.nats.url


@pytest.fixture
def own_redis_url(own_servers: Servers) -> str:
    return own_servers.valkey.url
