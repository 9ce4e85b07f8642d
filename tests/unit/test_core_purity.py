"""The pure parts stay pure: no asyncio, NATS, Redis, clock or services inside shared/core (the placement core),
shared/lifecycle.py (the job's state machine), shared/reconcile.py (agents against records), shared/liveness.py
(silence judged only while we could hear), shared/launch.py (the launch contract), shared/rank_log.py (log lines),
shared/output_path.py (the output pattern), shared/usage_log.py (the usage view's fold of the job log) or
shared/jobfile/ (job files read: text in, a body out)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
CORE = SHARED / "core"
PURE_MODULES = (
    *(
        SHARED / f"{m}.py"
        for m in ("lifecycle", "reconcile", "liveness", "launch", "rank_log", "output_path", "usage_log")
    ),
    *sorted((SHARED / "jobfile").glob("*.py")),
)
FORBIDDEN_MODULES = ("asyncio", "nats", "redis", "valkey", "aiohttp", "services", "time", "datetime", "socket")
# what must not even be loaded transitively (yaml loads datetime for timestamps: harmless, not a clock read)
IO_MODULES = ("asyncio", "nats", "redis", "valkey", "aiohttp", "services", "socket")
FORBIDDEN_CALLS = {("time", "time"), ("time", "monotonic"), ("datetime", "now"), ("random", "random")}


def _core_files() -> list[Path]:
    files = sorted(CORE.rglob("*.py"))
    assert files, f"no core modules found under {CORE}"
    return [*files, *PURE_MODULES]


def _imports(tree: ast.AST) -> list[str]:
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


@pytest.mark.parametrize("path", _core_files(), ids=lambda p: str(p.relative_to(SHARED)))
def test_core_module_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [m for m in _imports(tree) if m.split(".")[0] in FORBIDDEN_MODULES]
    assert not bad, f"{path.name} imports {bad}: the core must stay free of I/O and clocks"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            assert (node.value.id, node.attr) not in FORBIDDEN_CALLS, f"{path.name} reads {node.value.id}.{node.attr}"


def test_importing_the_core_loads_no_io_modules() -> None:
    """Import the core in a fresh interpreter and list what it dragged in."""
    import subprocess
    import sys

    code = (
        "import sys; import shared.core, shared.core.topology_io, shared.lifecycle, shared.reconcile, "
        "shared.liveness, shared.launch, shared.rank_log, shared.output_path, shared.usage_log, shared.jobfile, "
        "shared.jobfile.schema; "
        "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
        f"{IO_MODULES!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing the core loaded: {out.stdout.strip()}"
