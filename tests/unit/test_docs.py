"""The docs match the code: the configuration table lists every setting (docs/operations.md), the README names
every policy, and the README's and docs' relative links point at files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shared import launch
from shared.core.policies import POLICIES
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_operations_doc_lists_every_setting_with_its_default() -> None:
    for row in Settings.describe():
        default = "(unset)" if row.default is None else f"`{row.default}`"
        assert f"| `{row.env}` | {default} |" in OPERATIONS, f"docs/operations.md's configuration table lacks {row.env}"


@pytest.mark.parametrize("text", [README, OPERATIONS], ids=["README.md", "operations.md"])
def test_readme_and_operations_doc_list_no_setting_the_code_lacks(text: str) -> None:
    # the launch contract's table names what a job's processes are told, not settings
    known = {row.env for row in Settings.describe()} | {v.name for v in launch.CONTRACT}
    documented = {
        cell.strip("` ")
        for line in text.splitlines()
        if line.startswith("| `RACKSCALE_")
        for cell in line.split("|")[1:2]
    }
    assert documented <= known, f"the docs document unknown variables: {documented - known}"


def test_readme_describes_every_policy() -> None:
    for name in POLICIES:
        assert f"**`{name}`**" in README, f"README doesn't describe policy {name}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_readme_and_docs_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in LINK.findall(doc.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"
