"""YAML job files (shared/jobfile/yaml_job.py): the body as YAML, read strictly, each field's line remembered so
what the gateway's validation says names it; command-line flags over the file's fields."""

from __future__ import annotations

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.validation import ApiError, check_job, decode_job
from shared.jobfile import COMMAND_LINE, JobFileError, parse_yaml

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)

JOB = """\
name: train
tenant: alice
gpus: 16
topology:
  nvlink: preferred
  segment: [4, 2]
env:
  OMP_NUM_THREADS: "8"
command: [python, train.py, --lr, "0.1"]
"""


def test_a_yaml_body_is_the_json_body() -> None:
    job = parse_yaml(JOB)
    assert job.body == {
        "name": "train",
        "tenant": "alice",
        "gpus": 16,
        "topology": {"nvlink": "preferred", "segment": [4, 2]},
        "env": {"OMP_NUM_THREADS": "8"},
        "command": ["python", "train.py", "--lr", "0.1"],
    }
    body = decode_job(msgspec.json.encode(job.body))
    assert not isinstance(body, ApiError), body
    assert body.topology.segment == [4, 2]


def test_each_field_remembers_its_line() -> None:
    job = parse_yaml(JOB)
    assert job.lines["gpus"] == 3 and job.lines["topology.segment"] == 6 and job.lines["env.OMP_NUM_THREADS"] == 8
    assert job.line_of("topology.segment[1]") == 6  # an item of a flow list: its list's line
    assert job.line_of("topology.nope") == 4  # the nearest parent
    assert job.line_of("nope") is None and job.line_of(None) is None


@pytest.mark.parametrize(
    ("yaml", "field", "line", "words"),
    [
        ("name: x\ntenant: a\ngpus: 0\n", "gpus", 3, "gpus: Expected `int` >= 1"),
        ("name: x\ntenant: a\ngpus: 1\ntopology:\n  segment: 0\n", "topology.segment", 5, "topology.segment:"),
        ("name: x\ntenant: a\ngpus: 1\ncommand:\n  - a\n  - 3\n", "command[1]", 6, "command[1]: Expected `str`"),
        ("name: x\ntenant: a\ngpus: 1\ngpu: 2\n", "gpu", 4, "unknown field `gpu`"),
        # msgspec names a map's value `env[...]`: its line is the map's
        ("name: x\ntenant: a\ngpus: 1\nenv:\n  A: 10\n", "env[...]", 4, "Expected `str`, got `int`"),
    ],
)
def test_a_field_the_decoder_refuses_is_named_with_its_line(yaml: str, field: str, line: int, words: str) -> None:
    job = parse_yaml(yaml)
    decoded = decode_job(msgspec.json.encode(job.body))
    assert isinstance(decoded, ApiError) and decoded.status == 422 and decoded.field == field
    assert job.line_of(decoded.field) == line
    assert words in job.located(decoded.error, decoded.field)
    assert job.located(decoded.error, decoded.field).startswith(f"line {line}: ")


def test_a_rule_past_the_decoder_is_named_with_its_line_too() -> None:
    job = parse_yaml("name: x\ntenant: a\ngpus: 1\nworkdir: relative\n")
    checked = check_job(decode_job(msgspec.json.encode(job.body)), "id", None)  # type: ignore[arg-type]
    assert isinstance(checked, ApiError) and checked.field == "workdir"
    assert job.located(checked.error, checked.field) == "line 4: workdir: an absolute path (or empty: the agent's own)"


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("yes", "yes"),  # YAML 1.1 would make these booleans
        ("off", "off"),
        ("010", "010"),  # ... this octal 8
        ("08", "08"),
        ("1:30", "1:30"),  # ... this sexagesimal 90
        ("1_000", "1_000"),
        ("2024-01-01", "2024-01-01"),  # ... this a date
        ("1e3", "1e3"),  # a float has its point, its exponent a sign: what PyYAML writes reads back alike
        ("1.0e3", "1.0e3"),
        ("1.5e+3", 1500.0),
        ("-0.5", -0.5),
        ("10", 10),
        ("-3", -3),
        ("0", 0),
        ("true", True),
        ("~", None),
    ],
)
def test_scalars_are_read_as_yaml_1_2_core_reads_them(text: str, value: object) -> None:
    assert parse_yaml(f"v: {text}\n").body["v"] == value


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("name: a\nname: b\n", 2, "name is given twice (first on line 1)"),
        ("env:\n  A: 1\n  A: 2\n", 3, "env.A is given twice"),
        ("a: &x 1\nb: *x\n", 1, "YAML anchors and aliases are not read"),
        ("a:\n  <<: {b: 1}\n", 2, "YAML merge keys (<<) are not read"),
        ("a: [1\n", 2, "not valid YAML: while parsing a flow sequence, expected ',' or ']'"),
        ("a: 1\n---\nb: 2\n", 2, "not valid YAML: expected a single document in the stream, but found another"),
        ("- a\n- b\n", 1, "the file must be a mapping of job fields"),
        ("1: x\n", 1, "a key must be a field name"),
        ("", None, "the file is empty"),
    ],
)
def test_what_a_job_file_may_not_hold_names_its_line(text: str, line: int | None, words: str) -> None:
    with pytest.raises(JobFileError) as e:
        parse_yaml(text)
    assert e.value.line == line and words in str(e.value)
    if line is not None:
        assert str(e.value).startswith(f"line {line}: ")


def test_flags_override_the_files_fields() -> None:
    job = parse_yaml(JOB).with_overrides({"gpus": 32, "topology": {"nvlink": "none"}, "env": {"B": "2"}})
    assert job.body["gpus"] == 32
    assert job.body["topology"] == {"nvlink": "none", "segment": [4, 2]}  # objects merge
    assert job.body["env"] == {"OMP_NUM_THREADS": "8", "B": "2"}
    assert job.lines["gpus"] == COMMAND_LINE and job.lines["topology.nvlink"] == COMMAND_LINE
    assert job.lines["topology.segment"] == 6 and job.lines["env.OMP_NUM_THREADS"] == 8
    job = job.with_overrides({"command": ["true"]})
    assert job.body["command"] == ["true"] and job.line_of("command[2]") == COMMAND_LINE  # lists are replaced


@given(st.dictionaries(st.text(), JSONISH, max_size=6))
def test_what_pyyaml_writes_reads_back_the_same(body: dict[str, object]) -> None:
    """A client that writes its body with PyYAML's safe_dump (as schemathesis does) sends what it meant."""
    text = yaml.safe_dump(body)
    if not body:
        return  # `{}`: the reader wants fields
    assert parse_yaml(text).body == body
