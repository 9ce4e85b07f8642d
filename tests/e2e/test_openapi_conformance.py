"""Schemathesis against the running system: every operation of /openapi.json fuzzed on the embedded stack, and
on a router (services/router) over two such cells, against the router's own document.

The whole stack (`services.stack.Stack`, simulated agents) runs with bearer tokens, as a deployment does; the
fuzz (`st run`, a child process) reads the document the gateway serves and checks every answer against it:
no 5xx, status codes and bodies as documented (the event streams event by event), auth enforced, bad input
refused. Bounded: MAX_EXAMPLES per operation and phase, a fixed seed (RACKSCALE_FUZZ_SEED for another), and
every stream read for REQUEST_TIMEOUT_S at most. Jobs it submits never run what it made up (schemathesis_hooks.py);
what it may answer beyond the document is in schemathesis.toml, each with its reason.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest

from services.router.routing import Cells
from services.router.service import Router, RouterServer
from tests.e2e.conftest import StackFactory

pytestmark = pytest.mark.asyncio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MAX_EXAMPLES = 15
REQUEST_TIMEOUT_S = 2.0
RUN_S = 900.0  # bound on the run; never an assertion
SEED = os.environ.get("RACKSCALE_FUZZ_SEED", "20261204")
ADMIN = "fuzz-admin-token-0000001"
TOKENS = f"""
tokens:
  - {{token: "{ADMIN}", tenant: ops, role: admin}}
  - {{token: "fuzz-user-token-00000001", tenant: alice, role: user}}
"""


async def test_the_gateway_conforms_to_its_openapi_document(open_stack: StackFactory, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    e2e = await open_stack(domains=1, nodes_per_domain=4, token=ADMIN, settings={"tokens_file": str(tokens)})
    await fuzz(e2e.url, tmp_path)


async def test_a_router_over_two_cells_conforms_to_its_openapi_document(
    open_stack: StackFactory, tmp_path: Path
) -> None:
    """Its document is a cell's with the router's additions (services/router/openapi.py)."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    settings = {"tokens_file": str(tokens)}
    c0 = await open_stack(domains=1, nodes_per_domain=4, token=ADMIN, settings=settings)
    c1 = await open_stack(domains=1, nodes_per_domain=4, token=ADMIN, settings={**settings, "cell": "c1"})
    router = RouterServer(Router(Cells(gateways=(("c0", c0.url), ("c1", c1.url)), homes={})), "127.0.0.1", 0)
    await router.start()
    try:
        await fuzz(router.url, tmp_path)
    finally:
        await router.stop()


async def fuzz(url: str, tmp_path: Path) -> None:
    """Schemathesis over every operation of `url`/openapi.json, as the admin; fails naming what it found."""
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
        "PYTHONPATH": str(ROOT),
        "NO_COLOR": "1",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        SEED,
        "--request-timeout",
        str(REQUEST_TIMEOUT_S),
        "--continue-on-failure",
        "--no-color",
        "-H",
        f"Authorization: Bearer {ADMIN}",
        cwd=tmp_path,  # its Hypothesis database and any report stay out of the repository
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_S)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"the fuzz ran past {RUN_S:g}s") from None
    text = out.decode(errors="replace")
    assert proc.returncode == 0, f"schemathesis found problems (exit {proc.returncode}):\n{text[-20000:]}"
    selected = re.search(r"Selected: (\d+)/(\d+)", text)
    tested = re.search(r"Tested: (\d+)", text)
    assert selected and tested, text[-4000:]
    assert int(tested[1]) == int(selected[1]) == int(selected[2]), text[-4000:]  # every operation was reached
