"""A job body written in YAML (`rackscale submit -f job.yaml`, `Content-Type: application/yaml`).

The file is the body, field for field as the JSON one (docs/jobs.md; editors validate it with docs/job.schema.json).
It is read strictly, so a value never changes type behind the writer's back: only `true`/`false` are booleans (`yes`,
`no`, `on`, `off` stay text, as in YAML 1.2), a number is plain decimal (`010` and `1:30` stay text, where YAML 1.1
reads eight and ninety; `1_000` too), a float has its point (`1.5`, `1.0e+3`: `1e3` is text), a date stays text.
What PyYAML's safe_dump writes reads back the same (a test checks). A key given twice, an anchor or alias, more
than one document, or anything but a mapping at the top is an error naming its line.
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from shared.jobfile.errors import JobFileError
from shared.jobfile.jobfile import JobFile

BOOL = "tag:yaml.org,2002:bool"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
STR = "tag:yaml.org,2002:str"
TIMESTAMP = "tag:yaml.org,2002:timestamp"
MERGE = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core schema scalars."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (BOOL, INT, FLOAT, TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    FLOAT,
    re.compile(r"^[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+][0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> JobFile:
    """The body a YAML job file gives, with each field's line. Raises JobFileError naming the line."""
    loader = _Loader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as e:
            mark = e.problem_mark or e.context_mark
            problem = ", ".join(p for p in (e.context, e.problem) if p) or "not YAML"
            raise JobFileError(f"not valid YAML: {problem}", mark.line + 1 if mark else None) from None
        except yaml.YAMLError as e:
            raise JobFileError(f"not valid YAML: {e}") from None
        if node is None:
            raise JobFileError("the file is empty: it must be a mapping of job fields (name: ..., gpus: ...)")
        if not isinstance(node, MappingNode):
            raise JobFileError("the file must be a mapping of job fields (name: ..., gpus: ...)", _line(node))
        lines: dict[str, int] = {}
        _walk(node, "", lines, set())
        body = loader.construct_document(node)
    finally:
        loader.dispose()
    return JobFile(body=body, lines=lines)


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _walk(node: Node, path: str, lines: dict[str, int], seen: set[int]) -> None:
    """Each field's line into `lines`; raises JobFileError on what the file may not hold."""
    if id(node) in seen or getattr(node, "anchor", None):
        raise JobFileError("YAML anchors and aliases are not read in a job file: write the value out", _line(node))
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first: dict[str, int] = {}  # this mapping's keys → their lines
        for key, value in node.value:
            if key.tag == MERGE:
                raise JobFileError("YAML merge keys (<<) are not read in a job file: write the fields out", _line(key))
            if not isinstance(key, ScalarNode) or key.tag != STR:
                raise JobFileError("a key must be a field name (text)", _line(key))
            name = str(key.value)
            child = f"{path}.{name}" if path else name
            if name in first:
                raise JobFileError(f"{child} is given twice (first on line {first[name]})", _line(key), child)
            first[name] = lines[child] = _line(key)
            _walk(value, child, lines, seen)
    elif isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            lines[f"{path}[{i}]"] = _line(item)
            _walk(item, f"{path}[{i}]", lines, seen)


def load_yaml_text(data: bytes) -> str:
    """A YAML file's bytes as text (UTF-8, a BOM allowed). Raises JobFileError when they aren't."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise JobFileError(f"not UTF-8 text (byte {e.start})") from None
