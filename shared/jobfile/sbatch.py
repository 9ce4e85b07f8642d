"""An sbatch script as a job (`rackscale sbatch script.sh`, `Content-Type: text/x-shellscript`).

The options are read as sbatch reads them: from `#SBATCH` lines (and Rackscale's own `#RACKSCALE` lines) at the
start of a line in the leading comment block — reading stops at the first line that is neither blank nor a comment
(the `#!` line is a comment). On a line, options split at whitespace, quotes group, a backslash escapes and an
unquoted `#` starts a comment; each is `--opt=value`, `--opt value`, `-x value` or `-xvalue`, by its full name (no
abbreviations). What each becomes is in shared/jobfile/options.py (docs/jobs.md); an option given twice keeps the
last, and options given on the command line come after the file's (they override it, as sbatch's do).

The script itself becomes the job's command, `[SHELL, -c, SCRIPT, NAME, ARGS...]`: it runs on every node of the
allocation (once per node, or once per GPU with `--ntasks-per-node` = the GPUs per node) under the launch contract,
as if srun had already started it there. The shell is the `#!` line's when it names one (bash, sh, zsh, dash, ksh,
directly or through env), else bash.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.jobfile.errors import COMMAND_LINE, JobFileError
from shared.jobfile.jobfile import JobFile
from shared.jobfile.options import (
    BY_LONG,
    BY_SHORT,
    NOT_OPTIONS,
    REFUSED_LONG,
    REFUSED_SHORT,
    Kind,
    Option,
)
from shared.output_path import OutputPatternError, check_output_pattern

SCRIPT_MAX_BYTES = 64 * 1024  # well under Linux's 128 KiB for one argument (MAX_ARG_STRLEN): the script is one
SHELLS = ("bash", "sh", "zsh", "dash", "ksh")
MAGIC: dict[str, Kind] = {"#SBATCH": "sbatch", "#RACKSCALE": "rackscale"}
DEFAULT_SHELL = "bash"
DEFAULT_NAME = "script"  # a script's job name when it has no --job-name and no file name


@dataclass(frozen=True, slots=True)
class Directive:
    option: Option
    value: str | None
    line: int  # the file's line, or COMMAND_LINE
    text: str  # as written, for messages: `--nodes=4`, `-N 4`


@dataclass(frozen=True, slots=True)
class Setting:
    value: Any
    line: int
    text: str


@dataclass(slots=True)
class Settings:
    """What the directives said, the last word for each setting (`env.NAME` one setting per variable)."""

    by_key: dict[str, Setting] = field(default_factory=dict)

    def add(self, d: Directive) -> None:
        try:
            values = d.option.apply(d.value)
        except ValueError as e:
            raise JobFileError(f"{d.text}: {e}", d.line) from None
        for key, value in values.items():
            self.by_key.pop(key, None)  # re-inserted: the order is the order they were given in
            self.by_key[key] = Setting(value, d.line, d.text)

    def get(self, key: str) -> Setting | None:
        return self.by_key.get(key)

    def value(self, key: str, default: Any = None) -> Any:
        s = self.by_key.get(key)
        return default if s is None else s.value

    def env(self) -> dict[str, Setting]:
        return {k.removeprefix("env."): s for k, s in self.by_key.items() if k.startswith("env.")}


# -- reading a script --------------------------------------------------------------------------------------------


def load_script_text(data: bytes) -> str:
    """A script's bytes as text (UTF-8). Raises JobFileError when they aren't."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JobFileError(f"not UTF-8 text (byte {e.start}): a script is text") from None


