"""Gateway input validation (pure, no servers) and the OpenAPI document's coverage of the routes.

Topology for the semantic checks (levels outermost first; index 0 is the synthetic ``cluster`` root):

    NVL72 x2    cluster(0) > domain(1) > clique(2)
                +----------------------+----------------------+
                | d00: 18 nodes x 4    | d01: 18 nodes x 4    |    36 nodes, 144 GPUs
                +----------------------+----------------------+

The same verdict as the queue's, on fleets registered by inventory (`shared.topology_view`):

    leafy       leaf s1 > r1 (18 nodes)   leaf s2 > r2 (18 nodes)         a leaf level above the domains
    partial     leaf s1 > r1 (18 nodes)   (no leaf) r2 (18 nodes)         the leaf level can't form: dropped
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.aio.client
import pytest

from services.gateway import openapi
from services.gateway.service import build_app, idempotent_job_id
from services.gateway.validation import ApiError, check_job, decode_job, error_field
from shared.bus import Bus
from shared.core import ClusterState, CycleConfig, JobSpec, Need, Pending, PendingCode, Scheduler, Topology, segments
from shared.jobfile.schema import described
from shared.jobs import body_segments, job_spec, launch_of
from shared.names import Names
from shared.runtime import Deps
from shared.schemas import JOB_BODY_JSON, JobBody, Launch, NodeRecord
from shared.settings import Settings
from shared.store import Store
from shared.topology_view import topology_from_records
from shared.tracing import noop_tracer

NVL72x2 = Topology.uniform(2)
OK: dict[str, Any] = {"name": "train", "tenant": "a", "gpus": 8}


def body(**changes: Any) -> bytes:
    """OK with `changes` applied; a value of ... deletes the key; "topology" merges into {}."""
    doc = dict(OK)
    for k, v in changes.items():
        if v is ...:
            doc.pop(k, None)
        else:
            doc[k] = v
    return json.dumps(doc).encode()


def validate(data: bytes, topo: Topology | None, job_id: str = "new") -> tuple[JobBody, JobSpec] | ApiError:
    """Both stages, as the gateway's submit runs them."""
    body = decode_job(data)
    if isinstance(body, ApiError):
        return body
    spec = check_job(body, job_id, topo)
    return spec if isinstance(spec, ApiError) else (body, spec)


@dataclass(frozen=True)
class Bad:
    id: str
    data: bytes
    status: int
    field: str | None
    phrase: str
    topo: Topology | None = NVL72x2


