"""`rackscale submit -f job.yaml` and `rackscale sbatch script.sh`: job files read here, by the one reader
(shared/jobfile/), and sent as the JSON body; the gateway validates it as any submit. An error the reader finds, or
one the gateway finds in a field the file set, is printed with the file's line: `job.yaml:7: ...`.

    rackscale submit -f job.yaml [submit's flags, over the file's fields] [-- CMD ...]
    rackscale sbatch [OPTIONS] script.sh [OPTIONS] [-- ARGS ...]

sbatch's OPTIONS are the script's own (`--nodes 4`, `-t 1:00:00`, `--nvlink=preferred`), read after its lines so
they override them, and this command's switches: --url, --json, --test-only (ask the gateway whether and where it
would run: `?dry_run=true`, said in words, or as JSON with --json), --parsable (print the job id alone),
--idempotency-key.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.cli.client import ApiError, Client, CliError
from shared.jobfile import (
    COMMAND_LINE,
    JobFile,
    JobFileError,
    command_line_words,
    load_script_text,
    load_yaml_text,
    parse_script,
    parse_yaml,
)

Out = Callable[[str], None]

SBATCH_USAGE = """usage: rackscale sbatch [OPTIONS] SCRIPT [OPTIONS] [-- ARGS ...]

Submit an sbatch script: its #SBATCH and #RACKSCALE lines say what the job needs (docs/jobs.md) and the script is
what every node runs. OPTIONS are sbatch's (--nodes 4, -t 1:00:00, --nvlink=preferred, ...) and override the
script's; ARGS are the script's $1 ...

  --url URL               gateway URL (default $RACKSCALE_URL or http://127.0.0.1:8080)
  --json                  print the API's JSON answer
  --test-only             don't submit: ask whether and where it would run (--json: the answer as JSON)
  --parsable              print the job id alone
  --idempotency-key KEY   a retry with the same key names the same job
  -h, --help              this text"""

# this command's own switches (the rest are the script's options): name → takes a value
SWITCHES = {"--url": True, "--json": False, "--test-only": False, "--parsable": False, "--idempotency-key": True}


def read_file(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CliError(f"error: cannot read {path}: {e.strerror or e}") from None


def file_error(path: str, e: JobFileError) -> CliError:
    """`error: job.yaml:7: ...` (compilers' style), `error: command line: ...`, or `error: job.yaml: ...`."""
    if e.line is None:
        return CliError(f"error: {path}: {e.message}")
    if e.line == COMMAND_LINE:
        return CliError(f"error: command line: {e.message}")
    return CliError(f"error: {path}:{e.line}: {e.message}")


def send(
    client: Client,
    path: str,
    job: JobFile,
    *,
    idempotency_key: str | None = None,
    test_only: bool = False,
) -> tuple[int, Any]:
    """POST the job; an error the gateway finds in a field the file set says the file's line."""
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    query = {"dry_run": "true"} if test_only else None
    try:
        resp = client.request("POST", "/v1/jobs", job.body, query=query, headers=headers)
    except ApiError as e:
        line = job.line_of(e.field)
        if line is None or line == COMMAND_LINE:
            raise
        raise CliError(f"error: {path}:{line}: {str(e).removeprefix('error: ')}") from None
    return resp.status, resp.body or {}


def yaml_job(args: argparse.Namespace, flags: Mapping[str, Any], defaults: Mapping[str, Any]) -> JobFile:
    """The YAML file's body with the flags given over it, and `defaults` for what neither gives."""
    try:
        job = parse_yaml(load_yaml_text(read_file(args.file)))
    except JobFileError as e:
        raise file_error(args.file, e) from None
    job = job.with_overrides(flags)
    missing = {k: v for k, v in defaults.items() if k not in job.body}
    return dataclasses.replace(job, body={**job.body, **missing}) if missing else job


def print_answer(
    out: Out,
    status: int,
    doc: Any,
    *,
    as_json: bool,
    parsable: bool = False,
    dry_run: Callable[[dict[str, Any]], str] | None = None,
) -> None:
    """`dry_run`: the answer is a dry run's (--test-only), said in words by this."""
    if as_json:
        out(json.dumps(doc, indent=2, sort_keys=True))
    elif dry_run is not None:
        out(dry_run(doc))
    elif parsable:
        out(str(doc.get("id")))
    elif status == 200:  # the Idempotency-Key named a job submitted before
        out(f"{doc.get('id')}: already submitted with this Idempotency-Key, now {doc.get('state')}")
    else:
        out(f"{doc.get('id')}: submitted ({doc.get('state')})")


# -- rackscale sbatch --------------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class SbatchArgs:
    words: list[str]  # the script's options, the script, `--` and its arguments
    url: str | None = None
    json: bool = False
    test_only: bool = False
    parsable: bool = False
    idempotency_key: str | None = None
    help: bool = False


def sbatch_args(words: Sequence[str]) -> SbatchArgs:
    """This command's switches taken out of its words (before any `--`); the rest stay in order."""
    out = SbatchArgs(words=[])
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            out.words += words[i:]
            break
        name, eq, value = word.partition("=")
        if word in ("-h", "--help"):
            out.help = True
        elif name in SWITCHES:
            if SWITCHES[name] and not eq:
                if i + 1 >= len(words):
                    raise CliError(f"error: {name} needs a value")
                value = words[i + 1]
                i += 1
            elif not SWITCHES[name] and eq:
                raise CliError(f"error: {name} takes no value")
            setattr(out, name[2:].replace("-", "_"), value if SWITCHES[name] else True)
        else:
            out.words.append(word)
        i += 1
    return out


def sbatch(
    args: argparse.Namespace,
    client: Client,
    out: Out,
    *,
    tenant: str,
    describe_dry_run: Callable[[dict[str, Any]], str],
) -> int:
    """`tenant`: the job's when the script names no --account; `describe_dry_run`: --test-only's answer in words."""
    cmd = sbatch_args(args.words)
    if cmd.help:
        out(SBATCH_USAGE)
        return 0
    try:
        options, script, script_args = command_line_words(cmd.words)
    except JobFileError as e:
        raise file_error("", e) from None
    if script is None:
        raise CliError("error: give the script to submit: rackscale sbatch [OPTIONS] SCRIPT\n" + SBATCH_USAGE)
    try:
        job = parse_script(
            load_script_text(read_file(script)),
            filename=os.path.basename(script),
            options=options,
            args=script_args,
            defaults={"tenant": tenant},
        )
    except JobFileError as e:
        raise file_error(script, e) from None
    if cmd.url:
        client = dataclasses.replace(client, base=cmd.url)
    status, doc = send(client, script, job, idempotency_key=cmd.idempotency_key, test_only=cmd.test_only)
    dry_run = describe_dry_run if cmd.test_only else None
    print_answer(out, status, doc, as_json=cmd.json, parsable=cmd.parsable and not dry_run, dry_run=dry_run)
    return 0
