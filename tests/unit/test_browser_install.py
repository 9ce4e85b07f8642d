"""tests/browser.py: how the dashboard test (and scripts/dev.py test) finds or installs Debian's chromium."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests import browser


class FakeApt:
    """apt-get as seen through subprocess.run: each call answers the next exit code; a zero from install puts
    chromium on the PATH."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, codes: list[int]) -> None:
        self.codes = codes
        self.calls: list[list[str]] = []
        self.installed = False
        monkeypatch.setattr(browser.shutil, "which", self.which)
        monkeypatch.setattr(browser.subprocess, "run", self.run)
        monkeypatch.setattr(browser.os, "geteuid", lambda: 0)

    def which(self, name: str) -> str | None:
        if name == "apt-get":
            return "/usr/bin/apt-get"
        return "/usr/bin/chromium" if self.installed and name == "chromium" else None

    def run(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv[1:3])
        code = self.codes.pop(0)
        if code == 0 and argv[1] == "install":
            self.installed = True
        return subprocess.CompletedProcess(argv, code, "", "E: Unable to locate package chromium" if code else "")


def test_a_present_browser_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    apt = FakeApt(monkeypatch, [])
    apt.installed = True
    assert browser.ensure_chromium() == ("/usr/bin/chromium", "chromium at /usr/bin/chromium")
    assert apt.calls == []


def test_a_missing_browser_is_installed_after_updating_the_package_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    apt = FakeApt(monkeypatch, [100, 0, 0])
    path, what = browser.ensure_chromium()
    assert path == "/usr/bin/chromium" and what.startswith("installed")
    assert apt.calls == [["install", "-y"], ["update", "-qq"], ["install", "-y"]]


def test_when_apt_fails_the_reason_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeApt(monkeypatch, [100, 0, 100])
    path, what = browser.ensure_chromium()
    assert path is None and "Unable to locate package chromium" in what


def test_not_root_means_no_install(monkeypatch: pytest.MonkeyPatch) -> None:
    apt = FakeApt(monkeypatch, [])
    monkeypatch.setattr(browser.os, "geteuid", lambda: 1000)
    assert browser.ensure_chromium() == (None, "no chromium: not root, so apt-get can't install it")
    assert apt.calls == []
