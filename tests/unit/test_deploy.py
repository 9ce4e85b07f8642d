"""The deploy files (docker-compose.yml, deploy/nats, deploy/k8s) against the code they deploy.

No Docker engine or cluster here: the files are parsed and checked for what would break at `up` or
`apply` time — every command exists in the package and parses, every variable is a setting and its value
is valid, ports and health checks match the settings, NATS users match services and their generated
permissions, every Kubernetes object validates against the Kubernetes schemas (kubernetes-validate, offline).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from services.gateway.auth import Tokens
from services.stack import SERVICES as STACK_SERVICES
from shared.embedded import find_nats_server
from shared.permissions import SERVICES as NATS_USERS
from shared.permissions import authorization_conf, k8s_configmap, password_env
from shared.settings import Settings
from shared.tenants import load_tenants

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
K8S_DIR = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.30"
SETTINGS_ENV = {row.env for row in Settings.describe()}
# a setting's port field by variable, for the port checks
GATEWAY_PORT_ENV, METRICS_PORT_ENV = "RACKSCALE_GATEWAY_PORT", "RACKSCALE_METRICS_PORT"
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} with the environment empty: the defaults the file ships with."""
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def rackscale_services() -> dict[str, dict[str, Any]]:
    return {name: s for name, s in COMPOSE["services"].items() if str(s.get("image", "")).startswith("rackscale")}


def env_of(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment as a mapping, so anchors merge"
    return {k: interpolate(str(v)) for k, v in env.items()}


def check_command(argv: list[str]) -> str:
    """`python -m services.X [args]` or the `rackscale` script: the module exists and its parser takes the args."""
    if argv[0] == "rackscale":
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        assert "rackscale" in scripts
        from services.cli.main import build_parser

        build_parser().parse_args(argv[1:])
        return "cli"
    assert argv[:2] == ["python", "-m"], argv
    module = argv[2]
    assert module.startswith("services."), argv
    assert importlib.util.find_spec(f"{module}.__main__") is not None, f"{module} has no __main__"
    args = argv[3:]
    if args:  # modules that take arguments parse them in build_parser() and run only under __main__
        parser: argparse.ArgumentParser = importlib.import_module(f"{module}.__main__").build_parser()
        parser.parse_args([a.replace("$(NODE_NAME)", "node-a") for a in args])
    return module.removeprefix("services.")


def check_env(env: dict[str, str], where: str) -> Settings:
    ours = {k for k in env if k.startswith(("RACKSCALE_", "OTEL_"))}
    assert ours <= SETTINGS_ENV, f"{where}: variables that aren't settings: {sorted(ours - SETTINGS_ENV)}"
    return Settings.from_env(env)  # raises SettingsError naming a bad value


# -- docker compose ----------------------------------------------------------------------------------------
def test_compose_runs_every_service_and_a_fleet() -> None:
    roles = {check_command(s["command"]) for s in rackscale_services().values()}
    assert set(STACK_SERVICES) <= roles, f"compose lacks {set(STACK_SERVICES) - roles}"
    assert "fleet" in roles or "agent" in roles


@pytest.mark.parametrize("name", sorted(rackscale_services()))
def test_compose_service_env_ports_and_health(name: str) -> None:
    service = rackscale_services()[name]
    env = env_of(service)
    settings = check_env(env, name)
    role = check_command(service["command"])
    # every service reaches NATS (as its own user) and, but for agents, Redis
    assert settings.nats_url, f"{name}: no RACKSCALE_NATS_URL"
    if role not in ("agent", "fleet"):
        assert settings.redis_url and urlsplit(settings.redis_url).hostname in COMPOSE["services"]
    user = "agent" if role in ("agent", "fleet") else role
    for url in settings.nats_url.split(","):
        u = urlsplit(url.strip())
        assert u.hostname in COMPOSE["services"], f"{name}: NATS host {u.hostname} is no compose service"
        assert u.username == user, f"{name} connects to NATS as {u.username}, not {user}"
    raw_url = str(service["environment"]["RACKSCALE_NATS_URL"])
    assert f"${{{password_env(user)}" in raw_url, f"{name}: the password must come from {password_env(user)}"
    # health checks probe the port the service listens on
    probe = " ".join(service["healthcheck"]["test"])
    port = int(re.search(r"127\.0\.0\.1:(\d+)/", probe).group(1))  # type: ignore[union-attr]
    if role == "gateway":
        assert port == settings.gateway_port and "/readyz" in probe
        assert settings.gateway_host == "0.0.0.0", "a container must listen beyond loopback"
        published = {int(str(p).split(":")[-1]) for p in service.get("ports", [])}
        assert settings.gateway_port in published
    else:
        assert port == settings.metrics_port and "/healthz" in probe
    assert service.get("restart") in ("unless-stopped", "always", "on-failure")
    for dep in service.get("depends_on", {}):
        assert dep in COMPOSE["services"], f"{name} depends on unknown service {dep}"
    if settings.trace_exporter == "otlp":
        assert urlsplit(settings.otlp_endpoint or "").hostname in COMPOSE["services"]
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            if target == settings.tokens_file:
                assert len(Tokens.load(ROOT / source)) > 0
            if target == settings.tenants_file:
                assert load_tenants(ROOT / source)
    if settings.tokens_file or settings.tenants_file:
        targets = {v.split(":")[1] for v in service.get("volumes", [])}
        for path in filter(None, (settings.tokens_file, settings.tenants_file)):
            assert path in targets, f"{name}: {path} is not mounted"


def nats_servers() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in COMPOSE["services"].items() if str(s.get("image", "")).startswith("nats:")}


