#!/usr/bin/env python3
"""The README's two commands, for a fresh machine with only Python 3.11+.

    python3 scripts/dev.py up     # start Rackscale locally
    python3 scripts/dev.py test   # lint, format check and the whole test suite

Both create `.venv` and install the project (with its dev extras) on first use, and reinstall when
`pyproject.toml` changes. Standard library only: this runs before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".rackscale-install-stamp"


def _venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_env() -> Path:
    """Create the virtualenv and install the project unless pyproject.toml is unchanged since."""
    if sys.version_info < (3, 11):  # noqa: UP036 - runs under whatever python3 the newcomer has
        sys.exit(f"Rackscale needs Python 3.11+, this is {sys.version.split()[0]}")
    py = _venv_python()
    if not py.exists():
        print(f"creating virtualenv in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not STAMP.exists() or STAMP.read_text() != digest:
        print("installing rackscale and its dev dependencies", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"], check=True)
        STAMP.write_text(digest)
    return py


def ensure_browser() -> None:
    """Debian's chromium for the dashboard's browser test (apt-get when missing, as root); else the test skips."""
    sys.path.insert(0, str(ROOT))
    from tests.browser import ensure_chromium  # standard library only, like this script

    path, what = ensure_chromium(log=True)
    if path is None:
        print(f"{what}; the dashboard's browser test will be skipped", flush=True)


def run(cmd: list[str]) -> int:
    """Run `cmd` to its end. A terminal's Ctrl-C reaches the child too (it signals the whole process group),
    so the child is left to stop in its own time (pytest tears its servers down) rather than killed, as
    subprocess.run would 0.25 s in; then this exits 130, running nothing after it."""
    interrupted = False
    with subprocess.Popen(cmd, cwd=ROOT) as proc:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:
                interrupted = True
    if interrupted:
        raise SystemExit(130)
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("up", "test"):
        print(__doc__)
        return 2
    py = ensure_env()
    cmd, rest = argv[0], argv[1:]
    if cmd == "test":
        ensure_browser()
        paths = ["shared", "services", "tests", "bench", "scripts", "clients"]
        lint = run([str(py), "-m", "ruff", "check", *paths])
        form = run([str(py), "-m", "ruff", "format", "--check", "--quiet", *paths])
        tests = run([str(py), "-m", "pytest", *rest])
        return lint or form or tests
    up = [str(py), "-m", "services.cli", "up", *rest]
    if os.name == "nt":
        return run(up)
    # Become the service runner rather than wait on it: Ctrl-C then reaches only the process that handles
    # it, and nothing here kills it (subprocess.run would SIGKILL it 0.25 s into its shutdown, leaving the
    # embedded NATS server running, and print a KeyboardInterrupt traceback).
    os.chdir(ROOT)
    os.execv(up[0], up)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
