"""The arrows of the house point one way: `shared/` never imports `services/`, and a service imports another
service only where the stack is assembled.

    services/stack.py ──▶ every service          (the whole system in one process, or one per service)
    services/cli      ──▶ services.stack         (`rackscale up` runs that stack)
    services/fleet    ──▶ services.agent         (many simulated agents in one process)
    services/<any>    ──▶ services.main          (the common `python -m services.<name>` entry point)
    services/<any>    ──▶ shared/                ──▶ shared/core (pure: tests/unit/test_core_purity.py)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# service package → the other parts of services/ it may import (beyond itself and services.main)
ASSEMBLES: dict[str, tuple[str, ...]] = {"cli": ("services.stack",), "fleet": ("services.agent",)}
EVERYONE_MAY = ("services.main",)


def _module(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imports(root: Path, path: Path) -> list[str]:
    """Every module `path` imports, at any depth of the file (function-level imports too), made absolute."""
    package = _module(root, path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [module] if node.module else [f"{module}.{a.name}" for a in node.names]
    return found


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violations(root: Path) -> list[str]:
    """'file imports module' for each arrow that points the wrong way under `root`."""
    bad: list[str] = []
    for path in sorted((root / "shared").rglob("*.py")):
        bad += [f"{path.relative_to(root)} imports {m}" for m in imports(root, path) if _within(m, "services")]
    for path in sorted((root / "services").rglob("*.py")):
        parts = path.relative_to(root / "services").parts
        if len(parts) == 1:
            continue  # services/stack.py, services/main.py: the assembly and the entry point
        own = f"services.{parts[0]}"
        allowed = (own, *EVERYONE_MAY, *ASSEMBLES.get(parts[0], ()))
        for m in imports(root, path):
            if _within(m, "services") and m != "services" and not any(_within(m, a) for a in allowed):
                bad.append(f"{path.relative_to(root)} imports {m}")
    return bad


def test_the_arrows_point_one_way() -> None:
    assert (ROOT / "shared").is_dir() and (ROOT / "services").is_dir()
    assert violations(ROOT) == []


@pytest.mark.parametrize(
    ("where", "line", "caught"),
    [
        ("shared/held.py", "from services.inventory.service import InventoryService", "services.inventory.service"),
        ("shared/core/x.py", "def f():\n    import services.queue.service\n", "services.queue.service"),
        ("services/gateway/x.py", "from services.queue import service", "services.queue"),
        ("services/queue/x.py", "from ..placement.service import PlacementService", "services.placement.service"),
        ("services/cli/x.py", "from services.gateway.views import cluster_view", "services.gateway.views"),
    ],
)
def test_a_planted_import_is_caught(tmp_path: Path, where: str, line: str, caught: str) -> None:
    for folder in ("shared/core", "services/gateway", "services/queue", "services/cli"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "shared" / "__init__.py").write_text("")
    (tmp_path / "services" / "__init__.py").write_text("")
    (tmp_path / "services" / "stack.py").write_text("from services.queue.service import QueueService\n")
    (tmp_path / "services" / "cli" / "up.py").write_text("from services.stack import Stack\n")
    (tmp_path / "services" / "queue" / "__main__.py").write_text("from services.main import main_for\n")
    assert violations(tmp_path) == []  # the allowed arrows alone
    (tmp_path / where).write_text(line + "\n")
    assert violations(tmp_path) == [f"{where} imports {caught}"]