def directive_lines(text: str) -> list[tuple[int, Kind, str]]:
    """(line number, kind, the rest of the line) of each #SBATCH / #RACKSCALE line of the leading comment block."""
    out: list[tuple[int, Kind, str]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.endswith("\r"):
            raise JobFileError("the script has DOS line breaks (\\r\\n): save it with Unix ones (\\n)", number)
        if "\0" in line:
            raise JobFileError("a NUL byte: a script is text", number)
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break  # the first command: sbatch reads no further
        if line.startswith("#SLURM"):
            raise JobFileError("#SLURM is sbatch's old spelling: write #SBATCH", number)
        for magic, kind in MAGIC.items():
            if line.startswith(magic):
                out.append((number, kind, line[len(magic) :]))
                break
    return out


def split_words(rest: str, line: int) -> list[str]:
    """One directive line's words, as sbatch splits them: whitespace separates, quotes group, a backslash escapes
    the next character, an unquoted `#` starts a comment."""
    words: list[str] = []
    cur: list[str] = []
    have = escaped = False
    quote = ""
    for c in rest:
        if escaped:
            cur.append(c)
            escaped = False
        elif c == "\\":
            escaped = have = True
        elif quote:
            if c == quote:
                quote = ""
            else:
                cur.append(c)
        elif c in "\"'":
            quote, have = c, True
        elif c == "#":
            break
        elif c.isspace():
            if have:
                words.append("".join(cur))
                cur, have = [], False
        else:
            cur.append(c)
            have = True
    if quote:
        raise JobFileError(f"unmatched {quote}", line)
    if have:
        words.append("".join(cur))
    return words


def read_options(words: Sequence[str], line: int, kind: Kind | None) -> list[Directive]:
    """The directives `words` give (on a `kind` line; None: the command line, where both kinds are read)."""
    out: list[Directive] = []
    i = 0
    while i < len(words):
        word = words[i]
        taken = 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            option = _long(name, word, line)
            if option.arg == "value" and not eq:
                if i + 1 >= len(words):
                    raise JobFileError(f"{word} needs a value (--{name}={option.metavar})", line)
                value, taken = words[i + 1], 2
            elif option.arg == "flag" and eq:
                raise JobFileError(f"{word}: --{name} takes no value", line)
            given: str | None = value if (eq or taken == 2) else None
        elif word.startswith("-") and len(word) > 1 and word != "--":
            option = _short(word[1], word, line)
            attached = word[2:]
            if option.arg == "flag":
                if attached:
                    raise JobFileError(f"{word}: -{word[1]} takes no value", line)
                given = None
            elif attached:
                given = attached
            elif i + 1 < len(words):
                given, taken = words[i + 1], 2
            else:
                raise JobFileError(f"{word} needs a value (-{word[1]} {option.metavar})", line)
        elif word in NOT_OPTIONS:
            raise JobFileError(f"{word}: {NOT_OPTIONS[word]}", line)
        else:
            raise JobFileError(f"'{word}' is not an option (options start with - or --)", line)
        if kind is not None and option.kind != kind:
            where = "an #SBATCH" if option.kind == "sbatch" else "a #RACKSCALE"
            raise JobFileError(f"{word}: --{option.long} is read on {where} line", line)
        out.append(Directive(option, given, line, " ".join(words[i : i + taken])))
        i += taken
    return out


def _long(name: str, word: str, line: int) -> Option:
    option = BY_LONG.get(name)
    if option is not None:
        return option
    if name in REFUSED_LONG:
        raise JobFileError(f"{word} is not supported: {REFUSED_LONG[name]}", line)
    near = difflib.get_close_matches(name, list(BY_LONG), n=1)
    hint = f" (did you mean --{near[0]}?)" if near else ""
    raise JobFileError(f"{word} is not an option Rackscale reads{hint}", line)


def _short(letter: str, word: str, line: int) -> Option:
    option = BY_SHORT.get(letter)
    if option is not None:
        return option
    if letter in REFUSED_SHORT:
        raise JobFileError(f"{word} is not supported: {REFUSED_SHORT[letter]}", line)
    raise JobFileError(f"{word} is not an option Rackscale reads", line)


def command_line_words(words: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """`rackscale sbatch`'s words (its own switches taken out) → (the options, the script, the script's arguments).

    Options may come before and after the script; the first word that is neither an option nor an option's value
    is the script, and arguments for it follow `--` (another word is an error: it would be read differently by
    sbatch, where arguments follow the script)."""
    options: list[str] = []
    script: str | None = None
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, script, list(words[i + 1 :])
        if word.startswith("-") and len(word) > 1:
            options.append(word)
            if _takes_next(word) and i + 1 < len(words):
                options.append(words[i + 1])
                i += 1
        elif script is None:
            script = word
        else:
            raise JobFileError(f"'{word}': one script only; arguments for it go after --", COMMAND_LINE)
        i += 1
    return options, script, []


def _takes_next(word: str) -> bool:
    """Whether the option `word` takes the next word as its value (a refused or unknown one is refused here)."""
    if word.startswith("--"):
        name, eq, _ = word[2:].partition("=")
        return _long(name, word, COMMAND_LINE).arg == "value" and not eq
    return _short(word[1], word, COMMAND_LINE).arg == "value" and len(word) == 2


# -- the job -----------------------------------------------------------------------------------------------------


def parse_script(
    text: str,
    *,
    filename: str | None = None,
    options: Sequence[str] = (),
    args: Sequence[str] = (),
    defaults: Mapping[str, str] | None = None,
) -> JobFile:
    """The job an sbatch script asks for. `options`: sbatch options from the command line (they override the
    file's); `args`: the script's arguments ($1 ...); `defaults`: `tenant` (and `name`) when the script gives none.
    Raises JobFileError naming the line (or the command line)."""
    size = len(text.encode())
    if size > SCRIPT_MAX_BYTES:
        raise JobFileError(
            f"the script is {size} bytes, at most {SCRIPT_MAX_BYTES}: keep data in files the script reads "
            "(it travels to every node as one argument)"
        )
    settings = Settings()
    for number, kind, rest in directive_lines(text):
        for d in read_options(split_words(rest, number), number, kind):
            settings.add(d)
    for d in read_options(list(options), COMMAND_LINE, None):
        settings.add(d)
    shell = interpreter(text)
    name = _base(filename) if filename else None
    job = resolve(settings, defaults={"name": _job_name(name), **(defaults or {})})
    job.body["command"] = [*shell, "-c", text, name or DEFAULT_NAME, *args]
    return job


def interpreter(text: str) -> list[str]:
    """The shell the script runs in: its `#!` line's (with that line's one argument), else bash."""
    first = text.split("\n", 1)[0]
    if not first.startswith("#!"):
        return [DEFAULT_SHELL]
    words = first[2:].strip().split(None, 1)  # as the kernel reads it: the program and one argument
    if not words:
        raise JobFileError("#! names no program", 1)
    program, arg = words[0], (words[1] if len(words) > 1 else "")
    if _base(program) == "env":
        env_words = [w for w in arg.split() if w != "-S"]
        if env_words and _base(env_words[0]) in SHELLS:
            return [program, *env_words]
        shown = env_words[0] if env_words else "nothing"
    elif _base(program) in SHELLS:
        return [program, *([arg] if arg else [])]
    else:
        shown = program
    raise JobFileError(f"{first}: a job script runs in a shell ({', '.join(SHELLS)}); run {shown} from one", 1)


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _job_name(filename: str | None) -> str:
    """sbatch names a job after its script: the file name, made a valid name (letters, digits, `._-`)."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in filename or "")
    cleaned = cleaned.lstrip("._-")[:128]
    return cleaned or DEFAULT_NAME


@dataclass(slots=True)
class _Body:
    """The body under construction, with each field's line."""

    body: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def put(self, path: str, value: Any, line: int | None) -> None:
        node = self.body
        *parents, last = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        if line is not None:
            self.lines[path] = line


def resolve(settings: Settings, defaults: Mapping[str, str]) -> JobFile:
    """The body the settings make: GPUs from nodes, GPUs per node and tasks; the rest field by field."""
    out = _Body()
    for key in ("name", "tenant"):
        s = settings.get(key)
        if s is not None:
            out.put(key, s.value, s.line)
        elif key in defaults:
            out.put(key, defaults[key], None)
        else:
            raise JobFileError(f"no {key}: add #SBATCH --{'job-name' if key == 'name' else 'account'}=...")
    _gpus(settings, out)
    simple = {
        "segment": "topology.segment",
        "nvlink": "topology.nvlink",
        "level": "topology.level",
        "array": "array",
        "dependency": "dependency",
        "priority": "priority",
        "exclusive": "exclusive",
        "checkpointable": "checkpointable",
        "expected_runtime": "expected_runtime_s",
        "duration": "duration_s",
        "slurm_env": "slurm_env",
    }
    for key, path in simple.items():
        s = settings.get(key)
        if s is not None:
            out.put(path, s.value, s.line)
    if (s := settings.get("time")) is not None and s.value is not None:
        out.put("time_limit_s", s.value, s.line)  # None (UNLIMITED) leaves the body's default: no limit
        if settings.get("expected_runtime") is None:
            out.put("expected_runtime_s", s.value, s.line)  # as Slurm's backfill, plan with --time
    if (s := settings.get("requeue")) is not None:
        out.put("on_node_failure", "requeue" if s.value else "fail", s.line)
    if (s := settings.get("workdir")) is not None:
        out.put("workdir", s.value, s.line)
    for name, s in settings.env().items():
        out.put(f"env.{name}", s.value, s.line)
    _output(settings, out)
    return JobFile(body=out.body, lines=out.lines)


def _gpus(settings: Settings, out: _Body) -> None:
    """`gpus`, `gpus_per_node`, `min_gpus` and `processes` from --nodes, --gpus-per-node (--gres), --gpus,
    --ntasks-per-node, --ntasks and #RACKSCALE --min-gpus."""
    nodes, gpn, total = settings.get("nodes"), settings.get("gpn"), settings.get("gpus")
    per_node: int | None = gpn.value if gpn is not None else None
    n_nodes: int | None = None  # the job's node count, when known
    if total is not None:
        gpus, gpus_line = total.value, total.line
        if nodes is not None:
            low, high = nodes.value
            if low != high:
                raise JobFileError(f"{total.text}: give GPUs per node with a node range ({nodes.text})", total.line)
            n_nodes = high
            if per_node is None:
                if gpus % high:
                    raise JobFileError(f"{total.text} doesn't divide over {nodes.text}", total.line)
                per_node = gpus // high
                out.put("gpus_per_node", per_node, total.line)
            elif gpus != high * per_node:
                raise JobFileError(
                    f"{total.text} is not {nodes.text} × {gpn.text if gpn else ''} ({high * per_node} GPUs)",
                    total.line,
                )
        elif per_node is not None and gpus % per_node == 0:
            n_nodes = gpus // per_node
    elif nodes is not None:
        if per_node is None:
            raise JobFileError(f"{nodes.text}: say how many GPUs each node: add --gpus-per-node=N", nodes.line)
        low, high = nodes.value
        gpus, gpus_line = high * per_node, nodes.line
        if low != high:
            _elastic(settings, nodes, low * per_node, out)
        else:
            n_nodes = high
    elif per_node is not None:
        gpus, gpus_line, n_nodes = per_node, gpn.line if gpn else None, 1  # one node, as sbatch's default
    else:
        raise JobFileError(
            "the job asks for no GPUs: add #SBATCH --gpus-per-node=N (and --nodes=N for more than one node)"
        )
    out.put("gpus", gpus, gpus_line)
    if gpn is not None:
        out.put("gpus_per_node", gpn.value, gpn.line)
    if (m := settings.get("min_gpus")) is not None:
        if nodes is not None and nodes.value[0] != nodes.value[1]:
            later = m if _position(settings, "min_gpus") > _position(settings, "nodes") else nodes
            raise JobFileError(f"{later.text}: give one of --nodes=MIN-MAX and --min-gpus", later.line)
        out.put("min_gpus", m.value, m.line)
    _processes(settings, out, gpus, per_node, n_nodes, nodes)


def _position(settings: Settings, key: str) -> int:
    return list(settings.by_key).index(key)


def _elastic(settings: Settings, nodes: Setting, min_gpus: int, out: _Body) -> None:
    low, high = nodes.value
    if settings.get("checkpointable") is None:
        raise JobFileError(
            f"{nodes.text} is a node range: Rackscale runs it elastic ({low} to {high} nodes, resized at "
            "checkpoints), which needs #RACKSCALE --checkpointable",
            nodes.line,
        )
    out.put("min_gpus", min_gpus, nodes.line)


def _processes(
    settings: Settings, out: _Body, gpus: int, per_node: int | None, n_nodes: int | None, nodes: Setting | None
) -> None:
    tpn, ntasks = settings.get("tpn"), settings.get("ntasks")
    chosen: str | None = None
    if tpn is not None:
        if tpn.value == 1:
            chosen = "per_node"
        elif per_node is not None and tpn.value == per_node:
            chosen = "per_gpu"
        else:
            gpn_said = f"= the GPUs per node, {per_node}" if per_node else "= the GPUs per node (give --gpus-per-node)"
            raise JobFileError(
                f"{tpn.text}: Rackscale starts one process per node (1) or one per GPU ({gpn_said})", tpn.line
            )
        out.put("processes", chosen, tpn.line)
    if ntasks is not None:
        if nodes is not None and nodes.value[0] != nodes.value[1]:
            raise JobFileError(f"{ntasks.text}: with a node range give --ntasks-per-node", ntasks.line)
        if n_nodes is not None and ntasks.value == n_nodes:
            by_ntasks = "per_node"
        elif ntasks.value == gpus and (n_nodes is not None or per_node is not None):
            by_ntasks = "per_gpu"
        else:
            nodes_said = f"{n_nodes} nodes" if n_nodes is not None else "the nodes (give --gpus-per-node)"
            raise JobFileError(
                f"{ntasks.text}: Rackscale starts one process per node ({nodes_said}) or one per GPU ({gpus})",
                ntasks.line,
            )
        if chosen is not None and chosen != by_ntasks:
            raise JobFileError(f"{ntasks.text} disagrees with {tpn.text if tpn else ''}", ntasks.line)
        out.put("processes", by_ntasks, ntasks.line)


def _output(settings: Settings, out: _Body) -> None:
    """`output` from --output (and --error, which may only name the same file: one pipe carries both)."""
    workdir = settings.value("workdir")
    output, error = settings.get("output"), settings.get("error")
    path = _output_path(output, workdir) if output is not None else None
    if error is not None:
        if output is None:
            raise JobFileError(
                f"{error.text}: give --output; a rank's stdout and stderr go to one file together", error.line
            )
        if _output_path(error, workdir) != path:
            raise JobFileError(
                f"{error.text} is not the --output file: a rank's stdout and stderr go to one file together "
                "(drop --error, or name the same file)",
                error.line,
            )
    if output is not None and path:
        _check_pattern(path, output)
        out.put("output", path, output.line)


def _output_path(s: Setting, workdir: str | None) -> str:
    text = str(s.value)
    if text.lower() == "none":
        return ""
    if text.startswith("/"):
        return text
    if workdir:
        return workdir.rstrip("/") + "/" + text
    raise JobFileError(
        f"{s.text}: a relative path needs --chdir (the job doesn't start where you submit it); or give an absolute one",
        s.line,
    )


def _check_pattern(path: str, s: Setting) -> None:
    try:
        check_output_pattern(path)
    except OutputPatternError as e:
        raise JobFileError(f"{s.text}: {e}", s.line) from None
