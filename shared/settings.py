"""Runtime settings from the environment.

Each setting is declared once, as a dataclass field carrying its environment variable, parser and default;
`Settings.from_env()` reads them and `Settings.describe()` returns the same table for docs. An empty or
blank variable counts as unset (compose files often pass `VAR=` for "not configured").
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Self
from urllib.parse import urlsplit

from shared.core.cycle import LEND_MIN_NODES
from shared.core.policies import RUNNABLE
from shared.core.usage import DEFAULT_HALF_LIFE_S
from shared.names import CELL_NAME, DEFAULT_CELL, Names
from shared.redis_client import parse_redis_url

__all__ = ["Setting", "Settings", "SettingsError"]


class SettingsError(ValueError):
    """A variable holds a value that cannot be used; the message names the variable and the value."""


class _Parser(NamedTuple):
    """Turns the raw string into the field's value or raises ValueError with the reason (no variable name)."""

    kind: str  # what the variable accepts, in words, for docs
    parse: Callable[[str], Any]


class Setting(NamedTuple):
    """One row of the settings table, as returned by `Settings.describe()`."""

    field: str
    env: str
    kind: str
    default: Any
    doc: str


def _number(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a number > 0")
    return value


def _non_negative(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError("must be a number >= 0")
    return value


def _count(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("is not an integer") from None
    if value < 1:
        raise ValueError("must be an integer >= 1")
    return value


def _port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("is not a port number") from None
    if not 0 <= value <= 65535:
        raise ValueError("is not a port number (0-65535, 0 picks a free one)")
    return value


def _url(*schemes: str) -> _Parser:
    def parse(raw: str) -> str:
        # NATS accepts a comma-separated server list; check each entry.
        for part in raw.split(","):
            url = urlsplit(part.strip())
            if url.scheme not in schemes or not (url.netloc or url.path):
                raise ValueError(f"is not a {'|'.join(schemes)} URL")
        return raw

    return _Parser(f"URL ({'|'.join(s + '://' for s in schemes)}); unset: start an embedded server", parse)


def _redis_url(raw: str) -> str:
    parse_redis_url(raw)  # the one parser of the forms (shared.redis_client); raises ValueError with the reason
    return raw


_REDIS_URL = _Parser(
    "URL (redis:// | rediss:// | unix:// | redis+sentinel://host:port,host:port/service/db | "
    "redis+cluster://host:port,host:port); "
    "unset: start an embedded server",
    _redis_url,
)


def _choice(*options: str, fold: Callable[[str], str] = str.lower) -> _Parser:
    def parse(raw: str) -> str:
        value = fold(raw)
        if value not in options:
            raise ValueError(f"is not one of {', '.join(options)}")
        return value

    return _Parser(" | ".join(options), parse)


def _cell(raw: str) -> str:
    if not CELL_NAME.fullmatch(raw):
        raise ValueError("is not a cell name (1-64 of A-Z a-z 0-9 _ -)")
    return raw


def _cell_gateways(raw: str) -> tuple[tuple[str, str], ...]:
    """`c0=http://a:8080,c1=http://b:8080` → ((cell, gateway URL), ...) in the order given (the first is the
    router's default cell for one-cell views)."""
    out: list[tuple[str, str]] = []
    for part in raw.split(","):
        cell, eq, url = (p.strip() for p in part.partition("="))
        if not eq:
            raise ValueError(f"entry {part.strip()!r} is not cell=URL")
        if not CELL_NAME.fullmatch(cell):
            raise ValueError(f"{cell!r} is not a cell name (1-64 of A-Z a-z 0-9 _ -)")
        try:
            out.append((cell, _web_url(url)))
        except ValueError as e:
            raise ValueError(f"cell {cell}: {url!r} {e}") from None
    cells = [c for c, _ in out]
    if len(set(cells)) != len(cells):
        raise ValueError(f"a cell is named twice ({', '.join(cells)})")
    return tuple(out)


def _text(raw: str) -> str:
    return raw


def _web_url(raw: str) -> str:
    url = urlsplit(raw)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise ValueError("is not an http:// or https:// URL")
    return raw.rstrip("/")


def _env(env: str, parser: _Parser | Callable[[str], Any], default: Any, doc: str, kind: str = "") -> Any:
    """A dataclass field whose metadata is its row in the settings table."""
    if not isinstance(parser, _Parser):
        parser = _Parser(kind, parser)
    return dataclasses.field(default=default, metadata={"env": env, "parser": parser, "doc": doc})


@dataclass(frozen=True, slots=True)
class Settings:
    nats_url: str | None = _env(
        "RACKSCALE_NATS_URL", _url("nats", "tls", "ws", "wss"), None, "NATS server(s); unset: embedded nats-server"
    )
    redis_url: str | None = _env(
        "RACKSCALE_REDIS_URL",
        _REDIS_URL,
        None,
        "Redis/Valkey: one server, a Sentinel set as redis+sentinel://h1:26379,h2:26379/mymaster/0 or a cluster "
        "as redis+cluster://h1:6379,h2:6379 (shared.redis_client); unset: embedded valkey-server",
    )
    cell: str = _env(
        "RACKSCALE_CELL",
        _cell,
        DEFAULT_CELL,
        "scheduling cell: the Redis hash tag {cell}, and in subjects and streams past the default one",
        kind="name",
    )
    prefix: str = _env(
        "RACKSCALE_PREFIX", _cell, "rackscale", "prefix of every subject, stream and Redis key", kind="name"
    )
    policy: str = _env(
        "RACKSCALE_POLICY",
        _choice(*RUNNABLE),
        "rackscale",
        "placement policy (shared.core.policies)",
    )
    lend_reserved: str = _env(
        "RACKSCALE_LEND_RESERVED",
        _choice("auto", "on", "off"),
        "auto",
        "queue: checkpointable jobs may borrow reservations' held nodes (auto: the policy's choice; off: Slurm's rule)",
    )
    lend_min_nodes: int = _env(
        "RACKSCALE_LEND_MIN_NODES",
        _count,
        LEND_MIN_NODES,
        "queue: jobs of fewer nodes never borrow reserved nodes",
        kind="integer >= 1",
    )
    usage_half_life_s: float = _env(
        "RACKSCALE_USAGE_HALF_LIFE_S",
        _non_negative,
        DEFAULT_HALF_LIFE_S,
        "queue: fair share with memory: tenants' GPU-seconds decay with this half-life (s; Slurm's "
        "PriorityDecayHalfLife; 0: off, only the GPUs held now count)",
        kind="number >= 0",
    )
    heartbeat_s: float = _env("RACKSCALE_HEARTBEAT_S", _number, 1.0, "agent heartbeat period (s)", kind="number > 0")
    missed_heartbeats: int = _env(
        "RACKSCALE_MISSED_HEARTBEATS", _count, 3, "heartbeats missed before a node is marked lost", kind="integer >= 1"
    )
    telemetry_s: float = _env(
        "RACKSCALE_TELEMETRY_S", _number, 5.0, "agent GPU telemetry period (s)", kind="number > 0"
    )
    health_rules_file: str | None = _env(
        "RACKSCALE_HEALTH_RULES",
        _text,
        None,
        "inventory: GPU health rules and hysteresis (YAML, shared.health); unset: the defaults",
        kind="path",
    )
    fault_plan_file: str | None = _env(
        "RACKSCALE_FAULT_PLAN", _text, None, "sim agents: scripted faults (YAML/JSON list of Fault)", kind="path"
    )
    cycle_interval_s: float = _env(
        "RACKSCALE_CYCLE_INTERVAL_S", _number, 1.0, "scheduling cycle period of the queue (s)", kind="number > 0"
    )
    gateway_host: str = _env("RACKSCALE_GATEWAY_HOST", _text, "127.0.0.1", "HTTP gateway bind address", kind="host")
    gateway_port: int = _env("RACKSCALE_GATEWAY_PORT", _port, 8080, "HTTP gateway port", kind="0-65535")
    router_host: str = _env("RACKSCALE_ROUTER_HOST", _text, "127.0.0.1", "router: HTTP bind address", kind="host")
    router_port: int = _env("RACKSCALE_ROUTER_PORT", _port, 8080, "router: HTTP port", kind="0-65535")
    cell_gateways: tuple[tuple[str, str], ...] | None = _env(
        "RACKSCALE_CELL_GATEWAYS",
        _cell_gateways,
        None,
        "router: each cell's gateway, `c0=http://gw-c0:8080,c1=http://gw-c1:8080` (the first: the default cell "
        "of one-cell views)",
        kind="cell=URL, comma-separated",
    )
    jaeger_ui_url: str = _env(
        "RACKSCALE_JAEGER_UI_URL",
        _web_url,
        "http://localhost:16686",
        "gateway dashboard: Jaeger UI base for a job's trace link",
        kind="URL (http:// | https://)",
    )
    trace_exporter: str = _env(
        "RACKSCALE_TRACE_EXPORTER", _choice("none", "console", "otlp"), "none", "where OpenTelemetry spans go"
    )
    otlp_endpoint: str | None = _env(
        "OTEL_EXPORTER_OTLP_ENDPOINT", _text, None, "OTLP collector (standard OTel variable)", kind="URL"
    )
    stream_replicas: int = _env(
        "RACKSCALE_STREAM_REPLICAS",
        _count,
        1,
        "JetStream replicas per stream (3 on a 3-node NATS cluster)",
        kind="integer >= 1",
    )
    tokens_file: str | None = _env(
        "RACKSCALE_TOKENS_FILE",
        _text,
        None,
        "gateway: bearer tokens → tenant and role (YAML); unset: open, local use only",
        kind="path",
    )
    tenants_file: str | None = _env(
        "RACKSCALE_TENANTS_FILE",
        _text,
        None,
        "queue: per-tenant GPU quota and fair-share weight; router: each tenant's home cell (YAML, shared.tenants)",
        kind="path",
    )
    checkpoint_s: float = _env(
        "RACKSCALE_CHECKPOINT_S",
        _number,
        0.5,
        "time a checkpoint takes (sim agents take this long; the migration planner's cost estimate)",
        kind="number > 0",
    )
    restore_s: float = _env(
        "RACKSCALE_RESTORE_S", _number, 0.5, "migration: estimated time a restore takes (s)", kind="number > 0"
    )
    migration_interval_s: float = _env(
        "RACKSCALE_MIGRATION_INTERVAL_S",
        _number,
        5.0,
        "migration: period of defragmentation planning and step checks (s); health events act at once",
        kind="number > 0",
    )
    migration_step_timeout_s: float = _env(
        "RACKSCALE_MIGRATION_STEP_TIMEOUT_S",
        _number,
        30.0,
        "migration: a move step (checkpoint, restore) not done this long is rolled back (s)",
        kind="number > 0",
    )
    max_migrations: int = _env(
        "RACKSCALE_MAX_MIGRATIONS", _count, 4, "migration: moves in flight at once", kind="integer >= 1"
    )
    migration_gpu_hours: float = _env(
        "RACKSCALE_MIGRATION_GPU_HOURS",
        _number,
        64.0,
        "migration: GPU-hours of moving (checkpoint + restore x GPUs) that defragmentation may start per hour",
        kind="number > 0",
    )
    defrag: str = _env(
        "RACKSCALE_DEFRAG", _choice("on", "off"), "on", "migration: defragmentation, consolidation, growth by moves"
    )
    rebalance_spread_c: float = _env(
        "RACKSCALE_REBALANCE_SPREAD_C",
        _number,
        8.0,
        "migration: a domain this much hotter than others at the same load sheds jobs (C; a large value: off)",
        kind="number > 0",
    )
    rebalance_hold_s: float = _env(
        "RACKSCALE_REBALANCE_HOLD_S",
        _number,
        60.0,
        "migration: how long the heat spread must last before a rebalancing move (s)",
        kind="number > 0",
    )
    metrics_port: int = _env(
        "RACKSCALE_METRICS_PORT", _port, 0, "port of a service's /metrics and /healthz (0: none)", kind="0-65535"
    )
    log_level: str = _env(
        "RACKSCALE_LOG_LEVEL",
        _choice("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", fold=str.upper),
        "INFO",
        "log level",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        """Read settings from `env` (default: os.environ); raises SettingsError listing every bad value."""
        source = os.environ if env is None else env
        values: dict[str, Any] = {}
        errors: list[str] = []
        for f in dataclasses.fields(cls):
            name: str = f.metadata["env"]
            raw = source.get(name, "").strip()
            if not raw:
                continue  # unset or blank: keep the default
            parser: _Parser = f.metadata["parser"]
            try:
                values[f.name] = parser.parse(raw)
            except ValueError as exc:
                errors.append(f"{name}={raw!r} {exc}")
        if errors:
            # All at once, so a misconfigured deployment is fixed in one round trip.
            raise SettingsError("; ".join(errors))
        return cls(**values)

    def names(self) -> Names:
        return Names(prefix=self.prefix, cell=self.cell)

    @property
    def pin_aware(self) -> bool:
        """While the migration service defragments, placement keeps the jobs its planner can't move together
        (`CycleConfig.pin_aware`, as `rackscale sim --migration on`): the queue's cycle and the planner alike."""
        return self.defrag == "on"

    @property
    def lend_checkpointable(self) -> bool | None:
        """`CycleConfig.lend_checkpointable` for the queue's cycle: None lets the policy choose (rackscale lends)."""
        return None if self.lend_reserved == "auto" else self.lend_reserved == "on"

    @classmethod
    def describe(cls) -> list[Setting]:
        """The settings table (field, variable, accepted values, default, meaning), in declaration order."""
        return [
            Setting(f.name, f.metadata["env"], f.metadata["parser"].kind, f.default, f.metadata["doc"])
            for f in dataclasses.fields(cls)
        ]
