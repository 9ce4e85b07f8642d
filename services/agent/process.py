"""What a process running agents (`python -m services.agent`, `python -m services.fleet`) needs at start."""

from __future__ import annotations

import sys

from shared.runtime import Deps
from shared.settings import Settings, SettingsError

# Deps carries a Store, but agents never touch Redis: this client is never connected.
_UNUSED_REDIS = "redis://127.0.0.1:6379/0"


def agent_settings(prog: str) -> Settings:
    """Settings for a process of agents (one, or a simulated fleet); exits naming what is wrong."""
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        sys.exit(f"{prog}: {e}")
    if not settings.nats_url:
        sys.exit(f"{prog}: set RACKSCALE_NATS_URL (or use `rackscale up` for a simulated fleet)")
    return settings


async def agent_deps(settings: Settings, service: str) -> Deps:
    """Agents talk only to NATS: Deps carries a Store, but its client is never connected."""
    assert settings.nats_url
    redis_url = settings.redis_url or _UNUSED_REDIS
    return await Deps.connect(settings, service, settings.nats_url, redis_url, settings.names())
