"""Entry point shared by every service's `__main__`: settings, servers, dependencies, run."""

from __future__ import annotations

import asyncio
import sys

from shared.runtime import Deps, Service, run, setup_logging
from shared.settings import Settings, SettingsError


def main_for(service_cls: type[Service]) -> None:
    try:
        settings = Settings.from_env()
    except SettingsError as e:
        sys.exit(f"{service_cls.name}: {e}")
    if not settings.nats_url or not settings.redis_url:
        sys.exit(f"{service_cls.name}: set RACKSCALE_NATS_URL and RACKSCALE_REDIS_URL (or use `rackscale up`)")
    setup_logging(settings.log_level)

    async def go() -> None:
        names = settings.names()
        deps = await Deps.connect(settings, service_cls.name, settings.nats_url, settings.redis_url, names)
        await run(service_cls(deps))

    asyncio.run(go())
