"""The `rackscale` CLI without a running system: argument parsing, the /v1/cluster picture, error printing.

The cluster used for the picture (one row per NVLink domain, one cell per GPU, 4 per node):

    d00  n00: job A on GPUs 0-3   n01: job B on 0-1, 2-3 free   n02: draining, free   n03: down
    d01  n00: GPU 1 degraded, GPU 3 down                          n01: job A on 0-3 (A spans domains)

HTTP answers come from a small canned server on a loopback port (no gateway, no NATS, no Redis).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from services.cli import commands
from services.cli.client import DEFAULT_URL, ApiError, Client, CliError, api_error, default_url, format_api_error
from services.cli.cluster import cluster_state, decode_cluster, draw_cluster
from services.cli.main import build_parser, main
from services.cli.up import UpOptions, banner, cli_command, port_in_use, run_up, settings_for
from services.gateway.views import cluster_view
from shared.core.topology import NodeState
from shared.schemas import AllocationRecord, NodeGpus, NodeRecord
from shared.settings import Settings

JOB_A = "a" * 32
JOB_B = "b" * 32

# -- parsing ---------------------------------------------------------------------------------------------------


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_submit_every_flag_becomes_its_body_field() -> None:
    args = parse(
        "submit", "--gpus", "64", "--name", "train", "--tenant", "me", "--gpus-per-node", "4", "--nvlink", "preferred",
        "--segment", "8", "--level", "domain", "--priority", "5", "--checkpointable", "--exclusive", "--duration", "30",
        "--expected-runtime", "600", "--on-node-failure", "fail", "--idempotency-key", "k-1", "--url", "http://h:1",
        "--time-limit", "3600", "--env", "OMP_NUM_THREADS=8", "--env", "OPTS=a=b", "--workdir", "/shared/run",
        "--per-gpu", "--slurm-env",
    )  # fmt: skip
    assert args.url == "http://h:1" and args.idempotency_key == "k-1"
    assert commands.job_body(args) == {
        "name": "train",
        "tenant": "me",
        "gpus": 64,
        "gpus_per_node": 4,
        "topology": {"nvlink": "preferred", "segment": 8, "level": "domain"},
        "priority": 5,
        "checkpointable": True,
        "exclusive": True,
        "duration_s": 30.0,
        "expected_runtime_s": 600.0,
        "on_node_failure": "fail",
        "time_limit_s": 3600.0,
        "env": {"OMP_NUM_THREADS": "8", "OPTS": "a=b"},
        "workdir": "/shared/run",
        "processes": "per_gpu",
        "slurm_env": True,
    }


def test_submit_flexible_segments_and_an_elastic_range() -> None:
    args = parse("submit", "--gpus", "256", "--tenant", "me", "--segment", "16,8", "--checkpointable")
    assert commands.job_body(args)["topology"] == {"segment": [16, 8]}
    args = parse("submit", "--gpus", "256", "--tenant", "me", "--min-gpus", "64", "--checkpointable")
    assert commands.job_body(args)["min_gpus"] == 64


@pytest.mark.parametrize("bad", ["16,x", "16,0", ""])
def test_submit_refuses_a_bad_segment_list(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("submit", "--gpus", "64", "--segment", bad)
    assert "--segment" in capsys.readouterr().err


def test_submit_sends_only_what_was_given_and_the_command_after_double_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RACKSCALE_TENANT", "team-x")
    args = parse("submit", "--gpus", "8", "--", "/usr/bin/python3", "-c", "print(1)", "--lr", "0.1")
    assert commands.job_body(args) == {
        "name": "python3",  # the command's name when --name is left out
        "tenant": "team-x",
        "gpus": 8,
        "command": ["/usr/bin/python3", "-c", "print(1)", "--lr", "0.1"],
    }
    assert commands.job_body(parse("submit", "--gpus", "1"))["name"] == "job"


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--gpus", "0"],
        ["submit", "--gpus", "x"],
        ["submit", "--gpus", "1", "--nvlink", "sometimes"],
        ["submit", "--gpus", "1", "--env", "NOEQUALS"],
        ["submit", "--gpus", "1", "--env", "=x"],
        ["submit", "--gpus", "1", "--time-limit", "soon"],
        ["submit", "--gpus", "1", "--duration", "-1"],
        ["submit", "--gpus", "1", "--on-node-failure", "retry"],
        ["jobs", "--state", "sleeping"],
        ["jobs", "--limit", "0"],
        ["job"],
        ["drain"],
        ["up", "--port", "70000"],
        ["up", "--domains", "0"],
        ["up", "--policy", "nope"],
        [],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_up_gives_a_large_fleet_and_the_gateway_processes_of_their_own() -> None:
    from services.cli.up import fleet_processes_for, in_process_for

    assert fleet_processes_for(4 * 18) == 0 and "gateway" in in_process_for(0)
    shards = fleet_processes_for(278 * 18)  # 5,004 nodes: at most 1,800 a process
    assert shards == 3 and in_process_for(shards) == ("inventory", "placement", "queue")


def test_up_and_demo_defaults() -> None:
    up = parse("up")
    assert (up.domains, up.policy, up.port, up.nats_url, up.redis_url) == (4, None, None, None, None)
    up = parse("up", "--domains", "1", "--port", "0", "--policy", "flat", "--nats-url", "nats://x:1")
    assert (up.domains, up.port, up.policy, up.nats_url) == (1, 0, "flat", "nats://x:1")
    demo = parse("demo", "--ticks", "2")
    assert (demo.domains, demo.policy, demo.ticks, demo.interval) == (4, "rackscale", 2, 1.0)


def test_jobs_and_admin_arguments() -> None:
    js = parse("jobs", "--tenant", "me", "--state", "running", "--limit", "10")
    assert (js.tenant, js.state, js.limit, js.offset) == ("me", "running", 10, 0)
    assert parse("job", "abc").id == "abc"
    assert parse("cancel", "abc").id == "abc"
    d = parse("drain", "d00-n01", "--reason", "bad fan")
    assert (d.node, d.reason) == ("d00-n01", "bad fan")
    assert parse("undrain", "d00-n01").node == "d00-n01"
    # through a router over several cells: which cell (none: the lists span every cell)
    assert (parse("drain", "d00-n01", "--cell", "c1").cell, parse("cluster").cell) == ("c1", None)
    assert parse("jobs", "--cell", "west-2").cell == "west-2" and parse("migrations", "--cell", "c0").cell == "c0"


def test_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RACKSCALE_URL", raising=False)
    assert default_url() == DEFAULT_URL == parse("jobs").url
    monkeypatch.setenv("RACKSCALE_URL", "http://10.0.0.5:9000")
    assert parse("cluster").url == "http://10.0.0.5:9000"
    assert parse("cluster", "--url", "http://other:1").url == "http://other:1"


def test_up_flags_override_the_environment() -> None:
    env = {"RACKSCALE_GATEWAY_PORT": "9999", "RACKSCALE_POLICY": "flat", "RACKSCALE_NATS_URL": "nats://n:4222"}
    s = settings_for(UpOptions(port=0, redis_url="redis://r:6379/0"), env)
    assert (s.gateway_port, s.policy, s.nats_url, s.redis_url) == (0, "flat", "nats://n:4222", "redis://r:6379/0")
    assert settings_for(UpOptions(), {}).gateway_port == 8080


def test_up_banner_prints_the_url_and_a_submit_command() -> None:
    s = Settings(nats_url="nats://127.0.0.1:1", redis_url="redis://127.0.0.1:2/0")
    text = banner("http://127.0.0.1:5555", UpOptions(domains=4), s, {"nats": True, "redis": False})
    assert "dashboard http://127.0.0.1:5555/dashboard" in text
    assert "4 NVL72 domains, 72 nodes, 288 GPUs" in text
    assert "gateway  http://127.0.0.1:5555" in text
    assert "submit --gpus 64 --name demo --tenant me --duration 30 --url http://127.0.0.1:5555" in text
    assert "nats://127.0.0.1:1 (embedded)" in text and "(embedded)" not in text.split("Redis")[1].split("\n")[0]
    both = {"nats": True, "redis": True}
    assert "--url" not in banner(DEFAULT_URL, UpOptions(), s, both)
    with_cli = banner("http://127.0.0.1:5555", UpOptions(), s, both, "rack")
    assert "\n  rack jobs --url http://127.0.0.1:5555\n" in with_cli


def test_up_suggests_the_cli_installed_beside_its_interpreter(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = str(bin_dir / "python")
    # no script there: the interpreter itself runs the module (not a bare `python`, which may lack the deps)
    assert cli_command(python, tmp_path) == f"{python} -m services.cli"
    script = bin_dir / ("rackscale.exe" if os.name == "nt" else "rackscale")
    script.write_text("")
    assert cli_command(python, tmp_path) == str(Path("venv") / "bin" / script.name)  # relative under cwd
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    assert cli_command(python, elsewhere) == str(script)
    assert cli_command(python, bin_dir) == os.curdir + os.sep + script.name  # not a bare name: PATH isn't here


def test_up_on_a_taken_port_says_so_and_suggests_port_0(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
        code = run_up(UpOptions(domains=1, port=port, log_level="ERROR"), print, print)
    assert code == 1
    out = capsys.readouterr().out
    assert f"port {port} on 127.0.0.1 is already in use" in out and "--port 0" in out
    assert not port_in_use("127.0.0.1", 0)


# -- the cluster picture ----------------------------------------------------------------------------------------


def sample_cluster_json() -> bytes:
    """A /v1/cluster document as the gateway builds it (views.cluster_view over store records)."""
    nodes = [
        NodeRecord(name="d00-n00", domain="d00"),
        NodeRecord(name="d00-n01", domain="d00"),
        NodeRecord(name="d00-n02", domain="d00", state="draining", drained=True, reason="bad fan"),
        NodeRecord(name="d00-n03", domain="d00", state="down", reason="missed 3 heartbeats"),
        NodeRecord(name="d01-n00", domain="d01", gpu_health={"1": "degraded", "3": "down"}),
        NodeRecord(name="d01-n01", domain="d01", clique=1),
    ]
    allocs = [
        AllocationRecord(
            job_id=JOB_A, attempt=1, nodes=[NodeGpus("d00-n00", [0, 1, 2, 3]), NodeGpus("d01-n01", [0, 1, 2, 3])],
            committed_at=1.0,
        ),
        AllocationRecord(job_id=JOB_B, attempt=1, nodes=[NodeGpus("d00-n01", [0, 1])], committed_at=2.0),
    ]  # fmt: skip
    return msgspec.json.encode(cluster_view(nodes, allocs, generation=7))


def test_cluster_document_rebuilds_the_core_state() -> None:
    built = cluster_state(decode_cluster(sample_cluster_json()))
    assert built is not None
    state, health = built
    topo = state.topo
    assert topo.group_names[topo.domain] == ("d00", "d01")
    assert topo.node_names == ("d00-n00", "d00-n01", "d00-n02", "d00-n03", "d01-n00", "d01-n01")
    assert topo.generation == 7
    assert health.node("d00-n02") is NodeState.DRAINING and health.node("d00-n03") is NodeState.DOWN
    assert state.allocs[JOB_A].gpus == 8 and state.allocs[JOB_B].gpus == 2
    # free: n01 2 GPUs + d01-n00 3 (one down); draining and down nodes don't count
    assert state.free_gpus() == 5


def test_cluster_picture_draws_each_cell_kind() -> None:
    text = draw_cluster(decode_cluster(sample_cluster_json()))
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("d00 ", "d01 "))}
    assert rows["d00"] == "d00 │AAAA BB.. dddd xxxx│ 2/16 free"
    assert rows["d01"] == "d01 │.~.x AAAA│ 3/8 free"
    assert "6 nodes, 24 GPUs: 10 busy" in text and "topology generation 7" in text
    assert f"A  {JOB_A}  8 GPUs" in text and f"B  {JOB_B}  2 GPUs" in text
    assert "d00-n02  draining  (bad fan)" in text and "d00-n03  down  (missed 3 heartbeats)" in text


def test_a_handwritten_document_and_a_full_nvl72_domain() -> None:
    gpus = [{"index": i, "health": "ok", "job": None} for i in range(4)]
    doc: dict[str, Any] = {
        "generation": 3,
        "domains": [
            {
                "name": "d00",
                "nodes": [
                    {"name": f"d00-n{n:02d}", "state": "up", "drained": False, "reason": "", "clique": 0,
                     "leaf": None, "backend": "sim", "last_heartbeat": 0.0,
                     "gpus": [dict(g, job="j1" if n < 2 else None) for g in gpus]}
                    for n in range(18)
                ],
                "utilisation": {"total": 72, "healthy": 72, "busy": 8, "ratio": 0.1111},
            }
        ],
        "allocations": [{"job_id": "j1", "attempt": 1, "committed_at": 0.0, "nodes": []}],
        "utilisation": {"total": 72, "healthy": 72, "busy": 8, "ratio": 0.1111},
        "added_later": "ignored",
    }  # fmt: skip
    text = draw_cluster(decode_cluster(json.dumps(doc)))
    row = next(line for line in text.splitlines() if line.startswith("d00 "))
    cells = row.split("│")[1].split(" ")
    assert len(cells) == 18 and all(len(c) == 4 for c in cells)  # 18 nodes x 4 GPUs
    assert cells[:2] == ["AAAA", "AAAA"] and set(cells[2:]) == {"...."}
    assert row.endswith("64/72 free")


def test_an_empty_cluster_says_no_node_registered() -> None:
    doc = msgspec.json.encode(cluster_view([], [], 0))
    assert cluster_state(decode_cluster(doc)) is None
    assert "no node has registered yet" in draw_cluster(decode_cluster(doc))


# -- errors -----------------------------------------------------------------------------------------------------


def test_api_errors_name_the_field_once() -> None:
    assert (
        format_api_error(422, "gpus: must be at least 1", "gpus")
        == "error: field 'gpus': must be at least 1 (HTTP 422)"
    )
    assert format_api_error(422, "odd", "topology.segment") == "error: field 'topology.segment': odd (HTTP 422)"
    assert format_api_error(404, "unknown job x", None) == "error: unknown job x (HTTP 404)"
    e = api_error(422, b'{"error": "gpus: 2000 GPUs need 500 nodes", "field": "gpus"}')
    assert (e.status, e.field, e.error) == (422, "gpus", "gpus: 2000 GPUs need 500 nodes")
    proxy = api_error(502, b"<html>Bad Gateway</html>", "Bad Gateway")
    assert proxy.field is None and "Bad Gateway" in str(proxy)
    assert "no details" in str(api_error(500, b""))


Canned = tuple[int, bytes]


class _Canned(BaseHTTPRequestHandler):
    # a route's answer, or its answers in turn (the last one again once the others are given)
    routes: ClassVar[dict[tuple[str, str], Canned | list[Canned]]] = {}
    seen: ClassVar[list[tuple[str, str, dict[str, str], bytes]]] = []

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = self.path.split("?")[0]
        self.seen.append((self.command, self.path, dict(self.headers), body))
        canned = self.routes.get((self.command, path), (404, b'{"error": "not found", "field": null}'))
        status, payload = (canned.pop(0) if len(canned) > 1 else canned[0]) if isinstance(canned, list) else canned
        self.send_response(status)
        if status == 503:
            self.send_header("Retry-After", "1")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[str, type[_Canned]]]:
    handler = type("Handler", (_Canned,), {"routes": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def run_cli(*argv: str) -> tuple[int, str, str]:
    out: list[str] = []
    err: list[str] = []
    code = main(list(argv), out.append, err.append)
    return code, "\n".join(out), "\n".join(err)


def test_an_api_error_is_printed_with_its_field_and_exits_1(api: tuple[str, type[_Canned]]) -> None:
    url, handler = api
    handler.routes[("POST", "/v1/jobs")] = (422, b'{"error": "gpus: 2000 GPUs need 500 nodes", "field": "gpus"}')
    code, out, err = run_cli("submit", "--gpus", "2000", "--name", "x", "--tenant", "me", "--url", url)
    assert code == 1 and out == ""
    assert err == "error: field 'gpus': 2000 GPUs need 500 nodes (HTTP 422)"
    code, _, err = run_cli("job", "nope", "--url", url)
    assert code == 1 and err == "error: not found (HTTP 404)"


def test_a_503_with_retry_after_is_asked_again_for_reads_and_cancels_only(api: tuple[str, type[_Canned]]) -> None:
    url, handler = api
    busy = (503, b'{"error": "job j is not recorded yet", "field": null}')
    job = (200, b'{"id": "j"}')
    handler.routes[("GET", "/v1/jobs/j")] = [busy, busy, job]
    handler.routes[("POST", "/v1/jobs")] = [busy, (202, b'{"id": "k", "state": "pending"}')]
    waits: list[float] = []
    client = Client(url, sleep=waits.append)
    assert client.get("/v1/jobs/j") == {"id": "j"} and waits == [1.0, 1.0]
    with pytest.raises(ApiError) as e:  # a submit isn't repeated: its Idempotency-Key is the client's retry
        client.post("/v1/jobs", {"name": "x"})
    assert e.value.status == 503 and waits == [1.0, 1.0]
    handler.routes[("DELETE", "/v1/jobs/j")] = [busy]  # never ready: given up after the retries, with the error
    with pytest.raises(ApiError, match="not recorded yet"):
        Client(url, retries=3, sleep=waits.append).delete("/v1/jobs/j")
    assert waits == [1.0] * 5


def test_connection_refused_hints_at_rackscale_up() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        code, out, err = run_cli("jobs", "--url", f"http://127.0.0.1:{port}")
    assert code == 1 and out == ""
    assert "connection refused" in err and "rackscale up" in err
    with pytest.raises(CliError, match="rackscale up"):
        Client(f"http://127.0.0.1:{port}").get("/v1/jobs")


def test_commands_over_http(api: tuple[str, type[_Canned]]) -> None:
    url, handler = api
    job = {
        "id": JOB_A, "name": "demo", "tenant": "me", "state": "pending", "gpus": 64, "gpus_per_node": None,
        "topology": {"nvlink": "required", "segment": None, "level": "domain"}, "priority": 0, "exclusive": False,
        "checkpointable": False, "allocation": [], "submitted_at": 1.0, "started_at": None, "ended_at": None,
        "updated_at": 1.0, "attempt": 0, "exit_codes": {},
        "reason": "needs 16 nodes in one NVLink domain; the largest free run is 10 nodes",
    }  # fmt: skip
    running = dict(
        job, id=JOB_B, state="running", reason="", attempt=1, started_at=2.0, processes="per_gpu",
        time_limit_s=7200.0, workdir="/shared/run",
        exits=[{"node": "d00-n03", "rank": 3, "exit_code": -15, "signal": "SIGTERM", "cause": "preempted"}],
        allocation=[{"domain": "d00", "node": f"d00-n{i:02d}", "gpus": [0, 1, 2, 3]} for i in range(16)],
    )  # fmt: skip
    handler.routes.update(
        {
            ("POST", "/v1/jobs"): (202, json.dumps({"id": JOB_A, "state": "pending"}).encode()),
            ("GET", "/v1/jobs"): (200, json.dumps({"jobs": [job, running], "total": 3, "offset": 0}).encode()),
            ("GET", f"/v1/jobs/{JOB_A}"): (200, json.dumps(job).encode()),
            ("GET", f"/v1/jobs/{JOB_B}"): (200, json.dumps(running).encode()),
            ("DELETE", f"/v1/jobs/{JOB_A}"): (202, json.dumps({"id": JOB_A, "state": "cancelling"}).encode()),
            ("GET", "/v1/cluster"): (200, sample_cluster_json()),
            ("POST", "/v1/nodes/d00-n01/drain"): (200, b'{"node": "d00-n01", "state": "draining"}'),
            ("POST", "/v1/nodes/d00-n01/undrain"): (200, b'{"node": "d00-n01", "state": "up"}'),
        }
    )  # fmt: skip
    code, out, _ = run_cli("submit", "--gpus", "64", "--name", "demo", "--tenant", "me", "--idempotency-key", "k",
                           "--url", url, "--", "sleep", "1")  # fmt: skip
    assert (code, out) == (0, f"{JOB_A}: submitted (pending)")
    method, _, headers, body = handler.seen[-1]
    assert method == "POST" and headers["Idempotency-Key"] == "k"
    assert json.loads(body) == {"name": "demo", "tenant": "me", "gpus": 64, "command": ["sleep", "1"]}

    code, out, _ = run_cli("jobs", "--state", "pending", "--tenant", "me", "--limit", "2", "--url", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "DOMAINS", "AGE", "REASON"]
    assert lines[1].split()[:6] == [JOB_A, "demo", "me", "pending", "64", "-"]
    assert lines[2].split()[:6] == [JOB_B, "demo", "me", "running", "64", "d00"]
    assert lines[3] == "2 of 3 jobs (--offset 2 for more)"
    assert handler.seen[-1][1] == "/v1/jobs?tenant=me&state=pending&limit=2&offset=0"

    code, out, _ = run_cli("job", JOB_A, "--url", url)
    assert code == 0 and "pending reason  needs 16 nodes in one NVLink domain" in out
    assert "launch          one process per node\n" in out
    code, out, _ = run_cli("job", JOB_B, "--url", url)
    assert code == 0 and "allocation  16 nodes in 1 domain(s)" in out and "d00-n15[0-3]" in out
    assert "launch      one process per GPU, time limit 2h, in /shared/run" in out
    assert "exits       1 rank(s)\n              rank 3 on d00-n03: killed by SIGTERM (preempted)" in out
    code, out, _ = run_cli("job", JOB_B, "--json", "--url", url)
    assert json.loads(out)["state"] == "running"

    assert run_cli("cancel", JOB_A, "--url", url)[:2] == (0, f"{JOB_A}: cancelling")
    code, out, _ = run_cli("cluster", "--url", url)
    assert code == 0 and "d00 │AAAA BB.. dddd xxxx│ 2/16 free" in out
    assert run_cli("drain", "d00-n01", "--reason", "fan", "--url", url)[:2] == (0, "d00-n01: draining")
    assert json.loads(handler.seen[-1][3]) == {"reason": "fan"}
    assert run_cli("undrain", "d00-n01", "--url", url)[:2] == (0, "d00-n01: up")


def test_arrays_and_dependencies_over_http(api: tuple[str, type[_Canned]]) -> None:
    url, handler = api
    task = {
        "id": f"{JOB_A}_3", "name": "sweep", "tenant": "me", "state": "pending", "gpus": 4, "gpus_per_node": None,
        "topology": {"nvlink": "required", "segment": None, "level": "domain"}, "priority": 0, "exclusive": False,
        "checkpointable": False, "allocation": [], "submitted_at": 1.0, "started_at": None, "ended_at": None,
        "updated_at": 1.0, "attempt": 0, "exit_codes": {}, "array_id": JOB_A, "array_index": 3, "array": "0-9%2",
        "dependency": f"afterok:{JOB_B}", "reason": f"waits for afterok: {JOB_B} (not ended)",
    }  # fmt: skip
    not_a_job = f"{JOB_A} is an array of 10 task(s), {JOB_A}_0 … {JOB_A}_9, not a job: list them with ..."
    handler.routes.update(
        {
            ("POST", "/v1/jobs"): (202, json.dumps({"id": JOB_A, "state": "pending"}).encode()),
            ("GET", "/v1/jobs"): (200, json.dumps({"jobs": [task], "total": 1, "offset": 0}).encode()),
            ("GET", f"/v1/jobs/{JOB_A}"): (404, json.dumps({"error": not_a_job, "field": None}).encode()),
            ("GET", f"/v1/jobs/{JOB_A}_3"): (200, json.dumps(task).encode()),
        }
    )
    code, out, _ = run_cli(
        "submit", "--gpus", "4", "--name", "sweep", "--tenant", "me", "--array", "0-9%2", "-d", f"afterok:{JOB_B}",
        "--url", url,
    )  # fmt: skip
    assert (code, out) == (0, f"{JOB_A}: array submitted (pending); its tasks: rackscale jobs --array {JOB_A}")
    body = json.loads(handler.seen[-1][3])
    assert (body["array"], body["dependency"]) == ("0-9%2", f"afterok:{JOB_B}")
    code, out, _ = run_cli("jobs", "--array", JOB_A, "--url", url)
    assert code == 0 and f"{JOB_A}_3" in out and "waits for afterok" in out
    assert handler.seen[-1][1] == f"/v1/jobs?limit=50&offset=0&array={JOB_A}"
    # `job` of the array's id: its tasks (the 404 says it is an array); of a task: the task, with its array
    code, out, _ = run_cli("job", JOB_A, "--url", url)
    assert code == 0 and f"{JOB_A}_3" in out and handler.seen[-1][1] == f"/v1/jobs?limit=500&offset=0&array={JOB_A}"
    code, out, _ = run_cli("job", f"{JOB_A}_3", "--url", url)
    assert code == 0 and f"array           task 3 of array {JOB_A} (0-9%2)\n" in out
    assert f"dependency      afterok:{JOB_B}\npending reason  waits for afterok: {JOB_B} (not ended)\n" in out
    # a 404 of an id that is no array stays the error it is
    assert run_cli("job", "nope", "--url", url)[0] == 1


def test_api_error_is_a_cli_error() -> None:
    e = ApiError(409, "job x already succeeded", "state")
    assert isinstance(e, CliError) and str(e) == "error: field 'state': job x already succeeded (HTTP 409)"


def test_demo_keeps_the_old_terminal_picture() -> None:
    code, out, _ = run_cli("demo", "--domains", "1", "--ticks", "1")
    assert code == 0
    assert out.startswith("rackscale demo — policy rackscale") and "d00 │" in out


def test_sim_is_a_subcommand() -> None:
    args = parse("sim", "--trace", "trace.csv", "--out", "out", "--quiet")
    assert args.command == "sim" and args.trace == ["trace.csv"]


def test_submit_test_only_asks_for_a_dry_run_and_prints_where_the_job_would_go(api: tuple[str, type[_Canned]]) -> None:
    url, handler = api
    now_view = {
        "start": "now", "domains": ["d01"], "gpus": 8, "segment": 2, "forecast_start": None, "reason": "",
        "reserved": False, "preempts": 0, "shrinks": 0,
        "allocation": [{"domain": "d01", "node": f"d01-n{i:02d}", "gpus": [0, 1, 2, 3]} for i in (4, 5)],
    }  # fmt: skip
    handler.routes[("POST", "/v1/jobs")] = (200, json.dumps(now_view).encode())
    code, out, _ = run_cli("submit", "--gpus", "8", "--tenant", "me", "--segment", "2", "--test-only", "--url", url)
    assert code == 0
    assert out.splitlines() == [
        "would start now on 8 GPUs (2 nodes) in d01, segments of 2 nodes",
        "  d01: d01-n04[0-3] d01-n05[0-3]",
        "(a dry run: nothing was submitted)",
    ]
    method, path, _, body = handler.seen[-1]
    assert (method, path) == ("POST", "/v1/jobs?dry_run=true")
    assert json.loads(body) == {"name": "job", "tenant": "me", "gpus": 8, "topology": {"segment": 2}}
    code, out, _ = run_cli("submit", "--gpus", "8", "--tenant", "me", "--test-only", "--json", "--url", url)
    assert code == 0 and json.loads(out) == now_view


def test_a_dry_run_that_waits_says_when_and_why() -> None:
    later = {
        "start": "later", "domains": ["d00"], "gpus": 64, "segment": None, "forecast_start": 1000.0 + 2400,
        "reason": "needs 16 nodes in one NVLink domain; reserved to start in ~40 min", "reserved": True,
        "allocation": [{"domain": "d00", "node": f"d00-n{i:02d}", "gpus": [0, 1, 2, 3]} for i in range(16)],
    }  # fmt: skip
    text = commands.describe_dry_run(later, now=1000.0)
    assert text.startswith("would wait: expected to start in 40m (reserved) on 64 GPUs (16 nodes) in d00\n")
    assert "reason: needs 16 nodes in one NVLink domain; reserved to start in ~40 min" in text
    estimated = dict(later, reserved=False)
    assert "(estimated: the reservations ahead of it fill the cycle's depth)" in commands.describe_dry_run(
        estimated, now=1000.0
    )
    never = {"start": "never", "allocation": [], "reason": "needs 16 nodes ...; won't fit even when running jobs end"}
    assert commands.describe_dry_run(never, now=0.0).splitlines()[:2] == [
        "would never start on the fleet as it is",
        "reason: needs 16 nodes ...; won't fit even when running jobs end",
    ]
    unknown = {"start": "later", "allocation": [], "forecast_start": None, "reason": "tenant a is at its quota"}
    assert commands.describe_dry_run(unknown, now=0.0).startswith("would wait: no start can be forecast now\n")
