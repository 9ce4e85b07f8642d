"""The headless browser for the dashboard test: Debian's chromium, installed with apt-get when missing.

Standard library only: scripts/dev.py calls `ensure_chromium()` before the test run (with the system
Python, before the virtualenv exists), and the test calls it again, so a run outside dev.py installs too.
Playwright drives the binary through `executable_path`; it never downloads a browser of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess

CANDIDATES = ("chromium", "chromium-browser")
INSTALL_TIMEOUT_S = 600


def find_chromium() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _apt_install() -> str | None:
    """Why apt-get could not install chromium, or None when it did."""
    apt = shutil.which("apt-get")
    if apt is None:
        return "no apt-get on this machine"
    if os.geteuid() != 0:
        return "not root, so apt-get can't install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-qq", "--no-install-recommends", "chromium"]
    # A fresh machine may have no package lists yet: update once only when the plain install fails.
    for step in (install, [apt, "update", "-qq"], install):
        try:
            done = subprocess.run(step, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{' '.join(step[:2])} took over {INSTALL_TIMEOUT_S} s"
        if done.returncode == 0 and step is install and find_chromium():
            return None
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
    return f"apt-get install chromium failed: {last[0]}"


def ensure_chromium(log: bool = False) -> tuple[str | None, str]:
    """(path of a chromium binary or None, what happened), installing it with apt-get when missing."""
    path = find_chromium()
    if path:
        return path, f"chromium at {path}"
    if log:
        print("the dashboard test needs chromium; installing Debian's (apt-get install chromium) ...", flush=True)
    why = _apt_install()
    path = find_chromium()
    if path:
        return path, f"installed chromium at {path}"
    return None, f"no chromium: {why}"
