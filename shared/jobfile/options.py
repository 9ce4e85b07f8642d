"""Every option an sbatch script (or the command line beside it) may give, what it becomes, and what is refused.

`#SBATCH` lines take Slurm's options by Slurm's names (long, and the short letters sbatch has); `#RACKSCALE` lines
take Rackscale's own fields. Each supported option parses its value into settings (`apply`); the sbatch reader
(shared/jobfile/sbatch.py) resolves the settings into the job body. Any other option is refused naming its line:
the ones sbatch has with the reason Rackscale doesn't (`REFUSED`), anything else as unknown. docs/jobs.md carries
`directive_table()` and `refusal_table()` as generated here (a test checks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from shared.core.arrays import ArraySyntaxError, parse_array
from shared.core.dependencies import DependencySyntaxError, parse_dependency
from shared.jobfile.qos import QOS, qos_priority
from shared.jobfile.slurm_values import (
    TIME_FORMATS,
    UNLIMITED,
    parse_count,
    parse_gpu_count,
    parse_gres,
    parse_int,
    parse_node_range,
    parse_segments,
    parse_time,
)

Arg = Literal["value", "flag", "optional"]  # needs a value, takes none, or takes one only as --opt=value
Kind = Literal["sbatch", "rackscale"]
Settings = dict[str, Any]

PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # the body's priority range (shared/schemas.py JobBody)


@dataclass(frozen=True, slots=True)
class Option:
    long: str
    apply: Callable[[str | None], Settings]  # the value → settings; ValueError says what is wrong with it
    meaning: str  # what it becomes (docs/jobs.md)
    short: str = ""
    arg: Arg = "value"
    kind: Kind = "sbatch"
    metavar: str = "VALUE"

    def spelled(self) -> str:
        value = {"value": f"={self.metavar}", "flag": "", "optional": f"[={self.metavar}]"}[self.arg]
        short = f", `-{self.short}`" if self.short else ""
        return f"`--{self.long}{value}`{short}"


# -- the values --------------------------------------------------------------------------------------------


def _required(value: str | None) -> str:
    assert value is not None  # the reader gives "value" options their value
    return value


def _array(value: str | None) -> Settings:
    text = _required(value).strip()
    try:
        parse_array(text)
    except ArraySyntaxError as e:
        raise ValueError(f"'{text}' {e}") from None
    return {"array": text}


def _dependency(value: str | None) -> Settings:
    text = _required(value).strip()
    try:
        parse_dependency(text)
    except DependencySyntaxError as e:
        raise ValueError(str(e)) from None
    return {"dependency": text}


def _priority(value: str | None) -> Settings:
    text = _required(value)
    if text.strip().upper() == "TOP":
        raise ValueError(f"Slurm's TOP has no match: Rackscale's priorities go from {PRIORITY_MIN} to {PRIORITY_MAX}")
    n = parse_int(text)
    if not PRIORITY_MIN <= n <= PRIORITY_MAX:
        raise ValueError(f"{n} is outside Rackscale's priorities, {PRIORITY_MIN} to {PRIORITY_MAX}")
    return {"priority": n}


def _time_limit(value: str | None) -> Settings:
    return {"time": parse_time(_required(value))}


def _span(value: str | None) -> float:
    """A duration in the --time formats; 0 is zero here, not "no limit"."""
    text = _required(value)
    if text.strip().lower() in UNLIMITED:
        raise ValueError(f"'{text}' is not a duration ({TIME_FORMATS.removesuffix(' or UNLIMITED')})")
    return parse_time(text) or 0.0


def _absolute_dir(value: str | None) -> Settings:
    path = _required(value)
    if not path.startswith("/"):
        raise ValueError(f"'{path}' is not an absolute directory: the job doesn't start where you submit it")
    return {"workdir": path}


def _export(value: str | None) -> Settings:
    """Slurm's --export: `ALL` (the default) and `VAR=value` pairs. The submitter's own variables don't travel
    (`NONE`, a bare `VAR`): a job's processes start with the agent's environment, its `env` and the launch contract."""
    out: Settings = {}
    for item in _required(value).split(","):
        name, sep, val = item.partition("=")
        name = name.strip()
        if not sep and name.upper() == "ALL":
            continue
        if not sep and name.upper() in ("NONE", "NIL"):
            raise ValueError(
                f"{name} can't be honoured: a job's processes always start with the agent's environment, "
                "the job's env and the launch contract"
            )
        if not sep:
            raise ValueError(
                f"'{name}' names a variable of your shell: Rackscale doesn't carry the submitter's environment; "
                f"write {name}=VALUE"
            )
        if not name:
            raise ValueError(f"'{item}' names no variable (VAR=VALUE)")
        out[f"env.{name}"] = val
    return out


def _env(value: str | None) -> Settings:
    name, sep, val = _required(value).partition("=")
    if not sep or not name:
        raise ValueError(f"'{value}' is not NAME=VALUE")
    return {f"env.{name}": val}


def _exclusive(value: str | None) -> Settings:
    if value is not None:
        raise ValueError(f"--exclusive={value} has no match: Rackscale's --exclusive keeps the job's nodes to itself")
    return {"exclusive": True}


def _open_mode(value: str | None) -> Settings:
    if _required(value).strip().lower() != "append":
        raise ValueError(
            f"--open-mode={value} has no match: Rackscale appends to the output file (a requeued attempt's output "
            "follows the one before)"
        )
    return {}


def _nvlink(value: str | None) -> Settings:
    text = _required(value).strip()
    if text not in ("required", "preferred", "none"):
        raise ValueError(f"'{text}' is not required, preferred or none")
    return {"nvlink": text}


def _const(**settings: Any) -> Callable[[str | None], Settings]:
    return lambda _value: dict(settings)


_QOS_NAMES = ", ".join(f"{name} → {prio}" for name, prio in QOS.items())

SUPPORTED: tuple[Option, ...] = (
    Option("job-name", lambda v: {"name": _required(v)}, "`name` (default: the script's file name)", "J",
           metavar="NAME"),
    Option("account", lambda v: {"tenant": _required(v)}, "`tenant` (default: the CLI's tenant, or the token's)",
           "A", metavar="TENANT"),
    Option("nodes", lambda v: {"nodes": parse_node_range(_required(v))},
           "`gpus` = N × GPUs per node; a range `MIN-MAX` is an elastic job (`min_gpus` = MIN × GPUs per node; it "
           "needs `#RACKSCALE --checkpointable`)", "N", metavar="N[-MAX]"),
    Option("gpus-per-node", lambda v: {"gpn": parse_gpu_count(_required(v), "--gpus-per-node")},
           "`gpus_per_node` (a GPU type, `h100:4`, is refused)", metavar="N"),
    Option("gres", lambda v: {"gpn": parse_gres(_required(v))},
           "`gpu:N` → `gpus_per_node` (`gpu` alone: 1; a type, `gpu:h100:4`, or another resource is refused)",
           metavar="gpu:N"),
    Option("gpus", lambda v: {"gpus": parse_gpu_count(_required(v), "--gpus")},
           "`gpus`, all of the job's (with `--nodes`: N × GPUs per node; it sets GPUs per node when none is given)",
           "G", metavar="N"),
    Option("ntasks-per-node", lambda v: {"tpn": parse_count(_required(v))},
           "`processes`: 1 → `per_node`, the GPUs per node → `per_gpu`; another count is refused", metavar="N"),
    Option("ntasks", lambda v: {"ntasks": parse_count(_required(v))},
           "`processes`: one per node → `per_node`, one per GPU → `per_gpu`; another count is refused", "n",
           metavar="N"),
    Option("segment", lambda v: {"segment": parse_segments(_required(v))},
           "`topology.segment`, nodes per segment (`16,8`: Rackscale's flexible sizes, preferred first)",
           metavar="N"),
    Option("time", _time_limit, f"`time_limit_s` ({TIME_FORMATS}; `0` and UNLIMITED: none), and "
           "`expected_runtime_s` unless `--expected-runtime` says", "t", metavar="TIME"),
    Option("array", _array, "`array`, Slurm's syntax (`0-99%8`)", "a", metavar="INDEXES"),
    Option("dependency", _dependency, "`dependency`, Slurm's syntax (`afterok:ID[:ID]`, `afterany`, `afternotok`, "
           "`singleton`, joined by `,`)", "d", metavar="LIST"),
    Option("qos", lambda v: {"priority": qos_priority(_required(v))},
           f"`priority` by name: {_QOS_NAMES} (shared/jobfile/qos.py)", "q", metavar="NAME"),
    Option("priority", _priority, f"`priority` ({PRIORITY_MIN}..{PRIORITY_MAX})", metavar="N"),
    Option("requeue", _const(requeue=True), "`on_node_failure: requeue`", arg="flag"),
    Option("no-requeue", _const(requeue=False), "`on_node_failure: fail`", arg="flag"),
    Option("output", lambda v: {"output": _required(v)},
           "`output`: each rank's output also appended to this file on its node (`none`: not written; a relative "
           "path is under `--chdir`)", "o", metavar="PATTERN"),
    Option("error", lambda v: {"error": _required(v)},
           "stdout and stderr share one file: only the `--output` file itself (or `none` with `--output=none`)",
           "e", metavar="PATTERN"),
    Option("open-mode", _open_mode, "`append` only: the output file is always appended to", metavar="append"),
    Option("chdir", _absolute_dir, "`workdir` (absolute)", "D", metavar="DIR"),
    Option("export", _export, "`env`: `VAR=value,...`; `ALL` (the default) changes nothing; `NONE` and bare names "
           "are refused (a value may not hold a comma: use `#RACKSCALE --env`)", metavar="LIST"),
    Option("exclusive", _exclusive, "`exclusive: true` (no `=user`, `=mcs`, `=topo`)", arg="optional",
           metavar="MODE"),
    # Rackscale's own fields, on #RACKSCALE lines
    Option("nvlink", _nvlink, "`topology.nvlink`: `required`, `preferred` or `none`", kind="rackscale",
           metavar="NEED"),
    Option("level", lambda v: {"level": _required(v)}, "`topology.level`", kind="rackscale", metavar="LEVEL"),
    Option("checkpointable", _const(checkpointable=True), "`checkpointable: true`", arg="flag", kind="rackscale"),
    Option("min-gpus", lambda v: {"min_gpus": parse_count(_required(v), "a GPU count")},
           "`min_gpus` (elastic; needs `--checkpointable`)", kind="rackscale", metavar="N"),
    Option("expected-runtime", lambda v: {"expected_runtime": _span(v)},
           "`expected_runtime_s` (the `--time` formats; without it, `--time` is the estimate, as Slurm's backfill "
           "plans)", kind="rackscale", metavar="TIME"),
    Option("duration", lambda v: {"duration": _span(v)}, "`duration_s`: how long a simulated agent runs a job "
           "without a command (the `--time` formats)", kind="rackscale", metavar="TIME"),
    Option("slurm-env", _const(slurm_env=True), "`slurm_env: true` (the launch contract under Slurm's names too)",
           arg="flag", kind="rackscale"),
    Option("env", _env, "`env.NAME` (repeatable; a value may hold commas)", kind="rackscale", metavar="NAME=VALUE"),
)  # fmt: skip

_CPU_MEMORY = "Rackscale schedules whole GPUs: a node's CPUs and memory come with its GPUs (remove the line)"
_PLACEMENT = (
    "Rackscale places jobs itself, by topology: partitions, nodes and features can't be named "
    "(#RACKSCALE --nvlink and --level say what the job needs)"
)
_GPU_BINDING = (
    "each process sees every GPU of its node and picks its own by LOCAL_RANK: ask for --gpus-per-node "
    "and --ntasks-per-node"
)
_WHEN = "Rackscale starts a job once it fits and its dependencies hold: no start time, deadline or hold"
_SBATCH_ITSELF = "a switch of sbatch itself, not of the job: `rackscale sbatch` takes --test-only and --parsable"

REFUSED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    # (long names, short letters, why)
    (("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "cpus-per-gpu", "mincpus", "tmp", "sockets-per-node",
      "cores-per-socket", "threads-per-core", "extra-node-info", "hint", "ntasks-per-core", "ntasks-per-socket",
      "mem-bind", "cpu-bind", "cpu-freq", "core-spec", "thread-spec", "overcommit", "oversubscribe", "distribution",
      "spread-job", "use-min-nodes"), "cBSOsm", _CPU_MEMORY),
    (("partition", "nodelist", "exclude", "constraint", "cluster-constraint", "clusters", "reservation", "nodefile",
      "switches", "contiguous", "prefer", "network", "licenses", "wckey"), "pwxCMFL", _PLACEMENT),
    (("gpus-per-task", "gpus-per-socket", "gpu-bind", "gpu-freq", "ntasks-per-gpu", "tres-per-task", "tres-bind"), "",
     _GPU_BINDING),
    (("mail-type", "mail-user"), "", "Rackscale sends no mail: follow the job with `rackscale logs -f` or /v1/events"),
    (("begin", "deadline", "hold", "time-min", "delay-boot", "immediate"), "bHI", _WHEN),
    (("signal",), "", "at the time limit Rackscale sends SIGTERM, then SIGKILL 10 s later; no other signal"),
    (("no-kill",), "k", "a job that loses a node is requeued (--requeue) or fails (--no-requeue), never runs on"),
    (("nice",), "", "Rackscale's order is --priority or --qos"),
    (("kill-on-invalid-dep",), "", "not supported: a job whose dependency can never hold ends as the queue decides"),
    (("input",), "i", "a job's processes read no input (stdin is /dev/null)"),
    (("wrap",), "", "the script is the job's command"),
    (("export-file", "get-user-env", "propagate"), "",
     "the submitter's environment and limits don't travel: give variables as --export=VAR=value or #RACKSCALE --env"),
    (("uid", "gid"), "", "a job runs as its agent's user"),
    (("test-only", "parsable", "wait", "quiet", "verbose"), "WQv", _SBATCH_ITSELF),
    (("comment", "acctg-freq", "profile", "power", "bb", "bbf", "burst-buffer", "mcs-label", "container",
      "container-id", "reboot", "x11", "requeue-exit", "gres-flags", "batch"), "",
     "Rackscale has nothing to match it"),
)  # fmt: skip

NOT_OPTIONS = {"hetjob": "heterogeneous jobs are not supported", "packjob": "heterogeneous jobs are not supported"}

BY_LONG: dict[str, Option] = {o.long: o for o in SUPPORTED}
BY_SHORT: dict[str, Option] = {o.short: o for o in SUPPORTED if o.short}
REFUSED_LONG: dict[str, str] = {name: why for longs, _, why in REFUSED for name in longs}
REFUSED_SHORT: dict[str, str] = {letter: why for _, shorts, why in REFUSED for letter in shorts}


def directive_table() -> str:
    """docs/jobs.md's table of what each option becomes."""
    rows = [f"| `#{o.kind.upper()}` | {o.spelled()} | {o.meaning} |" for o in SUPPORTED]
    return "\n".join(["| line | option | becomes |", "| --- | --- | --- |", *rows])


def refusal_table() -> str:
    """docs/jobs.md's table of the sbatch options refused, and why."""
    rows = []
    for longs, shorts, why in REFUSED:
        names = ", ".join([f"`--{n}`" for n in longs] + [f"`-{s}`" for s in shorts])
        rows.append(f"| {names} | {why} |")
    return "\n".join(["| options | why |", "| --- | --- |", *rows])
