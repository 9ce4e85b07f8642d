"""The Python client installs alone: built into a wheel and installed into a fresh virtualenv, offline, it gives
`import rackscale` with none of the server's code or dependencies there (a notebook's environment stays clean)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
# The server's packages and its dependencies: none may come along with the client.
SERVER_SIDE = [
    "services",
    "shared",
    "nats",
    "redis",
    "aiohttp",
    "opentelemetry",
    "msgspec",
    "yaml",
    "prometheus_client",
]
RUN_S = 300  # bound on each step (pip on a loaded machine); never an assertion

CHECK = """
import importlib.util, json, sys
import rackscale
from rackscale import AsyncClient, Client, JobBody
present = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is not None]
client = Client("http://127.0.0.1:9")
print(json.dumps({"file": rackscale.__file__, "present": present, "version": rackscale.__version__,
                  "url": client.url, "body": JobBody(name="a", tenant="b", gpus=1).gpus}))
"""


def run(*cmd: str | Path, cwd: Path) -> str:
    # no PYTHONPATH (the tests run with the repository on it) and no pip configuration that points at an index
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PIP_")}
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_S, check=False
    )
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_client_alone_installs_offline_into_a_fresh_virtualenv(tmp_path: Path) -> None:
    # the wheel, built by the client's own backend (no setuptools, nothing fetched)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index", "-w", tmp_path / "dist", CLIENT, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("rackscale_client-*.whl")
    # a fresh virtualenv (without pip of its own: this interpreter's pip installs into it)
    fresh = tmp_path / "fresh"
    venv.EnvBuilder(with_pip=False).create(fresh)
    python = fresh / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", wheel, cwd=tmp_path)
    # -I: no PYTHONPATH, no user site, not the working directory: what the venv holds alone
    seen = json.loads(run(python, "-I", "-c", CHECK, *SERVER_SIDE, cwd=tmp_path))
    assert Path(seen["file"]).is_relative_to(fresh), seen
    assert seen["present"] == [], f"the server's side came along: {seen['present']}"
    assert (seen["url"], seen["body"]) == ("http://127.0.0.1:9", 1)
    listed = run(sys.executable, "-m", "pip", "--python", python, "list", "--format=freeze", cwd=tmp_path)
    assert sorted(line.split("==")[0] for line in listed.split()) == ["rackscale-client"]
