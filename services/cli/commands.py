"""The CLI commands that talk to a running Rackscale over HTTP (submit, jobs, job, cancel, cluster, drain, usage).

Each takes the parsed arguments, a `Client` and an `out` callable, prints its answer and returns the exit
code; failures are raised as `CliError` (printed by `main`, exit 1). `--json` prints the API's answer as is.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec

from services.cli import jobfiles
from services.cli.client import ApiError, Client, CliError, quote
from services.cli.cluster import decode_cluster, draw_cluster
from shared import sse
from shared.api import LogLine
from shared.rank_log import as_text

Out = Callable[[str], None]
LOG_LINE = msgspec.json.Decoder(LogLine)
FOLLOW_RECONNECTS = 5  # a followed log whose stream drops (a gateway restart) is asked again this many times
FOLLOW_RECONNECT_S = 1.0
TENANT_ENV = "RACKSCALE_TENANT"


def default_tenant() -> str:
    env = os.environ.get(TENANT_ENV, "").strip()
    if env:
        return env
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "default"


def _print_json(out: Out, doc: object) -> None:
    out(json.dumps(doc, indent=2, sort_keys=True))


# -- submit ----------------------------------------------------------------------------------------------


def job_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /v1/jobs body: only what was given on the command line (the gateway fills the defaults), and a
    name and tenant."""
    if args.gpus is None:
        raise CliError("error: give --gpus N (or a job file: -f job.yaml)")
    return {**submit_defaults(args), **flag_fields(args)}


def submit_defaults(args: argparse.Namespace) -> dict[str, Any]:
    """The name (the command's, or 'job') and tenant a submit has when neither its flags nor its file say."""
    command: list[str] = list(args.cmd or [])
    return {"name": os.path.basename(command[0]) if command else "job", "tenant": default_tenant()}