BAD = [
    # -- not JSON / not an object → 400
    Bad("not-json", b'{"name": ', 400, None, "not valid JSON"),
    Bad("empty", b"", 400, None, "not valid JSON"),
    Bad("array", b"[1, 2]", 400, None, "must be a JSON object"),
    Bad("string", b'"job"', 400, None, "must be a JSON object"),
    Bad("null", b"null", 400, None, "must be a JSON object"),
    # -- missing required fields
    Bad("missing-name", body(name=...), 422, "name", "missing required field `name`"),
    Bad("missing-tenant", body(tenant=...), 422, "tenant", "missing required field `tenant`"),
    Bad("missing-gpus", body(gpus=...), 422, "gpus", "missing required field `gpus`"),
    # -- wrong types
    Bad("name-int", body(name=7), 422, "name", "Expected `str`, got `int`"),
    Bad("tenant-list", body(tenant=["a"]), 422, "tenant", "Expected `str`, got `array`"),
    Bad("gpus-string", body(gpus="8"), 422, "gpus", "Expected `int`, got `str`"),
    Bad("gpus-float", body(gpus=8.5), 422, "gpus", "Expected `int`, got `float`"),
    Bad("gpus-bool", body(gpus=True), 422, "gpus", "Expected `int`, got `bool`"),
    Bad("exclusive-string", body(exclusive="yes"), 422, "exclusive", "Expected `bool`"),
    Bad("command-item", body(command=["python", 3]), 422, "command[1]", "Expected `str`, got `int`"),
    Bad("topology-string", body(topology="required"), 422, "topology", "Expected `object`, got `str`"),
    # -- bounds
    Bad("gpus-0", body(gpus=0), 422, "gpus", ">= 1"),
    Bad("gpus-negative", body(gpus=-4), 422, "gpus", ">= 1"),
    Bad("gpus-per-node-0", body(gpus_per_node=0), 422, "gpus_per_node", ">= 1"),
    Bad("priority-below", body(priority=-1001), 422, "priority", ">= -1000"),
    Bad("priority-above", body(priority=1001), 422, "priority", "<= 1000"),
    Bad("duration-negative", body(duration_s=-1), 422, "duration_s", ">= 0"),
    Bad("runtime-negative", body(expected_runtime_s=-0.5), 422, "expected_runtime_s", ">= 0"),
    Bad("name-empty", body(name=""), 422, "name", "length >= 1"),
    Bad("name-pattern", body(name="-rm -rf"), 422, "name", "matching regex"),
    Bad("tenant-too-long", body(tenant="t" * 129), 422, "tenant", "length <= 128"),
    # -- unknown fields and enum values
    Bad("unknown-field", body(colour="blue"), 422, "colour", "unknown field `colour`"),
    Bad("unknown-nested", body(topology={"racks": 2}), 422, "topology.racks", "unknown field `racks`"),
    Bad("bad-nvlink", body(topology={"nvlink": "sometimes"}), 422, "topology.nvlink", "Invalid enum value 'sometimes'"),
    Bad("bad-on-failure", body(on_node_failure="retry"), 422, "on_node_failure", "Invalid enum value"),
    Bad("segment-0", body(topology={"segment": 0}), 422, "topology.segment", ">= 1"),
    Bad(
        "segment-string",
        body(topology={"segment": "4"}),
        422,
        "topology.segment",
        "Expected `int | array | null`, got `str`",
    ),
    Bad("segments-empty", body(topology={"segment": []}), 422, "topology.segment", "length >= 1"),
    Bad("segments-zero", body(topology={"segment": [4, 0]}), 422, "topology.segment[1]", ">= 1"),
    Bad("segments-too-many", body(topology={"segment": list(range(9, 0, -1))}), 422, "topology.segment", "length <= 8"),
    # -- how the processes start (the launch contract, shared/launch.py)
    Bad("env-not-object", body(env=["A=1"]), 422, "env", "Expected `object`"),
    Bad("env-value-int", body(env={"A": 1}), 422, "env[...]", "Expected `str`, got `int`"),
    Bad("env-value-long", body(env={"A": "x" * 4097}), 422, "env[...]", "length <= 4096"),
    Bad("env-too-many", body(env={f"V{i}": "1" for i in range(65)}), 422, "env", "length <= 64"),
    Bad("env-bad-name", body(env={"1A": "x"}), 422, "env.1A", "not a variable name"),
    Bad("env-dash-name", body(env={"A-B": "x"}), 422, "env.A-B", "not a variable name"),
    Bad("env-reserved", body(env={"MASTER_PORT": "1"}), 422, "env.MASTER_PORT", "set by the scheduler"),
    Bad("env-reserved-prefix", body(env={"RACKSCALE_X": "1"}), 422, "env.RACKSCALE_X", "set by the scheduler"),
    Bad("env-nul", body(env={"A": "a\u0000b"}), 422, "env.A", "NUL"),
    Bad("env-total", body(env={f"V{i}": "x" * 4000 for i in range(9)}), 422, "env", "at most 32768"),
    Bad("workdir-relative", body(workdir="runs/a"), 422, "workdir", "an absolute path"),
    Bad("workdir-int", body(workdir=1), 422, "workdir", "Expected `str`"),
    Bad("time-limit-0", body(time_limit_s=0), 422, "time_limit_s", "> 0"),
    Bad("time-limit-string", body(time_limit_s="1h"), 422, "time_limit_s", "Expected `float | null`"),
    Bad("processes-bad", body(processes="per_core"), 422, "processes", "Invalid enum value 'per_core'"),
    Bad("slurm-env-string", body(slurm_env="yes"), 422, "slurm_env", "Expected `bool`"),
    # -- shape rules that hold on any topology (checked with and without nodes registered)
    Bad("not-multiple", body(gpus=6, gpus_per_node=4), 422, "gpus", "6 is not a multiple of gpus_per_node 4"),
    Bad("not-multiple-static", body(gpus=6, gpus_per_node=4), 422, "gpus", "not a multiple", topo=None),
    Bad(
        "segment-with-nvlink-none",
        body(gpus=32, topology={"nvlink": "none", "segment": 4}),
        422,
        "topology.segment",
        "needs topology nvlink required or preferred",
    ),
    Bad(
        "segment-with-nvlink-none-static",
        body(gpus=32, topology={"nvlink": "none", "segment": 4}),
        422,
        "topology.segment",
        "needs topology nvlink required or preferred",
        topo=None,
    ),
    Bad(
        "segment-not-dividing",
        body(gpus=16, topology={"segment": 3}),
        422,
        "topology.segment",
        "4 nodes is not a multiple of segment 3",
    ),
    Bad(
        "segment-not-dividing-static",
        body(gpus=16, gpus_per_node=4, topology={"segment": 3}),
        422,
        "topology.segment",
        "not a multiple of segment 3",
        topo=None,
    ),
    # -- against the topology
    Bad("default-per-node", body(gpus=6), 422, "gpus", "6 is not a multiple of gpus_per_node 4"),
    Bad("per-node-too-big", body(gpus=16, gpus_per_node=8), 422, "gpus_per_node", "more than any node has"),
    Bad("bigger-than-cluster", body(gpus=160), 422, "gpus", "the cluster has 36"),
    Bad(
        "segment-larger-than-domain",
        body(gpus=80, topology={"segment": 20}),
        422,
        "topology.segment",
        "20 nodes is larger than any NVLink domain (largest: 18 nodes)",
    ),
    Bad(
        "segments-increasing",
        body(gpus=64, topology={"segment": [4, 8]}),
        422,
        "topology.segment",
        "largest (preferred) first, each once: 8 after 4",
    ),
    Bad(
        "segments-repeated-static",
        body(gpus=64, gpus_per_node=4, topology={"segment": [8, 8]}),
        422,
        "topology.segment",
        "each once: 8 after 8",
        topo=None,
    ),
    Bad(
        "segments-fallback-not-dividing",
        body(gpus=64, topology={"segment": [8, 3]}),
        422,
        "topology.segment",
        "16 nodes is not a multiple of segment 3",
    ),
    Bad(
        "segments-fallback-not-dividing-static",
        body(gpus=64, gpus_per_node=4, topology={"segment": [8, 3]}),
        422,
        "topology.segment",
        "16 nodes is not a multiple of segment 3",
        topo=None,
    ),
    Bad(
        "segments-preferred-larger-than-domain",
        body(gpus=80, topology={"segment": [20, 10]}),
        422,
        "topology.segment",
        "20 nodes is larger than any NVLink domain",
    ),
    Bad(
        "elastic-not-checkpointable",
        body(gpus=64, min_gpus=16),
        422,
        "min_gpus",
        "an elastic job must be checkpointable",
        topo=None,
    ),
    Bad("elastic-min-above-gpus", body(gpus=16, min_gpus=32, checkpointable=True), 422, "min_gpus", "more than gpus"),
    Bad(
        "elastic-min-not-whole-segments",
        body(gpus=64, min_gpus=16, checkpointable=True, topology={"segment": 8}),
        422,
        "min_gpus",
        "16 GPUs is not a whole number of segments of 8 nodes (32 GPUs each)",
    ),
    Bad(
        "elastic-and-flexible",
        body(gpus=64, min_gpus=32, checkpointable=True, topology={"segment": [8, 4]}),
        422,
        "min_gpus",
        "an elastic job lists one segment size",
    ),
    Bad("required-bigger-than-domain", body(gpus=80), 422, "gpus", "can't fit in one NVLink domain"),
    Bad("unknown-level", body(topology={"level": "pod"}), 422, "topology.level", "unknown topology level 'pod'"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.id)
def test_validation_error(case: Bad) -> None:
    result = validate(case.data, case.topo)
    assert isinstance(result, ApiError), f"accepted: {result}"
    assert (result.status, result.field) == (case.status, case.field)
    assert case.phrase in result.error
    if case.field is not None:
        assert result.error.startswith(f"{case.field}: ")  # the message names the field too


@pytest.mark.parametrize(
    ("data", "topo"),
    [
        pytest.param(body(), NVL72x2, id="minimal"),
        pytest.param(body(gpus=2), NVL72x2, id="small-on-one-node"),
        pytest.param(body(gpus=64, topology={"segment": 4}), NVL72x2, id="segments"),
        pytest.param(body(gpus=64, topology={"segment": [16, 8, 4]}), NVL72x2, id="flexible-segments"),
        pytest.param(body(gpus=64, topology={"segment": [8]}), NVL72x2, id="one-segment-listed"),
        pytest.param(body(gpus=64, min_gpus=16, checkpointable=True), NVL72x2, id="elastic"),
        pytest.param(
            body(gpus=128, min_gpus=64, checkpointable=True, topology={"segment": 8}), NVL72x2, id="elastic-segments"
        ),
        pytest.param(body(gpus=72, topology={"level": "rack"}), NVL72x2, id="level-alias-whole-domain"),
        pytest.param(body(gpus=80, topology={"nvlink": "preferred"}), NVL72x2, id="preferred-may-spill"),
        pytest.param(body(gpus=80, topology={"nvlink": "none"}, priority=-1000), NVL72x2, id="anywhere"),
        pytest.param(body(gpus=80), None, id="no-nodes-skips-domain-size"),
        pytest.param(body(gpus=6), None, id="no-nodes-skips-default-per-node"),
    ],
)
def test_valid(data: bytes, topo: Topology | None) -> None:
    result = validate(data, topo)
    assert not isinstance(result, ApiError), result
    job, spec = result
    assert job == JOB_BODY_JSON.decode(data)
    assert (spec.gpus, spec.tenant, segments(spec), spec.priority) == (
        job.gpus,
        job.tenant,
        body_segments(job),
        job.priority,
    )


def test_job_spec_carries_the_body() -> None:
    data = body(
        gpus=16,
        gpus_per_node=4,
        priority=5,
        exclusive=True,
        checkpointable=True,
        duration_s=30,
        topology={"nvlink": "preferred", "segment": 2, "level": "domain"},
    )
    result = validate(data, NVL72x2, job_id="j1")
    assert not isinstance(result, ApiError)
    _, spec = result
    assert spec.id == "j1" and spec.nvlink is Need.PREFERRED and spec.segment == 2 and spec.level == "domain"
    assert (spec.priority, spec.exclusive, spec.checkpointable) == (5, True, True)
    assert spec.expected_runtime_s == 30  # defaults to duration_s


@pytest.mark.parametrize(
    ("estimate", "limit", "planned"),
    [(None, None, 30), (600, None, 600), (600, 120, 120), (None, 3600, 30), (50, 60, 50)],
)
def test_planning_never_runs_past_the_time_limit(estimate: float | None, limit: float | None, planned: float) -> None:
    result = validate(body(duration_s=30, expected_runtime_s=estimate, time_limit_s=limit), NVL72x2)
    assert not isinstance(result, ApiError), result
    assert result[1].expected_runtime_s == planned


def test_launch_settings_are_accepted_and_carried() -> None:
    data = body(env={"OMP_NUM_THREADS": "8", "NCCL_MNNVL_ENABLE": "0"}, workdir="/shared/run", time_limit_s=60,
                processes="per_gpu", slurm_env=True, output="/shared/run/%x-%j.%t.log")  # fmt: skip
    result = validate(data, NVL72x2)
    assert not isinstance(result, ApiError), result
    assert launch_of(result[0]) == Launch(
        env={"OMP_NUM_THREADS": "8", "NCCL_MNNVL_ENABLE": "0"},
        workdir="/shared/run",
        time_limit_s=60,
        processes="per_gpu",
        slurm_env=True,
        output="/shared/run/%x-%j.%t.log",
        job_name=OK["name"],
    )


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (b'{"gpus": 0}', "gpus", "Expected `int` >= 1"),
        (b'{"topology": {"segment": 0}}', "topology.segment", "Expected `int` >= 1"),
        (b"{}", "name", "Object missing required field `name`"),
        (b'{"name":"a","tenant":"b","gpus":1,"topology":{"x":1}}', "topology.x", "Object contains unknown field `x`"),
        (b"[]", None, "Expected `object`, got `array`"),
    ],
)
def test_error_field_from_msgspec_path(data: bytes, field: str | None, message: str) -> None:
    with pytest.raises(msgspec.ValidationError) as info:
        JOB_BODY_JSON.decode(data)
    assert error_field(info.value) == (field, message)