def test_compose_nats_is_a_three_node_jetstream_cluster_with_every_service_user() -> None:
    servers = nats_servers()
    assert len(servers) == 3
    conf = (ROOT / "deploy" / "nats" / "nats.conf").read_text()
    routes = set(re.findall(r"nats-route://([\w-]+):6222", conf))
    assert routes == set(servers), "every server is a route of the cluster"
    assert "sync_interval: always" in conf
    for name, s in servers.items():
        assert s["command"][-2:] == ["--name", name]
        assert set(s["environment"]) == {password_env(u) for u in NATS_USERS}
    replicas = {Settings.from_env(env_of(s)).stream_replicas for s in rackscale_services().values()}
    assert replicas == {3}, "streams replicated over the cluster, the same count everywhere"


def test_nats_config_is_accepted_by_nats_server() -> None:
    server = next(iter(nats_servers().values()))
    env = {**os.environ, **{k: interpolate(str(v)) for k, v in server["environment"].items()}}
    conf = ROOT / "deploy" / "nats" / "nats.conf"
    out = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(conf), "--name", "nats-1"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_generated_permissions_are_the_ones_deployed() -> None:
    assert (ROOT / "deploy" / "nats" / "auth.conf").read_text() == authorization_conf(), (
        "deploy/nats/auth.conf is stale: python -m shared.permissions > deploy/nats/auth.conf"
    )
    assert (K8S_DIR / "nats-auth.yaml").read_text() == k8s_configmap(), (
        "deploy/k8s/nats-auth.yaml is stale: python -m shared.permissions --k8s > deploy/k8s/nats-auth.yaml"
    )


def test_dockerfile_installs_the_package_and_its_default_command_exists() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r'pip install "?\.\[nvml\]"?', text), "one image, with the agent's NVML extra"
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    check_command(cmd)
    for role in {check_command(s["command"]) for s in rackscale_services().values()}:
        assert (ROOT / "services" / role).is_dir()


# -- Kubernetes --------------------------------------------------------------------------------------------
def k8s_docs() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


DOCS = list(k8s_docs())


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


