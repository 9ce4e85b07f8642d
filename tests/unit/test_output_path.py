"""The body's `output` pattern (shared/output_path.py): checked at submit, expanded per process by the agent."""

from __future__ import annotations

import pytest

from services.gateway.validation import ApiError, check_launch
from shared.output_path import OutputPatternError, check_output_pattern, expand_output
from shared.schemas import JobBody


@pytest.mark.parametrize(
    ("pattern", "job_id", "rank", "expanded"),
    [
        ("/o/%x-%j.%t.out", "abc", 3, "/o/train-abc.3.out"),
        ("/o/%N/%%j", "abc", 0, "/o/d00-n01/%j"),
        ("/o/%A_%a.out", "abc_7", 0, "/o/abc_7.out"),
        ("/o/%A_%a.out", "abc", 0, "/o/abc_0.out"),  # not an array task: its id, index 0
        ("/o/%j.out", "abc_7", 0, "/o/abc_7.out"),  # a task's own id
        ("/o/%3a-%4t-%5j", "abc_7", 12, "/o/007-0012-abc_7"),  # a width pads numbers only (as Slurm)
        ("/o/plain", "abc", 0, "/o/plain"),
    ],
)
def test_a_pattern_expands_per_process(pattern: str, job_id: str, rank: int, expanded: str) -> None:
    check_output_pattern(pattern)
    assert expand_output(pattern, job_id=job_id, name="train", rank=rank, node="d00-n01") == expanded


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("out.txt", "an absolute path pattern"),
        ("/o/%u.out", "%u is not a code Rackscale expands"),
        ("/o/%5s", "%5s is not a code"),
        ("/o/100%", "a lone % at the end is not a code"),
        ("/o/\0", "NUL"),
    ],
)
def test_a_bad_pattern_says_what_is_wrong(pattern: str, words: str) -> None:
    with pytest.raises(OutputPatternError, match=words):
        check_output_pattern(pattern)
    bad = check_launch(JobBody(name="x", tenant="a", gpus=1, output=pattern))
    assert isinstance(bad, ApiError) and bad.field == "output" and words in bad.error
