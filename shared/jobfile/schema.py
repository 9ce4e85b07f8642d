"""The job body's JSON Schema, field by field documented: the one /openapi.json embeds, served as
/v1/schemas/job.json and checked in as docs/job.schema.json (editors validate YAML job files with it offline).

The schema is msgspec's of `JobBody` (exactly what the strict decoder accepts); what each field means is said once,
in FIELD_DOCS, and put into the schema as descriptions. docs/jobs.md's field table is `field_table()` (a test checks
it, the checked-in schema, and that every field has its words here).

    python -m shared.jobfile.schema > docs/job.schema.json    # after a field changes
"""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec

from shared.schemas import JobBody

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
DEFS_REF = "#/$defs/{name}"
BODY, TOPOLOGY = "JobBody", "TopologyBody"

FIELD_DOCS: dict[str, str] = {
    "name": "the job's name: letters, digits, `.`, `_` and `-` (up to 128), first a letter or digit",
    "tenant": "who the job is for: fair share, quotas and who may see it (a user token submits for its own only)",
    "gpus": "GPUs in all (an elastic job's most)",
    "min_gpus": "elastic: any size from this many GPUs to `gpus`, in whole segments or nodes, resized at "
    "checkpoints (needs `checkpointable`); none: exactly `gpus`",
    "gpus_per_node": "GPUs on each node; none: whole nodes",
    "topology": "where it may run: `nvlink`, `segment`, `level` (below)",
    "topology.nvlink": "`required`: all in one NVLink domain (each segment in one, with `segment`); `preferred`: "
    "if it can be; `none`: anywhere",
    "topology.segment": "nodes per segment, each segment inside one NVLink domain (Slurm's `--segment`); a list: a "
    "flexible job's sizes, preferred first",
    "topology.level": "the topology level the job (or each segment) must fit in",
    "priority": "higher goes first, and may preempt lower",
    "checkpointable": "its ranks write a checkpoint on SIGTERM and resume from `RACKSCALE_RESTORE`: it may be "
    "preempted or moved while it runs",
    "exclusive": "no other job on its nodes",
    "command": "the argv each process runs (up to 256 items); empty: a simulated agent sleeps `duration_s`",
    "duration_s": "how long a simulated agent runs a job that has no command",
    "expected_runtime_s": "your estimate of its run time, what the scheduler plans with; none: `duration_s`",
    "on_node_failure": "when a node under it is lost: `requeue` (start again) or `fail`",
    "env": "variables for its processes, over the agent's environment (up to 64, 32 KiB in all; the launch "
    "contract's names are refused)",
    "workdir": "the absolute directory its processes start in; empty: the agent's own",
    "time_limit_s": "hard: SIGTERM at the limit, SIGKILL 10 s later, and the job ends `failed` (`time limit`)",
    "processes": "`per_node`: one process per node (torchrun style); `per_gpu`: one per GPU (srun style)",
    "slurm_env": "also the launch contract's facts under Slurm's names (`SLURM_PROCID`, `SLURM_NODEID`, ...)",
    "array": "an array of tasks, Slurm's `--array` syntax (`0-99%8`: 100 tasks, at most 8 at once)",
    "dependency": "what it waits for, Slurm's `--dependency` syntax: `afterok:ID[:ID]`, `afterany:`, "
    "`afternotok:`, `singleton`, joined by `,` (all must hold)",
    "output": "also append each rank's output to this file on its node: an absolute path pattern with `%j` job id, "
    "`%x` name, `%t` rank, `%N` node, `%A` array id, `%a` task index, `%%` a percent sign; its directory must "
    "exist there (else the rank fails, saying so)",
}


def described(components: dict[str, Any]) -> dict[str, Any]:
    """Schema components (msgspec's) with FIELD_DOCS as the JobBody and TopologyBody properties' descriptions."""
    out = copy.deepcopy(components)
    for name, prefix in ((BODY, ""), (TOPOLOGY, "topology.")):
        for field, prop in out.get(name, {}).get("properties", {}).items():
            doc = FIELD_DOCS.get(prefix + field)
            if doc is not None:
                prop["description"] = doc
    return out


def job_schema() -> dict[str, Any]:
    """The JSON Schema document of a job body (a JSON submit, or a YAML job file)."""
    (ref,), components = msgspec.json.schema_components([JobBody], ref_template=DEFS_REF)
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "Rackscale job body",
        "description": "POST /v1/jobs, as JSON or YAML (docs/jobs.md).",
        **ref,
        "$defs": described(components),
    }


def body_fields() -> list[str]:
    """Every field of the body, dotted (`topology.segment`), in the order the Structs declare them."""
    out: list[str] = []
    defs = job_schema()["$defs"]
    for field in defs[BODY]["properties"]:
        out.append(field)
        if field == "topology":
            out += [f"topology.{f}" for f in defs[TOPOLOGY]["properties"]]
    return out


def field_table() -> str:
    """docs/jobs.md's table: field, type, default, meaning."""
    defs = job_schema()["$defs"]
    rows = ["| field | type | default | meaning |", "| --- | --- | --- | --- |"]
    for path in body_fields():
        struct, key = (TOPOLOGY, path.split(".", 1)[1]) if path.startswith("topology.") else (BODY, path)
        prop = defs[struct]["properties"][key]
        required = key in defs[struct].get("required", [])
        default = "required" if required else f"`{json.dumps(prop.get('default'))}`"
        rows.append(f"| `{path}` | {_type(prop)} | {default} | {_cell(FIELD_DOCS.get(path, ''))} |")
    return "\n".join(rows)


def _type(prop: dict[str, Any], plural: bool = False) -> str:
    if "anyOf" in prop:
        return " or ".join(_type(p, plural) for p in prop["anyOf"])
    if "$ref" in prop:
        return "objects" if plural else "object"
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    kind = str(prop.get("type") or "any")
    if kind == "array":
        return "list of " + _type(prop.get("items", {}), plural=True)
    if kind == "object":
        return "map of " + _type(prop.get("additionalProperties", {}), plural=True)
    words = [kind + ("s" if plural else "")]
    if "minimum" in prop and "maximum" in prop:
        words.append(f"{prop['minimum']}..{prop['maximum']}")
    else:
        for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤")):
            if key in prop:
                words.append(f"{sign} {prop[key]}")
    return " ".join(words)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


if __name__ == "__main__":
    print(json.dumps(job_schema(), indent=2))
