"""The Slurm-syntax values a job body may carry: `array` (shared/core/arrays.py) and `dependency`
(shared/core/dependencies.py), and the gateway's 422 naming the field when one doesn't parse."""

from __future__ import annotations

import msgspec
import pytest

from services.gateway.validation import check_launch
from shared.core.arrays import ARRAY_TASKS_MAX, ArraySyntaxError, parse_array, split_task_id, task_id
from shared.core.dependencies import Condition, DependencySyntaxError, format_dependency, parse_dependency
from shared.schemas import JobBody


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-99%8", tuple(range(100)), 8),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-15:4", (0, 4, 8, 12), None),
        ("7", (7,), None),
        ("3,1,2-3", (1, 2, 3), None),  # sorted, repeats once
        (" 0-1%1 ", (0, 1), 1),
    ],
)
def test_array_syntax(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    spec = parse_array(text)
    assert (spec.indices, spec.limit) == (indices, limit)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a", "'a' is not an index or range"),
        ("5-1", "runs backwards"),
        ("0-10:0", "step below 1"),
        (f"0-{ARRAY_TASKS_MAX}", f"more than {ARRAY_TASKS_MAX} tasks"),
        ("0-9%0", "not a task limit"),
        ("0-9%x", "not a task limit"),
        ("%4", "names no index"),
        ("0-2000000", "largest index"),
    ],
)
def test_array_refusals_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(ArraySyntaxError, match=words):
        parse_array(text)


def test_task_ids_round_trip() -> None:
    assert split_task_id(task_id("c1-abc", 42)) == ("c1-abc", 42)
    assert split_task_id("abc") is None and split_task_id("abc_") is None and split_task_id("_3") is None


def test_dependency_syntax() -> None:
    conds = parse_dependency("afterok:a:b,afterany:c,afternotok:d,singleton")
    assert conds == (
        Condition("afterok", ("a", "b")),
        Condition("afterany", ("c",)),
        Condition("afternotok", ("d",)),
        Condition("singleton"),
    )
    assert format_dependency(conds) == "afterok:a:b,afterany:c,afternotok:d,singleton"
    assert parse_dependency("") == ()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("after:a", "'after' is not a dependency kind"),
        ("aftercorr:a", "'aftercorr' is not a dependency kind"),
        ("afterok", "names no job"),
        ("singleton:a", "takes no job ids"),
        ("afterok:a?afterany:b", "'\\?' .* not supported"),
        ("afterok:a b", "'a b' is not a job id"),
        ("afterok:" + ":".join(f"j{i}" for i in range(65)), "more than 64 jobs"),
    ],
)
def test_dependency_refusals_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(DependencySyntaxError, match=words):
        parse_dependency(text)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"array": "0-x"}, "array", "'x' is not an index|'0-x' is not an index"),
        ({"dependency": "afterok"}, "dependency", "names no job"),
        ({"output": "relative/out.txt"}, "output", "absolute path"),
    ],
)
def test_gateway_names_the_bad_field(fields: dict[str, str], field: str, words: str) -> None:
    body = msgspec.convert({"name": "j", "tenant": "t", "gpus": 1, **fields}, JobBody)
    err = check_launch(body)
    assert err is not None and err.field == field and err.status == 422
    assert any(w in err.error for w in words.split("|")), err.error
