"""The Python client's pure parts (clients/python): its generated types match the gateway's schemas and read every
view the gateway writes, its requests are what the API takes, its stream readers put events and log lines
together, and it imports nothing outside the standard library. Against the running system:
tests/e2e/test_python_client.py; installed alone: tests/integration/test_client_install.py."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import msgspec
import pytest
from rackscale import _convert, _protocol, _sse, types
from rackscale._http11 import Answer, ProtocolError
from rackscale._protocol import Api, Endpoint, LogFollower, text_line
from rackscale.errors import ApiError

from shared import api, sse
from shared.schemas import TERMINAL, JobBody, JobEvent, JobState, MoveTicket, NodeChanged, NodeGpus, TopologyBody

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_client_types", ROOT / "scripts" / "gen_client_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


# -- the types can't drift -----------------------------------------------------------------------------------------


def test_the_generated_types_are_what_the_gateways_schemas_say() -> None:
    written = (CLIENT / "rackscale" / "types.py").read_text()
    assert written == GEN.generate(), (
        "clients/python/rackscale/types.py is out of date: python scripts/gen_client_types.py"
    )


def test_the_generator_covers_every_view_and_event_the_openapi_document_names() -> None:
    from services.gateway import openapi  # the document the gateway serves

    documented = set(openapi.document()["components"]["schemas"])
    assert documented <= set(types.__all__), f"views the client lacks: {documented - set(types.__all__)}"


def test_a_view_added_to_shared_api_is_generated_in_when_the_generator_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fields = [  # as the dry-run work describes it
        ("start", Literal["now", "later", "never"]),
        ("allocation", list[api.Placed]),
        ("forecast_start", float | None, None),
        ("reason", str, ""),
    ]
    DryRunView = msgspec.defstruct("DryRunView", fields, kw_only=True, module=api.__name__)
    monkeypatch.setattr(api, "DryRunView", DryRunView, raising=False)
    text = GEN.generate()
    assert 'start: Literal["later", "never", "now"]' in text and "allocation: list[Placed]" in text
    module = ModuleType("rackscale.generated_here")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(text, "types.py", "exec"), module.__dict__)
    monkeypatch.setattr(_protocol, "types", module)  # the client with the types of after the merge
    wire = msgspec.json.encode(DryRunView(start="later", allocation=[api.Placed(domain="d", node="n", gpus=[1])]))
    view = _protocol.Api(Endpoint.parse("http://gw")).dry_run({"name": "a", "tenant": "b", "gpus": 1}).read(200, wire)
    assert type(view).__name__ == "DryRunView" and view.start == "later" and view.allocation[0].gpus == [1]


def test_usage_reads_as_its_view_or_as_csv_text() -> None:
    wire = msgspec.json.encode(
        api.UsageView(
            tenant="alice",
            by="day",
            start=0.0,
            end=86400.0,
            as_of=5.0,
            rows=[api.UsageRow(tenant="alice", period="1970-01-01", start=0.0, gpu_hours=1.5, jobs=2)],
        )
    )
    view = _protocol.Api(Endpoint.parse("http://gw")).usage(tenant="alice").read(200, wire)
    assert type(view).__name__ == "UsageView" and view.rows[0].gpu_hours == 1.5 and view.from_ == 0.0
    assert _protocol.Api(Endpoint.parse("http://gw")).usage(csv=True).read(200, b"tenant,gpu_hours\n") == (
        "tenant,gpu_hours\n"
    )


def sample(info: Any, variant: int, name: str = "x") -> Any:
    """A JSON value of msgspec type `info` with every field set, within its constraints. `variant` picks a union's
    arm (0: the first that isn't null, 1: the last), so both shapes of `int | list[int]` are read."""
    mi = msgspec.inspect
    if isinstance(info, mi.StructType):
        fields = {f.encode_name: sample(f.type, variant, f.name) for f in info.fields}
        if info.array_like:
            return list(fields.values())
        return {info.tag_field: info.tag, **fields} if info.tag_field else fields
    if isinstance(info, mi.UnionType):
        arms = [t for t in info.types if not isinstance(t, mi.NoneType)]
        return sample(arms[0] if variant == 0 else arms[-1], variant, name)
    if isinstance(info, mi.ListType):
        return [sample(info.item_type, variant, name), sample(info.item_type, 1 - variant, name)]
    if isinstance(info, mi.DictType):
        return {"k1": sample(info.value_type, variant, name)}
    if isinstance(info, mi.LiteralType):
        return info.values[-1 if variant else 0]
    if isinstance(info, mi.EnumType):
        return list(info.cls)[-1 if variant else 0].value
    if isinstance(info, mi.StrType):
        return f"{name}-{variant}"
    if isinstance(info, mi.BoolType):
        return True
    if isinstance(info, mi.IntType):
        return 7 if info.le is None or info.le >= 7 else info.le
    if isinstance(info, mi.FloatType):
        return 2.5 + variant
    if isinstance(info, mi.AnyType):
        return {"any": [1, "two"]}
    raise AssertionError(f"no sample for {info}")


SOURCES = {cls.__name__: cls for cls in GEN.sources()}


@pytest.mark.parametrize("variant", [0, 1])
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_view_the_gateway_writes_reads_back_whole(name: str, variant: int) -> None:
    cls = SOURCES[name]
    struct = msgspec.convert(sample(msgspec.inspect.type_info(cls), variant), cls)  # within its constraints
    wire = json.loads(msgspec.json.encode(struct))  # as the gateway writes it
    view = _convert.decode(getattr(types, name), wire)
    assert _convert.encode(view, omit_defaults=False) == wire, "a field lost, renamed or retyped"


def test_a_job_view_reads_as_typed_values() -> None:
    struct = msgspec.convert(sample(msgspec.inspect.type_info(api.JobView), 1), api.JobView)
    job = _convert.decode(types.JobView, json.loads(msgspec.json.encode(struct)))
    assert job.state is types.JobState.MIGRATING and job.state == "migrating"  # the enum, equal to its string
    assert isinstance(job.allocation[0], types.Placed) and job.allocation[0].gpus == [7, 7]
    assert isinstance(job.topology, types.TopologyBody) and job.topology.segment == [7, 7]
    assert isinstance(job.exits[0], types.RankExitView)


def test_a_job_event_reads_its_array_like_allocation_as_named_tuples() -> None:
    ev = JobEvent(
        job_id="j1",
        state=JobState.MIGRATING,
        reason="move",
        at=1.0,
        nodes=[NodeGpus("d00-n01", [0, 1])],
        move=MoveTicket(migration_id="m", target=[NodeGpus("d01-n00", [2])], reason="r", since=2.0),
    )
    typed = _protocol.event_of(_sse.Event("job", msgspec.json.encode(ev).decode()))
    assert isinstance(typed, types.JobEvent)
    assert typed.nodes == [types.NodeGpus(node="d00-n01", gpus=[0, 1])] and typed.nodes[0].node == "d00-n01"
    assert typed.move is not None and typed.move.target[0].gpus == [2]
    node = NodeChanged(node="d00-n01", state="draining", reason="tray", at=3.0, gpu_health={"1": "down"})
    assert _protocol.event_of(_sse.Event("node", msgspec.json.encode(node).decode())) == types.NodeChanged(
        node="d00-n01", state="draining", reason="tray", at=3.0, gpu_health={"1": "down"}
    )
    assert _protocol.event_of(_sse.Event("cluster", "{}")) == _protocol.ClusterChanged()
    assert _protocol.event_of(_sse.Event("from-a-newer-gateway", "{}")) is None


def test_decoding_takes_what_a_newer_gateway_adds_and_refuses_what_isnt_a_view() -> None:
    newer = {"id": "j", "state": "hibernating", "extra": {"new": 1}}
    assert _convert.decode(types.Accepted, newer) == types.Accepted(id="j", state="hibernating")
    line = _convert.decode(types.LogEnd, {"state": "hibernating", "end": ""})
    assert line.state == "hibernating"  # an unknown state stays a string
    assert _convert.decode(types.Utilisation, {"total": 1, "healthy": 1, "busy": 0, "ratio": 0}).ratio == 0.0
    with pytest.raises(ValueError, match="lacks its field 'text'"):
        _convert.decode(types.LogLine, {"rank": 0})
    with pytest.raises(ValueError, match=r"\$\.jobs"):
        _convert.decode(types.JobList, {"jobs": {}, "total": 0, "offset": 0, "limit": 1})
    with pytest.raises(ValueError, match=r"\$\.rank"):
        _convert.decode(types.LogLine, {"rank": "zero", "text": ""})


def test_a_typed_body_is_sent_as_the_json_the_gateway_decodes_to_the_same_job() -> None:
    body = types.JobBody(
        name="ft",
        tenant="alice",
        gpus=64,
        topology=types.TopologyBody(nvlink="required", segment=[16, 8]),
        command=["python", "train.py"],
        env={"A": "1"},
        checkpointable=True,
        min_gpus=16,
    )
    sent = json.loads(Api(Endpoint.parse("http://gw")).submit(body).request.body or b"")
    assert sent == {
        "name": "ft",
        "tenant": "alice",
        "gpus": 64,
        "min_gpus": 16,
        "topology": {"segment": [16, 8]},  # defaults left out: the server's are the same
        "checkpointable": True,
        "command": ["python", "train.py"],
        "env": {"A": "1"},
    }
    server = msgspec.json.decode(json.dumps(sent), type=JobBody)
    assert server == JobBody(
        name="ft",
        tenant="alice",
        gpus=64,
        min_gpus=16,
        topology=TopologyBody(segment=[16, 8]),
        checkpointable=True,
        command=["python", "train.py"],
        env={"A": "1"},
    )
    assert json.loads(
        Api(Endpoint.parse("http://gw")).submit(types.JobBody(name="a", tenant="b", gpus=1)).request.body or b""
    ) == {"name": "a", "tenant": "b", "gpus": 1}


def test_the_clients_terminal_states_are_the_servers() -> None:
    assert {s.value for s in _protocol.TERMINAL} == {s.value for s in TERMINAL}


# -- requests ----------------------------------------------------------------------------------------------------


def test_url_and_token_come_from_the_arguments_else_the_environment() -> None:
    env = {"RACKSCALE_URL": "https://gw.example:8443/rs/", "RACKSCALE_TOKEN": " tok-env "}
    from_env = Api.of(None, None, env)
    assert (str(from_env.endpoint), from_env.token) == ("https://gw.example:8443/rs", "tok-env")
    given = Api.of("http://10.0.0.1:9000", "tok-arg", env)
    assert (str(given.endpoint), given.token) == ("http://10.0.0.1:9000", "tok-arg")
    default = Api.of(None, None, {})
    assert (str(default.endpoint), default.token) == ("http://127.0.0.1:8080", None)
    assert Endpoint.parse("http://[::1]:8080").netloc == "[::1]:8080"
    with pytest.raises(ValueError, match="not an http"):
        Endpoint.parse("localhost:8080")


def test_requests_carry_the_token_the_key_and_the_path_the_gateway_routes() -> None:
    gw = Api(Endpoint.parse("http://gw:8080/rs"), "tok")
    submit = gw.submit({"name": "a", "tenant": "b", "gpus": 1}, idempotency_key="retry-1").request
    assert (submit.method, submit.target, submit.retry) == ("POST", "/rs/v1/jobs", False)
    assert submit.headers["Authorization"] == "Bearer tok" and submit.headers["Idempotency-Key"] == "retry-1"
    assert submit.headers["Content-Type"] == "application/json"
    get = gw.get("a/b c").request
    assert (get.method, get.target, get.retry) == ("GET", "/rs/v1/jobs/a%2Fb%20c", True)
    listed = gw.list(tenant="alice", state=types.JobState.RUNNING, array="a1", limit=10).request
    assert listed.target == "/rs/v1/jobs?tenant=alice&state=running&array=a1&limit=10"
    assert gw.cancel("j").request.method == "DELETE"
    dry = gw.dry_run({"name": "a", "tenant": "b", "gpus": 1}).request
    assert (dry.method, dry.target) == ("POST", "/rs/v1/jobs?dry_run=true")
    usage = gw.usage(tenant="alice", from_="2026-01-01", to="2026-02-01", by="week", csv=True).request
    assert usage.target == "/rs/v1/usage?tenant=alice&from=2026-01-01&to=2026-02-01&by=week&format=csv"
    logs = gw.logs("j", follow=True, rank=0, tail=5, last_id="17")
    assert logs.target == "/rs/v1/jobs/j/logs?rank=0&tail=5&follow=true" and logs.headers["Last-Event-ID"] == "17"
    assert logs.headers["Accept"] == sse.MEDIA_TYPE
    assert gw.logs("j", follow=False).target == "/rs/v1/jobs/j/logs"
    with pytest.raises(TypeError, match="JobBody or a dict"):
        gw.submit(["not", "a", "body"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("job.yaml", "application/yaml"),
        ("job.YML", "application/yaml"),
        ("job.json", "application/json"),
        ("train.sbatch", "text/x-shellscript"),
        ("train.sh", "text/x-shellscript"),
    ],
)
def test_a_job_file_is_sent_as_it_is_typed_by_its_name(tmp_path: Path, name: str, content_type: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"#!/bin/bash\n#SBATCH --gpus=8\nsrun train.py\n")
    req = Api(Endpoint.parse("http://gw")).submit_file(path).request
    assert (req.headers["Content-Type"], req.body) == (content_type, path.read_bytes())


def test_only_a_503_with_retry_after_of_a_repeatable_request_is_asked_again() -> None:
    gw = Api(Endpoint.parse("http://gw"))
    read, submit = gw.get("j").request, gw.submit({"name": "a", "tenant": "b", "gpus": 1}).request
    assert _protocol.retry_wait(read, 503, {"retry-after": "1"}) == 1.0
    assert _protocol.retry_wait(read, 503, {"retry-after": "120"}) == _protocol.RETRY_WAIT_MAX_S
    assert _protocol.retry_wait(read, 503, {}) is None
    assert _protocol.retry_wait(read, 404, {"retry-after": "1"}) is None
    assert _protocol.retry_wait(submit, 503, {"retry-after": "1"}) is None  # its Idempotency-Key is the retry


def test_an_error_answer_carries_status_message_and_field() -> None:
    body = msgspec.json.encode(api.ErrorBody(error="gpus: must be at least 1", field="gpus"))
    e = _protocol.error_of(422, {}, body)
    assert (e.status, e.message, e.field, e.retry_after) == (422, "gpus: must be at least 1", "gpus", None)
    assert "HTTP 422" in str(e) and "gpus" in str(e)
    proxy = ApiError.from_answer(502, b"<html>Bad Gateway</html>", "Bad Gateway")
    assert (proxy.status, proxy.message, proxy.field) == (502, "<html>Bad Gateway</html>", None)
    assert _protocol.error_of(503, {"retry-after": "2"}, b"").retry_after == 2.0


# -- streams -----------------------------------------------------------------------------------------------------


def test_the_sse_reader_reads_what_the_gateway_writes() -> None:
    reader = _sse.Reader()
    frames = sse.CONNECTED + sse.frame("line", b'{"rank":0,"text":"a"}') + sse.KEEP_ALIVE
    frames += sse.frame("line", b'{"rank":0,"text":"b"}', 42) + sse.frame("end", b'{"state":"failed","end":"x"}')
    got = [ev for line in frames.decode().splitlines(keepends=True) if (ev := reader.feed(line)) is not None]
    assert [(e.event, e.id, e.own_id) for e in got] == [
        ("line", None, False),
        ("line", "42", True),
        ("end", "42", False),
    ]
    assert json.loads(got[1].data) == {"rank": 0, "text": "b"}


def _log_frames(*frames: bytes) -> list[bytes]:
    return [line for f in frames for line in f.splitlines(keepends=True)]


def test_a_followed_logs_lines_come_once_across_a_drop_in_the_middle_of_a_chunk() -> None:
    def line(text: str, seq: int | None = None) -> bytes:
        return sse.frame("line", msgspec.json.encode(api.LogLine(rank=0, text=text)), seq)

    follower = LogFollower()
    out: list[str] = []
    for raw in _log_frames(sse.CONNECTED, line("a"), line("b", 5), line("c")):  # drops before c's chunk ends
        out += [x.text for x in follower.feed(raw)]
    assert out == ["a", "b"] and follower.last_id == "5"
    follower.dropped()
    # the reconnect (Last-Event-ID: 5) sends c's chunk whole, then the end
    end = sse.frame("end", msgspec.json.encode(api.LogEnd(state=JobState.SUCCEEDED, end="completed")))
    for raw in _log_frames(sse.CONNECTED, line("c"), line("d", 9), end):
        out += [x.text for x in follower.feed(raw)]
    assert out == ["a", "b", "c", "d"] and follower.ended


def test_plain_text_log_lines_read_as_the_followed_ones() -> None:
    assert text_line("3: hello: world\n", None) == types.LogLine(rank=3, text="hello: world")
    assert text_line("hello: world\n", 1) == types.LogLine(rank=1, text="hello: world")
    marker = "[rackscale: 12 lines dropped: the process wrote faster than its log shipped]"
    assert text_line(f"0: {marker}\n", None) == types.LogLine(rank=0, text=marker, dropped=12)
    assert text_line("not a rank\n", None).rank == -1


# -- the asyncio HTTP/1.1 reader, against answers framed each way -----------------------------------------------


@contextlib.asynccontextmanager
async def loopback(raw: bytes) -> AsyncIterator[Endpoint]:
    """A server on loopback that answers every request with `raw` and closes."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(raw)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield Endpoint.parse(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nline1\nline2", b"line1\nline2", id="length"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nli\nn\r\n7\r\ne1\nline\r\n"
            b"2\r\n2\n\r\n0\r\nTrailer: x\r\n\r\n",
            b"li\nne1\nline2\n",
            id="chunked",
        ),
        pytest.param(
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nto the close\n", b"to the close\n", id="close"
        ),
    ],
)
@pytest.mark.asyncio
async def test_the_async_transport_reads_a_body_framed_any_way(raw: bytes, body: bytes) -> None:
    async with loopback(raw) as endpoint:
        answer = await Answer.open(endpoint, Api(endpoint).request("GET", "/x"))
        lines = []
        async with answer:
            assert answer.status == 200
            while line := await answer.readline():
                lines.append(line)
    assert b"".join(lines) == body and all(x.endswith(b"\n") for x in lines[:-1])


@pytest.mark.asyncio
async def test_the_async_transport_refuses_what_isnt_a_whole_http_answer() -> None:
    async with loopback(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort") as endpoint:
        answer = await Answer.open(endpoint, Api(endpoint).request("GET", "/x"))
        with pytest.raises(ProtocolError, match="middle of a chunk"):
            async with answer:
                await answer.read()
    async with loopback(b"SSH-2.0-OpenSSH_9.6\r\n") as endpoint:
        with pytest.raises(ProtocolError, match="status line"):
            await Answer.open(endpoint, Api(endpoint).request("GET", "/x"))


# -- the package -------------------------------------------------------------------------------------------------


def test_the_client_imports_only_the_standard_library_and_itself() -> None:
    foreign = []
    for path in sorted((CLIENT / "rackscale").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top != "rackscale" and top not in sys.stdlib_module_names and top != "__future__":
                    foreign.append(f"{path.name}: {name}")
    assert not foreign


def test_the_version_is_the_distributions() -> None:
    import tomllib

    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["version"] == _protocol.VERSION and project["dependencies"] == []
