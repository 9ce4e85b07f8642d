"""Settings from the environment: defaults, overrides, and errors that name the variable and the value."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from shared.settings import Settings, SettingsError

DEFAULTS: dict[str, Any] = {
    "nats_url": None,
    "redis_url": None,
    "cell": "c0",
    "prefix": "rackscale",
    "policy": "rackscale",
    "lend_reserved": "auto",
    "lend_min_nodes": 4,
    "usage_half_life_s": 604800.0,
    "heartbeat_s": 1.0,
    "missed_heartbeats": 3,
    "telemetry_s": 5.0,
    "health_rules_file": None,
    "fault_plan_file": None,
    "cycle_interval_s": 1.0,
    "gateway_host": "127.0.0.1",
    "gateway_port": 8080,
    "router_host": "127.0.0.1",
    "router_port": 8080,
    "cell_gateways": None,
    "jaeger_ui_url": "http://localhost:16686",
    "trace_exporter": "none",
    "otlp_endpoint": None,
    "stream_replicas": 1,
    "tokens_file": None,
    "tenants_file": None,
    "checkpoint_s": 0.5,
    "restore_s": 0.5,
    "migration_interval_s": 5.0,
    "migration_step_timeout_s": 30.0,
    "max_migrations": 4,
    "migration_gpu_hours": 64.0,
    "defrag": "on",
    "rebalance_spread_c": 8.0,
    "rebalance_hold_s": 60.0,
    "metrics_port": 0,
    "log_level": "INFO",
}


def test_defaults_with_empty_environment() -> None:
    assert dataclasses.asdict(Settings.from_env({})) == DEFAULTS
    assert Settings.from_env({}) == Settings()


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACKSCALE_CELL", "west-2")
    assert Settings.from_env().cell == "west-2"


@pytest.mark.parametrize(
    ("env", "value", "field", "expected"),
    [
        ("RACKSCALE_NATS_URL", "nats://127.0.0.1:4222", "nats_url", "nats://127.0.0.1:4222"),
        ("RACKSCALE_NATS_URL", "nats://a:4222,nats://b:4222", "nats_url", "nats://a:4222,nats://b:4222"),
        ("RACKSCALE_REDIS_URL", "redis://127.0.0.1:6379/0", "redis_url", "redis://127.0.0.1:6379/0"),
        ("RACKSCALE_REDIS_URL", "unix:///run/redis.sock", "redis_url", "unix:///run/redis.sock"),
        (
            "RACKSCALE_REDIS_URL",
            "redis+sentinel://s1:26379,s2/mymaster/0",
            "redis_url",
            "redis+sentinel://s1:26379,s2/mymaster/0",
        ),
        ("RACKSCALE_CELL", "c7", "cell", "c7"),
        ("RACKSCALE_PREFIX", "t1234abcd", "prefix", "t1234abcd"),
        ("RACKSCALE_POLICY", "block", "policy", "block"),
        ("RACKSCALE_LEND_RESERVED", "off", "lend_reserved", "off"),
        ("RACKSCALE_LEND_MIN_NODES", "16", "lend_min_nodes", 16),
        ("RACKSCALE_USAGE_HALF_LIFE_S", "3600", "usage_half_life_s", 3600.0),
        ("RACKSCALE_USAGE_HALF_LIFE_S", "0", "usage_half_life_s", 0.0),  # off
        ("RACKSCALE_HEARTBEAT_S", "0.25", "heartbeat_s", 0.25),
        ("RACKSCALE_MISSED_HEARTBEATS", "5", "missed_heartbeats", 5),
        ("RACKSCALE_TELEMETRY_S", "0.2", "telemetry_s", 0.2),
        ("RACKSCALE_HEALTH_RULES", "/etc/rackscale/health.yaml", "health_rules_file", "/etc/rackscale/health.yaml"),
        ("RACKSCALE_FAULT_PLAN", "faults.json", "fault_plan_file", "faults.json"),
        ("RACKSCALE_CYCLE_INTERVAL_S", "2", "cycle_interval_s", 2.0),
        ("RACKSCALE_GATEWAY_HOST", "0.0.0.0", "gateway_host", "0.0.0.0"),
        ("RACKSCALE_GATEWAY_PORT", "9000", "gateway_port", 9000),
        ("RACKSCALE_GATEWAY_PORT", "0", "gateway_port", 0),
        ("RACKSCALE_ROUTER_PORT", "8090", "router_port", 8090),
        (
            "RACKSCALE_CELL_GATEWAYS",
            "c0=http://gw-a:8080, west-2=https://gw-b/",
            "cell_gateways",
            (("c0", "http://gw-a:8080"), ("west-2", "https://gw-b")),
        ),
        ("RACKSCALE_JAEGER_UI_URL", "https://jaeger.example/", "jaeger_ui_url", "https://jaeger.example"),
        ("RACKSCALE_TRACE_EXPORTER", "OTLP", "trace_exporter", "otlp"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://jaeger:4317", "otlp_endpoint", "http://jaeger:4317"),
        ("RACKSCALE_LOG_LEVEL", "debug", "log_level", "DEBUG"),
        ("RACKSCALE_HEARTBEAT_S", " 2.5 ", "heartbeat_s", 2.5),  # surrounding blanks are ignored
    ],
)
def test_environment_overrides_one_field(env: str, value: str, field: str, expected: Any) -> None:
    settings = Settings.from_env({env: value})
    assert getattr(settings, field) == expected
    assert dataclasses.asdict(settings) == {**DEFAULTS, field: expected}


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_variable_means_unset(blank: str) -> None:
    assert Settings.from_env({"RACKSCALE_NATS_URL": blank, "RACKSCALE_HEARTBEAT_S": blank}) == Settings()


@pytest.mark.parametrize(
    ("env", "value", "reason"),
    [
        ("RACKSCALE_HEARTBEAT_S", "abc", "is not a number"),
        ("RACKSCALE_HEARTBEAT_S", "0", "must be a number > 0"),
        ("RACKSCALE_HEARTBEAT_S", "nan", "must be a number > 0"),
        ("RACKSCALE_CYCLE_INTERVAL_S", "-1", "must be a number > 0"),
        ("RACKSCALE_CYCLE_INTERVAL_S", "1s", "is not a number"),
        ("RACKSCALE_MISSED_HEARTBEATS", "2.5", "is not an integer"),
        ("RACKSCALE_MISSED_HEARTBEATS", "0", "must be an integer >= 1"),
        ("RACKSCALE_GATEWAY_PORT", "http", "is not a port number"),
        ("RACKSCALE_GATEWAY_PORT", "70000", "is not a port number"),
        ("RACKSCALE_JAEGER_UI_URL", "jaeger:16686", "is not an http:// or https:// URL"),
        ("RACKSCALE_JAEGER_UI_URL", "javascript:alert(1)", "is not an http:// or https:// URL"),
        ("RACKSCALE_NATS_URL", "localhost:4222", "is not a nats|tls|ws|wss URL"),
        ("RACKSCALE_NATS_URL", "redis://127.0.0.1:6379", "is not a nats|tls|ws|wss URL"),
        ("RACKSCALE_REDIS_URL", "nats://127.0.0.1:4222", "is not a redis|rediss|unix|redis+sentinel|redis+cluster URL"),
        ("RACKSCALE_REDIS_URL", "redis+sentinel://s1:26379/", "must name the service"),
        ("RACKSCALE_CELL", "{c0}", "is not a cell name"),
        ("RACKSCALE_CELL", "c.0", "is not a cell name"),
        ("RACKSCALE_PREFIX", "a.b", "is not a cell name"),
        ("RACKSCALE_CELL_GATEWAYS", "http://gw-a:8080", "entry 'http://gw-a:8080' is not cell=URL"),
        ("RACKSCALE_CELL_GATEWAYS", "c.1=http://gw-a:8080", "'c.1' is not a cell name"),
        ("RACKSCALE_CELL_GATEWAYS", "c1=gw-a:8080", "cell c1: 'gw-a:8080' is not an http:// or https:// URL"),
        ("RACKSCALE_CELL_GATEWAYS", "c1=http://a,c1=http://b", "a cell is named twice (c1, c1)"),
        ("RACKSCALE_POLICY", "best", "is not one of"),
        ("RACKSCALE_LEND_RESERVED", "yes", "is not one of auto, on, off"),
        ("RACKSCALE_LEND_MIN_NODES", "0", "must be an integer >= 1"),
        ("RACKSCALE_USAGE_HALF_LIFE_S", "-1", "must be a number >= 0"),
        ("RACKSCALE_USAGE_HALF_LIFE_S", "7d", "is not a number"),
        ("RACKSCALE_TRACE_EXPORTER", "jaeger", "is not one of none, console, otlp"),
        ("RACKSCALE_LOG_LEVEL", "loud", "is not one of"),
    ],
)
def test_bad_value_error_names_variable_and_value(env: str, value: str, reason: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({env: value})
    assert str(err.value).startswith(f"{env}={value!r} {reason}")


def test_error_message_reads_as_documented() -> None:
    with pytest.raises(SettingsError, match=re.escape("RACKSCALE_HEARTBEAT_S='abc' is not a number")):
        Settings.from_env({"RACKSCALE_HEARTBEAT_S": "abc"})


def test_every_bad_variable_is_reported_at_once() -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"RACKSCALE_HEARTBEAT_S": "abc", "RACKSCALE_GATEWAY_PORT": "-1"})
    assert "RACKSCALE_HEARTBEAT_S='abc'" in str(err.value)
    assert "RACKSCALE_GATEWAY_PORT='-1'" in str(err.value)


def test_unrelated_variables_are_ignored() -> None:
    assert Settings.from_env({"PATH": "/bin", "RACKSCALE_SOMETHING_ELSE": "x"}) == Settings()


def test_settings_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().cell = "c1"  # type: ignore[misc]


def test_describe_lists_every_field_once_with_its_variable_and_default() -> None:
    rows = Settings.describe()
    assert [r.field for r in rows] == [f.name for f in dataclasses.fields(Settings)]
    assert {r.field: r.default for r in rows} == DEFAULTS
    envs = [r.env for r in rows]
    assert len(set(envs)) == len(envs)
    assert envs[:2] == ["RACKSCALE_NATS_URL", "RACKSCALE_REDIS_URL"]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in envs
    assert all(r.kind and r.doc for r in rows)