@pytest.mark.parametrize(("file", "doc"), DOCS, ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in DOCS])
def test_k8s_object_matches_the_kubernetes_schema(file: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kust = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    files = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kust["resources"]) == files


def workloads() -> dict[str, dict[str, Any]]:
    return {**by_kind("Deployment"), **by_kind("DaemonSet")}


def test_k8s_runs_every_service_with_replicas_where_the_design_allows() -> None:
    deployments = by_kind("Deployment")
    for name in STACK_SERVICES:
        assert name in deployments, f"no Deployment for {name}"
        assert deployments[name]["spec"]["replicas"] >= 2, f"{name}: every service runs replicated"
    agent = by_kind("DaemonSet")["agent"]["spec"]["template"]["spec"]
    container = agent["containers"][0]
    assert container["command"][3:5] == ["--backend", "nvml"]
    node_env = {e["name"]: e for e in container["env"]}["NODE_NAME"]
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "$(NODE_NAME)" in container["command"]
    terms = agent["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert any(e["key"] == "nvidia.com/gpu.clique" for t in terms for e in t["matchExpressions"])


@pytest.mark.parametrize("name", sorted(workloads()))
def test_k8s_workload_commands_env_and_probes(name: str, tmp_path: Path) -> None:
    spec = workloads()[name]["spec"]["template"]["spec"]
    configmaps, secrets = by_kind("ConfigMap"), by_kind("Secret")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for c in spec["containers"]:
        role = check_command(c["command"])
        env: dict[str, str] = {}
        for ref in c.get("envFrom", []):
            env.update(configmaps[ref["configMapRef"]["name"]]["data"])
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = secrets[ref["name"]]["stringData"][ref["key"]]
        settings = check_env(env, name)
        user = "agent" if role in ("agent", "fleet") else role
        assert settings.nats_url and all(urlsplit(u).username == user for u in settings.nats_url.split(","))
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        assert ports.get("metrics") == settings.metrics_port
        if role == "gateway":
            assert ports["http"] == settings.gateway_port and settings.gateway_host == "0.0.0.0"
        for probe in ("livenessProbe", "readinessProbe"):
            if probe in c:
                assert c[probe]["httpGet"]["port"] in ports
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        for path in filter(None, (settings.tokens_file, settings.tenants_file)):
            mount = mounts[str(Path(path).parent)]
            source = volumes[mount]
            key = Path(path).name
            if "configMap" in source:
                text = configmaps[source["configMap"]["name"]]["data"][key]
            else:
                text = secrets[source["secret"]["secretName"]]["stringData"][key]
            copy = tmp_path / key
            copy.write_text(text)
            if path == settings.tokens_file:
                assert len(Tokens.load(copy)) > 0
            else:
                load_tenants(copy)


def test_k8s_config_values_are_valid_settings() -> None:
    data = by_kind("ConfigMap")["rackscale-config"]["data"]
    settings = check_env(data, "rackscale-config")
    assert settings.stream_replicas == 3


def test_k8s_services_target_named_ports() -> None:
    for name, svc in by_kind("Service").items():
        pods = [w for w in workloads().values() if w["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]]
        assert pods, f"Service {name} selects no workload"
        names = {p["name"] for c in pods[0]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in names


def test_every_file_compose_mounts_exists() -> None:
    for name, service in COMPOSE["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


def test_prometheus_scrapes_every_service_on_its_metrics_port() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (sd,) = [sd for job in config["scrape_configs"] for sd in job["dns_sd_configs"]]
    services = rackscale_services()
    assert set(sd["names"]) == set(services)
    for name, service in services.items():
        assert Settings.from_env(env_of(service)).metrics_port == sd["port"], name


def test_grafana_dashboard_queries_name_metrics() -> None:
    dash = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "rackscale.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all("rackscale_" in e for e in exprs)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    # that each name is one the services export is checked against a live scrape in tests/integration/test_metrics.py