def _node(name: str, domain: str, clique: int = 0, leaf: str | None = None) -> NodeRecord:
    return NodeRecord(name=name, domain=domain, clique=clique, leaf=leaf)


def _fleet(leaves: tuple[str | None, str | None]) -> list[NodeRecord]:
    """Two NVL72 racks r1, r2 of 18 nodes in two cliques of 9; each rack under the leaf given for it."""
    return [
        _node(f"{rack}-n{i:02d}", rack, i // 9, leaf=leaf)
        for rack, leaf in zip(("r1", "r2"), leaves, strict=True)
        for i in range(18)
    ]


FLEETS = {"leafy": _fleet(("s1", "s2")), "partial": _fleet(("s1", None))}


def test_topology_from_records_levels() -> None:
    topo, _ = topology_from_records([_node("a", "r1"), _node("b", "r1", 1), _node("c", "r2")], generation=7)
    assert topo.levels == ("cluster", "domain", "clique") and topo.generation == 7
    assert topo.group_names[topo.domain] == ("r1", "r2")
    assert topo.group_names[topo.level("clique")] == ("r1.0", "r1.1", "r2.0")
    leafy, _ = topology_from_records(FLEETS["leafy"])
    assert leafy.levels == ("cluster", "leaf", "domain", "clique")
    partial, _ = topology_from_records(FLEETS["partial"])
    assert "leaf" not in partial.levels and partial.group_names[partial.domain] == ("r1", "r2")
    split, _ = topology_from_records([_node("a", "r1", leaf="s1"), _node("b", "r1", leaf="s2")])
    assert "leaf" not in split.levels  # one domain under two leaves: no leaf level either


def _queue_verdict(data: bytes, topo: Topology) -> str | None:
    """What the queue's cycle says of the job on `topo`: the invalid-shape reason, or None (placed or waiting)."""
    body = JOB_BODY_JSON.decode(data)
    result = Scheduler(CycleConfig()).cycle(ClusterState(topo), [job_spec(body, "j")], 0.0)
    invalid = [d for d in result.decisions if isinstance(d, Pending) and d.code is PendingCode.INVALID]
    return invalid[0].reason if invalid else None


@pytest.mark.parametrize("fleet", sorted(FLEETS))
@pytest.mark.parametrize(
    "data",
    [
        pytest.param(body(gpus=64), id="one-domain"),
        pytest.param(body(gpus=72, topology={"level": "leaf"}), id="whole-leaf"),
        pytest.param(body(gpus=128, topology={"segment": 16}), id="segments"),
        pytest.param(body(gpus=80), id="required-bigger-than-domain"),
        pytest.param(body(gpus=80, topology={"segment": 20}), id="segment-bigger-than-domain"),
        pytest.param(body(gpus=40, topology={"level": "clique"}), id="bigger-than-clique"),
        pytest.param(body(gpus=200, topology={"nvlink": "none"}), id="bigger-than-fleet"),
    ],
)
def test_gateway_gives_the_queues_verdict(fleet: str, data: bytes) -> None:
    topo, _ = topology_from_records(FLEETS[fleet])
    gateway = validate(data, topo)
    queue = _queue_verdict(data, topo)
    if isinstance(gateway, ApiError):
        assert queue is not None, f"the gateway refuses what the queue would schedule: {gateway.error}"
        assert gateway.error.split(": ", 1)[1] in queue  # the same words
    else:
        assert queue is None, f"the gateway accepts what the queue can never place: {queue}"


def test_a_leaf_level_is_validated_only_where_it_exists() -> None:
    whole_leaf = body(gpus=72, topology={"level": "leaf"})
    assert not isinstance(validate(whole_leaf, topology_from_records(FLEETS["leafy"])[0]), ApiError)
    refused = validate(whole_leaf, topology_from_records(FLEETS["partial"])[0])
    assert isinstance(refused, ApiError) and refused.field == "topology.level"


def test_idempotent_job_id_is_stable_per_tenant_and_key() -> None:
    a = idempotent_job_id("a", "k1")
    assert a == idempotent_job_id("a", "k1") and len(a) == 32 and int(a, 16) >= 0
    assert a != idempotent_job_id("b", "k1") and a != idempotent_job_id("a", "k2")


# -- OpenAPI ------------------------------------------------------------------------------------------------


def _app_routes() -> set[tuple[str, str]]:
    # Real, unconnected clients: building the app opens no connection.
    names = Names(prefix="unit")
    bus = Bus(nats.aio.client.Client(), names, "gateway")
    deps = Deps(Settings(), names, bus, Store.from_url("redis://x", names), noop_tracer("gateway"))
    app = build_app(deps)
    found = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        found.add((route.method.lower(), str(path)))
    return found


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    doc = openapi.document()
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert _app_routes() == documented


def test_openapi_is_a_valid_3_2_document() -> None:
    import openapi_spec_validator as validator

    doc = openapi.document()
    assert doc["openapi"].startswith("3.2")
    validator.validate(doc)


def test_job_body_schema_is_msgspecs() -> None:
    doc = openapi.document()
    (ref,), components = msgspec.json.schema_components([JobBody], ref_template=openapi.REF)
    # msgspec's, with each field's meaning as its description (shared/jobfile/schema.py)
    assert doc["components"]["schemas"]["JobBody"] == described(components)["JobBody"]
    assert _without_descriptions(doc["components"]["schemas"]["JobBody"]) == _without_descriptions(
        components["JobBody"]
    )
    post = doc["paths"]["/v1/jobs"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == ref


def _without_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_descriptions(v) for k, v in schema.items() if k != "description"}
    return schema