def flag_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The body fields `rackscale submit`'s flags (and the command after --) give."""
    command: list[str] = list(args.cmd or [])
    given = {"name": args.name, "tenant": args.tenant, "gpus": args.gpus}
    body: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    topology = {k: v for k, v in (("nvlink", args.nvlink), ("segment", args.segment), ("level", args.level)) if v}
    if topology:
        body["topology"] = topology
    optional = {
        "gpus_per_node": args.gpus_per_node,
        "min_gpus": args.min_gpus,
        "priority": args.priority,
        "duration_s": args.duration,
        "expected_runtime_s": args.expected_runtime,
        "on_node_failure": args.on_node_failure,
        "time_limit_s": args.time_limit,
        "workdir": args.workdir,
        "env": dict(args.env) or None,
        "processes": "per_gpu" if args.per_gpu else None,
        "slurm_env": True if args.slurm_env else None,
        "array": args.array,
        "dependency": args.dependency,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if args.checkpointable:
        body["checkpointable"] = True
    if args.exclusive:
        body["exclusive"] = True
    if command:
        body["command"] = command
    return body


def submit(args: argparse.Namespace, client: Client, out: Out) -> int:
    if args.file:
        job = jobfiles.yaml_job(args, flag_fields(args), submit_defaults(args))
        status, doc = jobfiles.send(
            client, args.file, job, idempotency_key=args.idempotency_key, test_only=args.test_only
        )
        dry_run = (lambda d: describe_dry_run(d, time.time())) if args.test_only else None
        jobfiles.print_answer(out, status, doc, as_json=args.json, dry_run=dry_run)
        return 0
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else None
    if args.test_only:
        return test_only(args, client, out, headers)
    resp = client.post("/v1/jobs", job_body(args), headers=headers)
    doc = resp.body or {}
    if args.json:
        _print_json(out, doc)
    elif resp.status == 200:  # the Idempotency-Key named a job submitted before
        out(f"{doc.get('id')}: already submitted with this Idempotency-Key, now {doc.get('state')}")
    elif args.array:
        out(f"{doc.get('id')}: array submitted ({doc.get('state')}); its tasks: rackscale jobs --array {doc.get('id')}")
    else:
        out(f"{doc.get('id')}: submitted ({doc.get('state')})")
    return 0


def test_only(args: argparse.Namespace, client: Client, out: Out, headers: dict[str, str] | None) -> int:
    """`submit --test-only`: the dry run's answer (POST /v1/jobs?dry_run=true); nothing is submitted."""
    doc = client.request("POST", "/v1/jobs", job_body(args), query={"dry_run": "true"}, headers=headers).body or {}
    if args.json:
        _print_json(out, doc)
    else:
        out(describe_dry_run(doc, time.time()))
    return 0


def describe_dry_run(d: dict[str, Any], now: float) -> str:
    """A dry run's answer in words: when the job would start, where, and why it would wait."""
    alloc = d.get("allocation") or []
    where = ""
    if alloc:
        domains = d.get("domains") or list(dict.fromkeys(p.get("domain") or "?" for p in alloc))
        seg = f", segments of {d['segment']} nodes" if d.get("segment") else ""
        where = f" on {d.get('gpus', 0)} GPUs ({len(alloc)} nodes) in {', '.join(domains)}{seg}"
    start = d.get("start")
    if start == "now":
        lines = [f"would start now{where}"]
    elif start == "never":
        lines = ["would never start on the fleet as it is"]
    elif d.get("forecast_start") is not None:
        how = "reserved" if d.get("reserved") else "estimated: the reservations ahead of it fill the cycle's depth"
        lines = [f"would wait: expected to start in {span(max(0.0, d['forecast_start'] - now))} ({how}){where}"]
    else:
        lines = ["would wait: no start can be forecast now"]
    if d.get("reason"):
        lines.append(("why: " if start == "now" else "reason: ") + d["reason"])
    by_domain: dict[str, list[str]] = {}
    for p in alloc:
        by_domain.setdefault(p.get("domain") or "?", []).append(f"{p['node']}[{_gpu_list(p['gpus'])}]")
    lines += [f"  {dom}: {' '.join(nodes)}" for dom, nodes in by_domain.items()]
    lines.append("(a dry run: nothing was submitted)")
    return "\n".join(lines)


# -- jobs and job --------------------------------------------------------------------------------------------


def ago(t: float | None, now: float) -> str:
    """`12s`, `4m`, `3h`, `2d` since t ('-' for none)."""
    if not t:
        return "-"
    return span(max(0.0, now - t))


def span(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"  # pragma: no cover


def table(header: Sequence[str], rows: Iterable[Sequence[str]], wrap_last: int = 60) -> str:
    """Left-aligned columns; the last column is cut at `wrap_last` characters."""
    rows = [[*r[:-1], _cut(r[-1], wrap_last)] for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=False)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _domains(job: dict[str, Any]) -> str:
    seen = dict.fromkeys(p.get("domain") or "?" for p in job.get("allocation") or [])
    return ",".join(seen) or "-"


def jobs(args: argparse.Namespace, client: Client, out: Out) -> int:
    query = {"tenant": args.tenant, "state": args.state, "limit": args.limit, "offset": args.offset, "cell": args.cell}
    if args.array:
        query["array"] = args.array
    doc = client.get("/v1/jobs", query)
    if args.json:
        _print_json(out, doc)
        return 0
    now = time.time()
    rows = [
        [
            j["id"],
            j["name"],
            j["tenant"],
            j["state"],
            str(j["gpus"]),
            _domains(j),
            ago(j.get("submitted_at"), now),
            j.get("reason") or "",
        ]
        for j in doc["jobs"]
    ]
    headers = ["ID", "NAME", "TENANT", "STATE", "GPUS", "DOMAINS", "AGE", "REASON"]
    filtered = args.tenant or args.state or args.array
    return _page(out, doc, "jobs", headers, rows, "no jobs" + (" match" if filtered else ""))


def _page(out: Out, doc: dict[str, Any], noun: str, headers: list[str], rows: list[list[str]], empty: str) -> int:
    """One page of a listing: its table (or `empty`), and where the next page starts when there is one."""
    if not rows:
        out(empty)
        return 0
    out(table(headers, rows))
    shown, total = len(rows), doc.get("total", len(rows))
    if total > shown:
        out(f"{shown} of {total} {noun} (--offset {doc.get('offset', 0) + shown} for more)")
    return 0


def _placed(parts: Sequence[dict[str, Any]]) -> str:
    return " ".join(f"{p['node']}:{_gpu_list(p['gpus'])}" for p in parts) or "-"


def migrations(args: argparse.Namespace, client: Client, out: Out) -> int:
    query = {"tenant": args.tenant, "job": args.job, "limit": args.limit, "offset": args.offset, "cell": args.cell}
    doc = client.get("/v1/migrations", query)
    if args.json:
        _print_json(out, doc)
        return 0
    now = time.time()
    rows = [
        [
            m["id"],
            m["job_id"],
            m["kind"],
            m["state"],
            _placed(m["from"]),
            _placed(m["to"]) if m["to"] else "(requeued)",
            ago(m.get("created_at"), now),
            "-" if m.get("took_s") is None else f"{m['took_s']:.1f}s",
            (m.get("error") + ": " if m.get("error") else "") + m["why"],
        ]
        for m in doc["migrations"]
    ]
    headers = ["ID", "JOB", "KIND", "STATE", "FROM", "TO", "AGE", "TOOK", "WHY"]
    return _page(out, doc, "migrations", headers, rows, "no migrations")


def _gpu_list(gpus: Sequence[int]) -> str:
    """[0,1,2,3] → `0-3`, [0,2] → `0,2`."""
    if not gpus:
        return "-"
    gs = sorted(gpus)
    if gs == list(range(gs[0], gs[-1] + 1)) and len(gs) > 2:
        return f"{gs[0]}-{gs[-1]}"
    return ",".join(map(str, gs))


def describe_job(j: dict[str, Any], now: float) -> str:
    topo = j.get("topology") or {}
    shape = f"{j['gpus']} GPUs" + (f", {j['gpus_per_node']} per node" if j.get("gpus_per_node") else "")
    if j.get("array_id"):
        array_note = f"task {j.get('array_index')} of array {j['array_id']} ({j.get('array') or '?'})"
    else:
        array_note = ""
    if j.get("min_gpus"):
        held = sum(len(a["gpus"]) for a in j.get("allocation") or [])
        shape = f"elastic {j['min_gpus']}-{j['gpus']} GPUs" + (f" (has {held})" if held else "")
    shape += f", nvlink {topo.get('nvlink', 'required')}"
    seg = topo.get("segment")
    if isinstance(seg, list):
        got = f"; this attempt has {j['segment']}" if j.get("segment") else ""
        shape += f", segments of {' or '.join(map(str, seg))} nodes{got}"
    elif seg:
        shape += f", segments of {seg} nodes"
    if topo.get("level") and topo.get("level") != "domain":
        shape += f", level {topo['level']}"
    flags = [f for f in ("exclusive", "checkpointable") if j.get(f)]
    rows: list[tuple[str, str]] = [
        ("id", j["id"]),
        ("name", j["name"]),
        ("tenant", j["tenant"]),
        ("state", j["state"]),
    ]
    if array_note:
        rows.append(("array", array_note))
    if j.get("dependency"):
        rows.append(("dependency", j["dependency"]))
    reason = j.get("reason") or ""
    if reason:
        rows.append(("pending reason" if j["state"] == "pending" else "reason", reason))
    rows += [
        ("shape", shape),
        ("priority", str(j.get("priority", 0)) + (f" ({', '.join(flags)})" if flags else "")),
        ("attempt", str(j.get("attempt", 0))),
        ("submitted", f"{ago(j.get('submitted_at'), now)} ago"),
    ]
    launch = [f"one process per {'GPU' if j.get('processes') == 'per_gpu' else 'node'}"]
    if j.get("time_limit_s"):
        launch.append(f"time limit {span(j['time_limit_s'])}")
    if j.get("workdir"):
        launch.append(f"in {j['workdir']}")
    rows.insert(next(i for i, (k, _) in enumerate(rows) if k == "shape") + 1, ("launch", ", ".join(launch)))
    started, ended = j.get("started_at"), j.get("ended_at")
    if started:
        rows.append(("started", f"{ago(started, now)} ago"))
    if ended:
        ran = f", ran {span(ended - started)}" if started else ""
        why = f" ({j['end']})" if j.get("end") else ""
        rows.append(("ended", f"{ago(ended, now)} ago{ran}{why}"))
    width = max(len(k) for k in [*(k for k, _ in rows), "allocation", "exit codes"])
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    alloc = j.get("allocation") or []
    if alloc:
        by_domain: dict[str, list[str]] = {}
        for p in alloc:
            by_domain.setdefault(p.get("domain") or "?", []).append(f"{p['node']}[{_gpu_list(p['gpus'])}]")
        lines.append(f"{'allocation'.ljust(width)}  {len(alloc)} nodes in {len(by_domain)} domain(s)")
        lines += [f"{''.ljust(width)}    {d}: {' '.join(nodes)}" for d, nodes in by_domain.items()]
    exits = j.get("exits") or []
    codes = j.get("exit_codes") or {}
    if exits:
        lines.append(f"{'exits'.ljust(width)}  {len(exits)} rank(s)")
        for e in exits:
            how = f"killed by {e['signal']}" if e.get("signal") else f"exited {e['exit_code']}"
            lines.append(f"{''.ljust(width)}    rank {e['rank']} on {e['node']}: {how} ({e['cause']})")
    elif codes:  # a gateway that predates `exits`
        lines.append(f"{'exit codes'.ljust(width)}  " + " ".join(f"{k}={v}" for k, v in sorted(codes.items())))
    return "\n".join(lines)


def job(args: argparse.Namespace, client: Client, out: Out) -> int:
    try:
        doc = client.get(f"/v1/jobs/{quote(args.id)}")
    except ApiError as e:
        if e.status != 404 or " is an array of " not in e.error:
            raise
        # an array's id names no job: its tasks instead
        listing = argparse.Namespace(
            json=args.json, tenant=None, state=None, array=args.id, limit=500, offset=0, cell=None
        )
        return jobs(listing, client, out)
    if args.json:
        _print_json(out, doc)
    else:
        out(describe_job(doc, time.time()))
    return 0


def cancel(args: argparse.Namespace, client: Client, out: Out) -> int:
    doc = client.delete(f"/v1/jobs/{quote(args.id)}").body or {}
    if args.json:
        _print_json(out, doc)
    else:
        out(f"{doc.get('id', args.id)}: {doc.get('state', 'cancelling')}")
    return 0


def logs(args: argparse.Namespace, client: Client, out: Out) -> int:
    """What the job's processes wrote; `-f` goes on as they write until the job has ended (a dropped stream is
    picked up where it left off, FOLLOW_RECONNECTS times at most)."""
    path = f"/v1/jobs/{quote(args.id)}/logs"
    query = {"rank": args.rank, "tail": args.tail, "attempt": args.attempt}
    if not args.follow:
        for line in client.lines(path, query):
            out(line.removesuffix("\n"))
        return 0
    reader = sse.Reader()
    for attempt in range(FOLLOW_RECONNECTS + 1):
        if attempt:
            client.sleep(FOLLOW_RECONNECT_S)
        for ev in client.events(path, {**query, "follow": "true"}, reader):
            if ev.event == "line":
                out(as_text(LOG_LINE.decode(ev.data), prefix=args.rank is None).removesuffix("\n"))
            elif ev.event == "end":
                return 0
    raise CliError(f"error: the log stream of {args.id} kept dropping; `rackscale logs {args.id}` shows what came")


# -- cluster and nodes -----------------------------------------------------------------------------------------


def cluster(args: argparse.Namespace, client: Client, out: Out) -> int:
    resp = client.request("GET", "/v1/cluster", query={"cell": args.cell})
    if args.json:
        _print_json(out, resp.body)
        return 0
    try:
        view = decode_cluster(resp.raw)
    except ValueError as e:  # msgspec errors are ValueErrors
        raise CliError(f"error: the cluster document from {client.base} is not one this CLI reads: {e}") from None
    out(draw_cluster(view))
    return 0


def _admin(action: str, args: argparse.Namespace, client: Client, out: Out) -> int:
    body = {"reason": args.reason} if getattr(args, "reason", None) else None
    doc = client.request("POST", f"/v1/nodes/{quote(args.node)}/{action}", body, query={"cell": args.cell}).body or {}
    if args.json:
        _print_json(out, doc)
    else:
        out(f"{doc.get('node', args.node)}: {doc.get('state', '?')}")
    return 0


def drain(args: argparse.Namespace, client: Client, out: Out) -> int:
    return _admin("drain", args, client, out)


def undrain(args: argparse.Namespace, client: Client, out: Out) -> int:
    return _admin("undrain", args, client, out)


def clear_health(args: argparse.Namespace, client: Client, out: Out) -> int:
    return _admin("clear-health", args, client, out)


def sbatch(args: argparse.Namespace, client: Client, out: Out) -> int:
    return jobfiles.sbatch(
        args, client, out, tenant=default_tenant(), describe_dry_run=lambda d: describe_dry_run(d, time.time())
    )


def usage(args: argparse.Namespace, client: Client, out: Out) -> int:
    """GPU-hours per tenant and day or week (GET /v1/usage); --csv prints the gateway's CSV as it is."""
    query = {"tenant": args.tenant, "from": args.start, "to": args.end, "by": args.by}
    if args.csv:
        for line in client.lines("/v1/usage", {**query, "format": "csv"}):
            out(line.rstrip("\n"))
        return 0
    doc = client.get("/v1/usage", query)
    if args.json:
        _print_json(out, doc)
        return 0
    rows = [[r["period"], r["tenant"], f"{r['gpu_hours']:,.2f}", str(r["jobs"])] for r in doc["rows"]]
    if not rows:
        out("no usage in that range")
        return 0
    out(table(["PERIOD", "TENANT", "GPU-HOURS", "JOBS"], rows))
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Client, Out], int]] = {
    "submit": submit,
    "sbatch": sbatch,
    "jobs": jobs,
    "job": job,
    "cancel": cancel,
    "logs": logs,
    "cluster": cluster,
    "drain": drain,
    "undrain": undrain,
    "clear-health": clear_health,
    "migrations": migrations,
    "usage": usage,
}
