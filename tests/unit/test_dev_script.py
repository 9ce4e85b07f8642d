"""scripts/dev.py's `run`: a terminal's Ctrl-C lets the child finish its own shutdown, then exits 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 60.0  # bound on waiting; never an assertion

CHILD = """
import signal, sys, time
from pathlib import Path

def stop(*_):
    time.sleep(0.5)  # longer than the 0.25 s subprocess.run grants before it kills
    Path(sys.argv[1]).write_text("clean")
    sys.exit(0)

signal.signal(signal.SIGINT, stop)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(os.name != "posix", reason="process groups and killpg are POSIX")
def test_ctrl_c_lets_the_child_stop_in_its_own_time_and_exits_130(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(CHILD))
    marker = tmp_path / "stopped"
    runner = (
        f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import dev; "
        f"dev.run([sys.executable, {str(child)!r}, {str(marker)!r}]); print('ran on after the interrupt')"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", runner],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert "ran on after the interrupt" not in out
    assert marker.read_text() == "clean"
