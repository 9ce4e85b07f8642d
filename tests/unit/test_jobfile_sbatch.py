"""sbatch scripts as jobs (shared/jobfile/sbatch.py): every supported directive and what it becomes, every refusal
with its line, the command-line overrides, how the leading comment block is read, and the script as the command.

A script here is a few `#SBATCH` lines after a shebang; `job(...)` reads one and returns the body (command left out
unless asked for). The real-world-style scripts (examples/) are in test_jobfile_examples.py.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest

from services.gateway.validation import ApiError, check_job, decode_job
from shared.jobfile import COMMAND_LINE, SCRIPT_MAX_BYTES, JobFileError, command_line_words, parse_script
from shared.jobfile.options import REFUSED, SUPPORTED
from shared.jobfile.qos import QOS
from shared.jobfile.slurm_values import parse_time

BASE = ["#SBATCH --account=alice --gpus-per-node=4"]  # line 2: the least a script gives


def script(*lines: str, shebang: str = "#!/bin/bash", body: str = "echo hi\n") -> str:
    return "\n".join([shebang, *lines, body])


def job(*lines: str, options: tuple[str, ...] = (), body: str = "echo hi\n") -> dict[str, Any]:
    doc = parse_script(script(*BASE, *lines, body=body), options=options).body
    doc.pop("command")
    return doc


def refused(*lines: str, options: tuple[str, ...] = ()) -> JobFileError:
    with pytest.raises(JobFileError) as e:
        parse_script(script(*BASE, *lines), options=options)
    return e.value


# -- every supported directive -------------------------------------------------------------------------------------


DIRECTIVES: list[tuple[list[str], dict[str, Any]]] = [
    (["#SBATCH --job-name=train"], {"name": "train"}),
    (["#SBATCH -J train"], {"name": "train"}),
    (["#SBATCH -Jtrain"], {"name": "train"}),
    (["#SBATCH --job-name train"], {"name": "train"}),
    (["#SBATCH -A bob"], {"tenant": "bob"}),
    (["#SBATCH --account bob"], {"tenant": "bob"}),
    (["#SBATCH --nodes=4"], {"gpus": 16, "gpus_per_node": 4}),
    (["#SBATCH -N 4"], {"gpus": 16}),
    (["#SBATCH -N4"], {"gpus": 16}),
    (["#SBATCH --nodes=2-8", "#RACKSCALE --checkpointable"], {"gpus": 32, "min_gpus": 8, "checkpointable": True}),
    (["#SBATCH --nodes=3-3"], {"gpus": 12}),  # a range of one size is that size
    (["#SBATCH --gpus-per-node=2 --nodes=3"], {"gpus": 6, "gpus_per_node": 2}),
    (["#SBATCH --gres=gpu:8 -N 2"], {"gpus": 16, "gpus_per_node": 8}),
    (["#SBATCH --gres=gpu"], {"gpus": 1, "gpus_per_node": 1}),
    (["#SBATCH --gpus=8"], {"gpus": 8, "gpus_per_node": 4}),
    (["#SBATCH -G 8 -N 2"], {"gpus": 8, "gpus_per_node": 4}),
    (["#SBATCH --ntasks-per-node=1"], {"processes": "per_node"}),
    (["#SBATCH --ntasks-per-node=4"], {"processes": "per_gpu"}),
    (["#SBATCH -N 2 --ntasks=2"], {"processes": "per_node"}),
    (["#SBATCH -N 2 -n 8"], {"processes": "per_gpu"}),
    (["#SBATCH -N 16 --segment=4"], {"topology": {"segment": 4}}),
    (["#SBATCH -N 16 --segment=8,4"], {"topology": {"segment": [8, 4]}}),
    (["#SBATCH --time=90"], {"time_limit_s": 5400.0, "expected_runtime_s": 5400.0}),
    (["#SBATCH -t 1:30:00"], {"time_limit_s": 5400.0}),
    (["#SBATCH -t UNLIMITED"], {}),
    (["#SBATCH --array=0-99%8"], {"array": "0-99%8"}),
    (["#SBATCH -a 1,3,5-7"], {"array": "1,3,5-7"}),
    (["#SBATCH --dependency=afterok:abc:def,singleton"], {"dependency": "afterok:abc:def,singleton"}),
    (["#SBATCH -d afterany:abc"], {"dependency": "afterany:abc"}),
    (["#SBATCH --qos=high"], {"priority": QOS["high"]}),
    (["#SBATCH -q low"], {"priority": QOS["low"]}),
    (["#SBATCH --priority=-5"], {"priority": -5}),
    (["#SBATCH --qos=high --priority=7"], {"priority": 7}),  # the last word
    (["#SBATCH --requeue"], {"on_node_failure": "requeue"}),
    (["#SBATCH --no-requeue"], {"on_node_failure": "fail"}),
    (["#SBATCH --output=/logs/%x-%j.%t.out"], {"output": "/logs/%x-%j.%t.out"}),
    (["#SBATCH -o /logs/o -e /logs/o"], {"output": "/logs/o"}),
    (["#SBATCH -D /run --output=o.%j --error /run/o.%j"], {"output": "/run/o.%j"}),
    (["#SBATCH --output=none --error=none"], {}),
    (["#SBATCH -D /shared/run -o logs/%j.out"], {"workdir": "/shared/run", "output": "/shared/run/logs/%j.out"}),
    (["#SBATCH --chdir=/shared/run"], {"workdir": "/shared/run"}),
    (["#SBATCH --output=none"], {}),
    (["#SBATCH --output=/o --open-mode=append"], {"output": "/o"}),
    (["#SBATCH --export=ALL,OMP_NUM_THREADS=8,X=a=b"], {"env": {"OMP_NUM_THREADS": "8", "X": "a=b"}}),
    (["#SBATCH --export=ALL"], {}),
    (["#SBATCH --exclusive"], {"exclusive": True}),
    (["#RACKSCALE --nvlink=preferred"], {"topology": {"nvlink": "preferred"}}),
    (["#RACKSCALE --level rack"], {"topology": {"level": "rack"}}),
    (["#RACKSCALE --checkpointable"], {"checkpointable": True}),
    (["#RACKSCALE --min-gpus=4 --checkpointable", "#SBATCH -N 4"], {"min_gpus": 4, "gpus": 16}),
    (["#RACKSCALE --expected-runtime=20"], {"expected_runtime_s": 1200.0}),
    (["#SBATCH -t 60", "#RACKSCALE --expected-runtime=20"], {"time_limit_s": 3600.0, "expected_runtime_s": 1200.0}),
    (["#RACKSCALE --duration=0:30"], {"duration_s": 30.0}),
    (["#RACKSCALE --duration=0"], {"duration_s": 0.0}),
    (["#RACKSCALE --slurm-env"], {"slurm_env": True}),
    (["#RACKSCALE --env OPTS='a, b' --env=Y=1"], {"env": {"OPTS": "a, b", "Y": "1"}}),
]


@pytest.mark.parametrize(("lines", "expected"), DIRECTIVES)
def test_each_directive_becomes_its_field(lines: list[str], expected: dict[str, Any]) -> None:
    body = job(*lines)
    for key, value in expected.items():
        assert body[key] == value, (key, body)
    if not expected:  # nothing beyond the base
        assert set(body) == {"name", "tenant", "gpus", "gpus_per_node"}, body


def test_every_supported_option_is_exercised_above() -> None:
    text = "\n".join(line for lines, _ in DIRECTIVES for line in lines)
    for option in SUPPORTED:
        assert re.search(rf"(^|\s)--{option.long}(=|\s|$)", text, re.M), f"--{option.long} is not tested"
        if option.short:
            assert re.search(rf"(^|\s)-{option.short}", text, re.M), f"-{option.short} is not tested"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45", 2700.0),
        ("45:30", 2730.0),
        ("1:02:03", 3723.0),
        ("2-3", 2 * 86400 + 3 * 3600.0),
        ("2-3:04", 2 * 86400 + 3 * 3600 + 240.0),
        ("2-3:04:05", 2 * 86400 + 3 * 3600 + 245.0),
        ("UNLIMITED", None),
        ("infinite", None),
        ("0", None),
    ],
)
def test_every_slurm_time_format(text: str, seconds: float | None) -> None:
    assert parse_time(text) == seconds


def test_defaults_name_from_the_file_and_tenant_from_the_caller() -> None:
    text = script("#SBATCH --gpus-per-node=1")
    job_ = parse_script(text, filename="eval v2.sbatch", defaults={"tenant": "me"})
    assert (job_.body["name"], job_.body["tenant"]) == ("eval-v2.sbatch", "me")
    assert "name" not in job_.lines and "tenant" not in job_.lines
    assert parse_script(text, defaults={"tenant": "me"}).body["name"] == "script"
    with pytest.raises(JobFileError, match="no tenant: add #SBATCH --account"):
        parse_script(text)


def test_each_field_remembers_its_line() -> None:
    job_ = parse_script(script(*BASE, "#SBATCH -N 2", "", "# a comment", "#SBATCH --time=10 -o /o"))
    assert job_.lines["tenant"] == 2 and job_.lines["gpus_per_node"] == 2
    assert job_.lines["gpus"] == 3
    assert job_.lines["time_limit_s"] == 6 and job_.lines["output"] == 6
    assert job_.located("gpus: too many", "gpus") == "line 3: gpus: too many"


# -- what is refused, with its line ------------------------------------------------------------------------------------

REFUSED_LONG = [(name, why) for longs, _, why in REFUSED for name in longs]
REFUSED_SHORT = [(letter, why) for _, shorts, why in REFUSED for letter in shorts]


@pytest.mark.parametrize(("name", "why"), REFUSED_LONG, ids=[n for n, _ in REFUSED_LONG])
def test_every_refused_long_option_names_its_line_and_why(name: str, why: str) -> None:
    e = refused("#SBATCH -N 1", f"#SBATCH --{name}=x")
    assert e.line == 4 and str(e) == f"line 4: --{name}=x is not supported: {why}"


@pytest.mark.parametrize(("letter", "why"), REFUSED_SHORT, ids=[s for s, _ in REFUSED_SHORT])
def test_every_refused_short_option_names_its_line_and_why(letter: str, why: str) -> None:
    e = refused(f"#SBATCH -{letter} x")
    assert e.line == 3 and str(e).startswith(f"line 3: -{letter} is not supported: {why}")


def test_memory_is_refused_in_the_words_the_issue_asks_for() -> None:
    e = refused("#SBATCH -N 2", "#SBATCH --time=10", "#SBATCH --ntasks-per-node=1", "#SBATCH -J x", "#SBATCH --mem=64G")
    assert str(e).startswith("line 7: --mem=64G is not supported: Rackscale schedules whole GPUs")


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("#SBATCH --nodez=2", "line 3: --nodez=2 is not an option Rackscale reads (did you mean --nodes?)"),
        ("#SBATCH --job=x", "line 3: --job=x is not an option Rackscale reads"),  # no abbreviations
        ("#SBATCH -Z", "line 3: -Z is not an option Rackscale reads"),
        ("#SBATCH nodes=2", "line 3: 'nodes=2' is not an option"),
        ("#SBATCH hetjob", "line 3: hetjob: heterogeneous jobs are not supported"),
        ("#SBATCH --job-name='x", "line 3: unmatched '"),
        ("#SBATCH --time", "line 3: --time needs a value"),
        ("#SBATCH -t", "line 3: -t needs a value"),
        ("#SBATCH --requeue=yes", "line 3: --requeue=yes: --requeue takes no value"),
        ("#SBATCH --nvlink=none", "line 3: --nvlink=none: --nvlink is read on a #RACKSCALE line"),
        ("#RACKSCALE --nodes=2", "line 3: --nodes=2: --nodes is read on an #SBATCH line"),
        ("#SLURM --nodes=2", "line 3: #SLURM is sbatch's old spelling"),
        ("#SBATCH --nodes=x", "line 3: --nodes=x: 'x' is not a node count"),
        ("#SBATCH --nodes=4-2", "line 3: --nodes=4-2: '4-2' runs backwards"),
        ("#SBATCH --nodes=2-4", "line 3: --nodes=2-4 is a node range: Rackscale runs it elastic"),
        ("#SBATCH --gpus-per-node=h100:4", "line 3: --gpus-per-node=h100:4: --gpus-per-node=h100:4 names a GPU type"),
        ("#SBATCH --gres=gpu:h100:4", "line 3: --gres=gpu:h100:4: gpu:h100:4 names a GPU type (h100)"),
        ("#SBATCH --gres=nvme:1", "line 3: --gres=nvme:1: 'nvme:1' is not a GPU"),
        ("#SBATCH --ntasks-per-node=3", "line 3: --ntasks-per-node=3: Rackscale starts one process per node (1)"),
        ("#SBATCH -N 2 -n 3", "line 3: -n 3: Rackscale starts one process per node (2 nodes) or one per GPU (8)"),
        ("#SBATCH -N 2 --gpus=6", "line 3: --gpus=6 is not -N 2 × --gpus-per-node=4 (8 GPUs)"),
        ("#SBATCH --time=soon", "line 3: --time=soon: 'soon' is not a time (M, M:S, H:M:S"),
        ("#SBATCH --array=9-1", "line 3: --array=9-1: '9-1' '9-1' runs backwards"),
        ("#SBATCH --dependency=after:1", "line 3: --dependency=after:1: 'after' is not a dependency kind"),
        ("#SBATCH --qos=gold", "line 3: --qos=gold: 'gold' is not a QOS Rackscale knows: low (-100), normal (0)"),
        ("#SBATCH --priority=TOP", "line 3: --priority=TOP: Slurm's TOP has no match"),
        ("#SBATCH --priority=5000", "line 3: --priority=5000: 5000 is outside Rackscale's priorities"),
        ("#SBATCH --output=out.txt", "line 3: --output=out.txt: a relative path needs --chdir"),
        ("#SBATCH --output=/o/%u.out", "line 3: --output=/o/%u.out: %u is not a code Rackscale expands"),
        ("#SBATCH --error=/e", "line 3: --error=/e: give --output"),
        ("#SBATCH -o /o -e /e", "line 3: -e /e is not the --output file"),
        ("#SBATCH --open-mode=truncate", "line 3: --open-mode=truncate: --open-mode=truncate has no match"),
        ("#SBATCH --chdir=run", "line 3: --chdir=run: 'run' is not an absolute directory"),
        ("#SBATCH --export=NONE", "line 3: --export=NONE: NONE can't be honoured"),
        ("#SBATCH --export=HOME", "line 3: --export=HOME: 'HOME' names a variable of your shell"),
        ("#SBATCH --exclusive=user", "line 3: --exclusive=user: --exclusive=user has no match"),
        ("#RACKSCALE --nvlink=always", "line 3: --nvlink=always: 'always' is not required, preferred or none"),
        ("#RACKSCALE --env NOEQUALS", "line 3: --env NOEQUALS: 'NOEQUALS' is not NAME=VALUE"),
        ("#RACKSCALE --duration=UNLIMITED", "line 3: --duration=UNLIMITED: 'UNLIMITED' is not a duration"),
    ],
)
def test_each_refusal_names_its_line(line: str, words: str) -> None:
    e = refused(line)
    assert e.line == 3
    assert str(e).startswith(words), str(e)


def test_a_node_range_with_min_gpus_says_which_came_later() -> None:
    e = refused("#RACKSCALE --checkpointable --min-gpus=4", "#SBATCH --nodes=1-4")
    assert str(e).startswith("line 4: --nodes=1-4: give one of --nodes=MIN-MAX and --min-gpus")


def test_a_job_without_gpus_is_refused_as_a_whole() -> None:
    with pytest.raises(JobFileError) as e:
        parse_script(script("#SBATCH -A alice -N 2"))
    assert e.value.line == 2 and "say how many GPUs each node" in str(e.value)
    with pytest.raises(JobFileError) as e:
        parse_script(script("#SBATCH -A alice"))
    assert e.value.line is None and str(e.value).startswith("the job asks for no GPUs")


# -- how the script is read --------------------------------------------------------------------------------------------


def test_reading_stops_at_the_first_command_as_sbatch_does() -> None:
    body = job("", "# a comment", "   ", "##SBATCH --mem=1G", "#SBATCH -J early", body="echo\n#SBATCH --mem=1G\n")
    assert body["name"] == "early"  # the ##SBATCH line is a comment, the one after the command is never read


def test_words_split_as_sbatch_splits_them() -> None:
    body = job('#SBATCH --job-name="a b"# trailing comment', "#SBATCH --export=X='1 2',Y=\\#3  # comment")
    assert body["name"] == "a b"
    assert body["env"] == {"X": "1 2", "Y": "#3"}


def test_directives_must_start_their_line() -> None:
    body = job("  #SBATCH --mem=1G")  # indented: a comment for sbatch, not a directive
    assert "mem" not in str(body)


def test_dos_line_breaks_nul_bytes_and_size_are_refused() -> None:
    with pytest.raises(JobFileError, match=r"line 1: the script has DOS line breaks"):
        parse_script("#!/bin/bash\r\n#SBATCH -A a --gpus-per-node=1\r\n")
    with pytest.raises(JobFileError, match="line 3: a NUL byte"):
        parse_script(script(*BASE, "# \0"))
    big = script(*BASE, body="#" * SCRIPT_MAX_BYTES)
    with pytest.raises(JobFileError, match=f"bytes, at most {SCRIPT_MAX_BYTES}"):
        parse_script(big)


# -- the command line over the file ----------------------------------------------------------------------------------


def test_command_line_options_override_the_files() -> None:
    body = job("#SBATCH -N 2 -t 10 --qos=low", "#RACKSCALE --nvlink=required", options=("-N", "4", "--time=20",
               "--nvlink=preferred", "--priority", "-3"))  # fmt: skip
    assert body["gpus"] == 16 and body["time_limit_s"] == 1200.0 and body["priority"] == -3
    assert body["topology"] == {"nvlink": "preferred"}


def test_command_line_errors_say_so() -> None:
    e = refused(options=("--mem", "1G"))
    assert e.line == COMMAND_LINE and str(e).startswith("command line: --mem is not supported")
    job_ = parse_script(script(*BASE), options=("-t", "1"))
    assert job_.lines["time_limit_s"] == COMMAND_LINE
    assert job_.located("time_limit_s: bad", "time_limit_s") == "command line: time_limit_s: bad"


@pytest.mark.parametrize(
    ("words", "split"),
    [
        (["s.sh"], ([], "s.sh", [])),
        (["-N", "2", "s.sh", "-t", "5"], (["-N", "2", "-t", "5"], "s.sh", [])),
        (["--nodes=2", "s.sh", "--", "a", "-b"], (["--nodes=2"], "s.sh", ["a", "-b"])),
        (["--exclusive", "s.sh"], (["--exclusive"], "s.sh", [])),  # takes no separate value
        (["-N2", "s.sh"], (["-N2"], "s.sh", [])),
        ([], ([], None, [])),
    ],
)
def test_command_line_words_find_the_script(words: list[str], split: tuple[Any, ...]) -> None:
    assert command_line_words(words) == split


def test_a_second_script_word_points_at_double_dash() -> None:
    with pytest.raises(JobFileError, match="arguments for it go after --"):
        command_line_words(["s.sh", "arg"])


# -- the script as the command ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shebang", "shell"),
    [
        ("#!/bin/bash", ["/bin/bash"]),
        ("#!/bin/sh", ["/bin/sh"]),
        ("#!/bin/bash -l", ["/bin/bash", "-l"]),
        ("#!/usr/bin/env bash", ["/usr/bin/env", "bash"]),
        ("#!/usr/bin/env -S zsh -l", ["/usr/bin/env", "zsh", "-l"]),
        ("#SBATCH -J nob", ["bash"]),  # no #! line: bash
    ],
)
def test_the_script_runs_in_its_shell(shebang: str, shell: list[str]) -> None:
    text = script(*BASE, shebang=shebang)
    command = parse_script(text, filename="/home/me/run.sh", args=("x", "y")).body["command"]
    assert command == [*shell, "-c", text, "run.sh", "x", "y"]


@pytest.mark.parametrize("shebang", ["#!/usr/bin/env python3", "#!/usr/bin/perl", "#!"])
def test_a_script_for_another_interpreter_is_refused_on_line_1(shebang: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_script(script(*BASE, shebang=shebang))
    assert e.value.line == 1


# -- the body is decoded as a JSON submit is -------------------------------------------------------------------------


def test_a_body_the_gateway_refuses_is_named_with_its_line() -> None:
    job_ = parse_script(script(*BASE, "#SBATCH -J 'bad name'"))
    decoded = decode_job(msgspec.json.encode(job_.body))
    assert isinstance(decoded, ApiError) and decoded.field == "name"
    assert job_.located(decoded.error, decoded.field).startswith("line 3: name: Expected `str` matching")
    job_ = parse_script(script(*BASE, "#SBATCH --export=RANK=3"))
    checked = check_job(decode_job(msgspec.json.encode(job_.body)), "id", None)  # type: ignore[arg-type]
    assert isinstance(checked, ApiError) and checked.field == "env.RANK"
    assert job_.located(checked.error, checked.field).startswith("line 3: env.RANK: set by the scheduler")
