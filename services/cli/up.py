"""`rackscale up`: the whole system in this process (`services.stack.Stack`) until Ctrl-C or SIGTERM.

NATS and Valkey are started embedded unless URLs are given (flags or RACKSCALE_NATS_URL/REDIS_URL); the
services run in-process, and a simulated fleet of agents (default 4 NVL72 domains = 72 nodes, 288 GPUs)
registers with inventory. On a signal every service drains, the agents stop their ranks, and the
embedded servers are stopped before the process exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from services.cli.client import DEFAULT_URL
from shared.settings import Settings, SettingsError

Out = Callable[[str], None]
LOG_LEVEL_ENV = "RACKSCALE_LOG_LEVEL"


@dataclass(frozen=True, slots=True)
class UpOptions:
    domains: int = 4
    nodes_per_domain: int = 18
    gpus_per_node: int = 4
    policy: str | None = None  # None: settings (RACKSCALE_POLICY, default rackscale)
    host: str | None = None
    port: int | None = None  # None: settings (RACKSCALE_GATEWAY_PORT, default 8080); 0: any free port
    nats_url: str | None = None
    redis_url: str | None = None
    log_level: str | None = None  # None: RACKSCALE_LOG_LEVEL, else WARNING (the terminal is for the URLs)
    log_dir: Path | None = None  # where ranks' output goes
    fleet_processes: int | None = None  # None: `fleet_processes_for` the fleet's size


# Up to this many nodes the simulated agents share the services' process; past it they run in child processes of
# this many nodes each at most (5,004 agents in one process with the services made their beats late: nodes flapped).
IN_PROCESS_NODES = 576
NODES_PER_FLEET_PROCESS = 1800
GATEWAY_START_S = 60.0  # a gateway in a child process answers within this (it's up in ~1-2 s)


def fleet_processes_for(nodes: int) -> int:
    """Child processes for a simulated fleet of `nodes` nodes (0: in the services' process)."""
    return 0 if nodes <= IN_PROCESS_NODES else -(-nodes // NODES_PER_FLEET_PROCESS)


def in_process_for(fleet_processes: int) -> tuple[str, ...]:
    """The services `up` runs in its own process. With a fleet big enough for child processes, the gateway gets one
    of its own, as deployed: in the shared event loop `/v1/cluster` waited behind the queue's full cycle
    (docs/performance.md, "The fleet at scale")."""
    services = ("inventory", "placement", "queue", "gateway")
    return services if fleet_processes == 0 else services[:-1]


class StartError(Exception):
    """`up` could not start; the message says why and what to do."""


def settings_for(opts: UpOptions, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the environment, overridden by the flags given."""
    try:
        base = Settings.from_env(env)
    except SettingsError as e:
        raise StartError(f"error: {e}") from None
    overrides = {
        "policy": opts.policy,
        "gateway_host": opts.host,
        "gateway_port": opts.port,
        "nats_url": opts.nats_url,
        "redis_url": opts.redis_url,
    }
    return dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})


def port_in_use(host: str, port: int) -> bool:
    """True when `host:port` can't be bound now (as the gateway binds it: SO_REUSEADDR)."""
    if port == 0:
        return False
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def port_taken_message(host: str, port: int) -> str:
    return (
        f"error: port {port} on {host} is already in use (another `rackscale up`?).\n"
        f"Pick another with --port N, or --port 0 for any free port."
    )


def _is_addr_in_use(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def cli_command(python: str, cwd: Path) -> str:
    """How to run the CLI from another terminal: the `rackscale` script installed beside this interpreter
    (a plain `python` there may lack the dependencies), relative to `cwd` when it is under it."""
    script = Path(python).with_name("rackscale.exe" if os.name == "nt" else "rackscale")
    if not script.exists():
        return f"{python} -m services.cli"
    try:
        rel = script.relative_to(cwd)
    except ValueError:
        return str(script)
    # a bare name would be looked up on PATH, not here
    return str(rel) if len(rel.parts) > 1 else os.curdir + os.sep + str(rel)


def banner(
    gateway_url: str, opts: UpOptions, settings: Settings, embedded: dict[str, bool], cli: str | None = None
) -> str:
    cli = cli or cli_command(sys.executable, Path.cwd())
    nodes = opts.domains * opts.nodes_per_domain
    kind = f"NVL{opts.nodes_per_domain * opts.gpus_per_node}"
    url_flag = "" if gateway_url == DEFAULT_URL else f" --url {gateway_url}"
    lines = [
        f"Rackscale is up: {opts.domains} {kind} domains, {nodes} nodes, {nodes * opts.gpus_per_node} GPUs "
        f"(simulated agents), policy {settings.policy}",
        f"  gateway  {gateway_url}   (API description: {gateway_url}/openapi.json)",
        f"  dashboard {gateway_url}/dashboard" + ("?token=<your token>" if settings.tokens_file else ""),
        f"  NATS     {settings.nats_url}" + (" (embedded)" if embedded["nats"] else ""),
        f"  Redis    {settings.redis_url}" + (" (embedded)" if embedded["redis"] else ""),
        (
            f"  access   bearer tokens from {settings.tokens_file}"
            if settings.tokens_file
            else "  access   OPEN: no RACKSCALE_TOKENS_FILE, so anyone who can reach the gateway may do anything "
            "(local use only)"
        ),
        "",
        "Try, from another terminal:",
        f"  {cli} submit --gpus 64 --name demo --tenant me --duration 30{url_flag}",
        f"  {cli} jobs{url_flag}",
        f"  {cli} cluster{url_flag}",
    ]
    if url_flag:
        lines.append(f"  (or export RACKSCALE_URL={gateway_url} and leave out --url)")
    lines += ["", "Ctrl-C stops everything."]
    return "\n".join(lines)


async def serve(opts: UpOptions, out: Out, stop: asyncio.Event | None = None) -> int:
    """Start the stack, print where it is, run until `stop` (set by SIGINT/SIGTERM), stop it; exit code."""
    from services.stack import FleetStartError, GatewayStartError, Stack, StackOptions  # heavy: only for `up`
    from shared.embedded import BinaryNotFoundError, ServerStartError

    settings = settings_for(opts)
    if port_in_use(settings.gateway_host, settings.gateway_port):
        raise StartError(port_taken_message(settings.gateway_host, settings.gateway_port))
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    embedded = {"nats": settings.nats_url is None, "redis": settings.redis_url is None}
    fleet_processes = (
        opts.fleet_processes
        if opts.fleet_processes is not None
        else fleet_processes_for(opts.domains * opts.nodes_per_domain)
    )
    stack = Stack(
        StackOptions(
            domains=opts.domains,
            nodes_per_domain=opts.nodes_per_domain,
            gpus_per_node=opts.gpus_per_node,
            settings=settings,
            log_dir=opts.log_dir,
            fleet_processes=fleet_processes,
            in_process=in_process_for(fleet_processes),
        )
    )
    try:
        out(f"starting Rackscale ({opts.domains} domains) ...")
        try:
            await stack.start()
            if "gateway" in stack.processes:
                await stack.wait_gateway(GATEWAY_START_S)
        except (BinaryNotFoundError, ServerStartError) as e:
            raise StartError(f"error: an embedded server did not start: {e}") from None
        except FleetStartError as e:
            raise StartError(f"error: the simulated agents did not come up: {e}") from None
        except GatewayStartError as e:
            raise StartError(f"error: {e}") from None
        except OSError as e:
            if _is_addr_in_use(e):
                raise StartError(port_taken_message(settings.gateway_host, settings.gateway_port)) from None
            raise StartError(f"error: could not start: {e}") from None
        out(banner(stack.gateway_url, opts, stack.settings, embedded))
        await stop.wait()
        out("stopping ...")
    finally:
        await stack.stop()
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    out("stopped")
    return 0


def run_up(opts: UpOptions, out: Out, err: Out) -> int:
    from shared.runtime import setup_logging

    if opts.domains < 1:
        err("error: --domains must be at least 1")
        return 2
    setup_logging(opts.log_level or os.environ.get(LOG_LEVEL_ENV, "").strip() or "WARNING")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        return asyncio.run(serve(opts, out))
    except StartError as e:
        err(str(e))
        return 1
    except KeyboardInterrupt:  # before the signal handlers were in place: nothing was started yet
        return 130
