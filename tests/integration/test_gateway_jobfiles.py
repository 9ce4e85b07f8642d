"""POST /v1/jobs with a job file as the body — YAML (`application/yaml`) or an sbatch script
(`text/x-shellscript`) — and GET /v1/schemas/job.json, against real NATS JetStream and Redis (the `gw` harness of
test_gateway.py). A job file's job is the JSON body's; its errors name the file's line; nothing bad reaches the bus.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.gateway import openapi
from shared.jobfile.schema import job_schema
from shared.schemas import JOB_INTAKE, JobBody, JobSubmitted, TopologyBody
from tests.integration.test_gateway import Gw, _node, gw

pytestmark = pytest.mark.asyncio
__all__ = ["gw"]  # the fixture, shared with test_gateway.py

ROOT = Path(__file__).resolve().parents[2]
YAML_JOB = """\
name: train
tenant: a
gpus: 8
topology:
  nvlink: preferred
"""
SCRIPT = """#!/bin/bash
#SBATCH --job-name=train --account=a
#SBATCH --nodes=2 --gpus-per-node=4
#RACKSCALE --nvlink=preferred
echo "$RANK"
"""


async def post(gw: Gw, data: str | bytes, content_type: str) -> tuple[int, dict[str, Any]]:
    resp = await gw.client.post("/v1/jobs", data=data, headers={"Content-Type": content_type})
    return resp.status, await resp.json()


async def submitted(gw: Gw) -> JobBody:
    (msg,) = await gw.pull(gw.names.job_submit)
    sub = JOB_INTAKE.decode(msg.data)
    assert isinstance(sub, JobSubmitted)
    return sub.spec


@pytest.mark.parametrize("content_type", ["application/yaml", "application/x-yaml", "text/yaml; charset=utf-8"])
async def test_a_yaml_body_is_the_json_job(gw: Gw, content_type: str) -> None:
    status, doc = await post(gw, YAML_JOB, content_type)
    assert status == 202 and doc["state"] == "pending"
    assert await submitted(gw) == JobBody(name="train", tenant="a", gpus=8, topology=TopologyBody(nvlink="preferred"))


async def test_an_sbatch_script_is_a_job_running_the_script(gw: Gw) -> None:
    status, _ = await post(gw, SCRIPT, "text/x-shellscript")
    assert status == 202
    spec = await submitted(gw)
    assert (spec.name, spec.tenant, spec.gpus, spec.gpus_per_node, spec.topology.nvlink) == (
        "train",
        "a",
        8,
        4,
        "preferred",
    )
    assert spec.command == ["/bin/bash", "-c", SCRIPT, "script"]


@pytest.mark.parametrize(
    ("data", "content_type", "status", "field", "error"),
    [
        ("name: x\ntenant: a\ngpus: [1\n", "application/yaml", 400, None, "line 4: not valid YAML"),
        ("- 1\n", "application/yaml", 400, None, "line 1: the file must be a mapping"),
        ("name: x\nname: y\n", "application/yaml", 400, "name", "line 2: name is given twice"),
        ("name: x\ntenant: a\ngpus: 0\n", "application/yaml", 422, "gpus", "line 3: gpus: Expected `int` >= 1"),
        ("name: x\ntenant: a\ngpus: 1\ncolour: red\n", "application/yaml", 422, "colour",
         "line 4: colour: Object contains"),
        ("name: x\ntenant: a\ngpus: 1\nworkdir: rel\n", "application/yaml", 422, "workdir",
         "line 4: workdir: an absolute"),
        (b"name: \xff\n", "application/yaml", 400, None, "not UTF-8"),
        ("#!/bin/bash\n#SBATCH -A a -N 2\n#SBATCH --mem=64G\n", "text/x-shellscript", 422, None,
         "line 3: --mem=64G is not supported: Rackscale schedules whole GPUs"),
        ("#!/bin/bash\n#SBATCH --gpus-per-node=4\n", "text/x-shellscript", 422, None,
         "no tenant: add #SBATCH --account"),
        ("#!/bin/bash\n#SBATCH -A a --gpus-per-node=4\n#SBATCH -J 'a b'\n", "text/x-shellscript", 422, "name",
         "line 3: name: Expected `str` matching"),
        (b"#!/bin/bash\n\xff\n", "text/x-shellscript", 400, None, "not UTF-8"),
    ],
)  # fmt: skip
async def test_a_bad_job_file_names_its_line_and_publishes_nothing(
    gw: Gw, data: str | bytes, content_type: str, status: int, field: str | None, error: str
) -> None:
    got, doc = await post(gw, data, content_type)
    assert (got, doc["field"]) == (status, field), doc
    assert doc["error"].startswith(error), doc
    assert await gw.stream_count(gw.names.job_submit) == 0


async def test_a_shape_the_fleet_cant_hold_names_the_line_that_asked_for_it(gw: Gw) -> None:
    for i in range(2):
        await gw.deps.store.put_node(_node(f"n{i}", "r1"))
    status, doc = await post(gw, SCRIPT.replace("--nodes=2", "--nodes=4"), "text/x-shellscript")
    assert status == 422 and doc == {"error": "line 3: gpus: 16 GPUs need 4 nodes; the cluster has 2", "field": "gpus"}
    status, doc = await post(gw, YAML_JOB.replace("gpus: 8", "gpus: 16"), "application/yaml")
    assert status == 422 and doc == {"error": "line 3: gpus: 16 GPUs need 4 nodes; the cluster has 2", "field": "gpus"}
    assert await gw.stream_count(gw.names.job_submit) == 0


async def test_the_job_schema_is_served_checked_in_and_the_openapi_documents(gw: Gw) -> None:
    resp = await gw.client.get("/v1/schemas/job.json")
    assert resp.status == 200 and resp.content_type == "application/schema+json"
    served = json.loads(await resp.read())
    assert served == job_schema() == json.loads((ROOT / "docs" / "job.schema.json").read_text())
    # the same schema as the OpenAPI document's JobBody, refs aside
    components = openapi.document()["components"]["schemas"]
    as_openapi = json.loads(json.dumps(served["$defs"]).replace("#/$defs/", openapi.REF.format(name="")))
    for name, schema in as_openapi.items():
        assert components[name] == schema, name
