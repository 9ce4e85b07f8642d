"""The README's configuration table and policy list match the code."""

from __future__ import annotations

from pathlib import Path

from shared.core.policies import POLICIES
from shared.settings import Settings

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_lists_every_setting_with_its_default() -> None:
    for row in Settings.describe():
        default = "(unset)" if row.default is None else f"`{row.default}`"
        assert f"| `{row.env}` | {default} |" in README, f"README's configuration table lacks {row.env}"


def test_readme_lists_no_setting_the_code_lacks() -> None:
    known = {row.env for row in Settings.describe()}
    documented = {
        cell.strip("` ")
        for line in README.splitlines()
        if line.startswith("| `RACKSCALE_")
        for cell in line.split("|")[1:2]
    }
    assert documented <= known, f"README documents unknown variables: {documented - known}"


def test_readme_describes_every_policy() -> None:
    for name in POLICIES:
        assert f"**`{name}`**" in README, f"README doesn't describe policy {name}"
