"""A PEP 517 build backend for the client (wheel, sdist, editable), standard library only.

The client is one pure-Python package with no dependencies; building it needs no more than this: the wheel is a
zip of `rackscale/` with its metadata (PEP 427), the sdist a tarball of this folder (PEP 625), the editable wheel
a `.pth` naming this folder (PEP 660). With it `pip install clients/python` needs nothing from an index.
"""

from __future__ import annotations

import base64
import hashlib
import io
import re
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "rackscale"
SDIST_FILES = ("pyproject.toml", "README.md", "_build/rackscale_build.py")
EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed timestamps: the same sources build the same wheel and sdist
EPOCH_S = 315532800  # the same, as a Unix time (UTC)


def _project() -> dict[str, Any]:
    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"])


def _name(project: dict[str, Any]) -> str:
    """The distribution name as file names carry it (PEP 427/503 normalised)."""
    return re.sub(r"[-_.]+", "_", project["name"]).lower()


def _metadata(project: dict[str, Any]) -> str:
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
        f"License-Expression: {project['license']}",
        f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {dep}" for dep in project.get("dependencies", [])),
        "Description-Content-Type: text/markdown",
    ]
    return "\n".join(lines) + "\n\n" + (ROOT / project["readme"]).read_text()


def _sources() -> list[Path]:
    return sorted(
        p for p in (ROOT / PACKAGE).rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(directory: str, files: dict[str, bytes]) -> str:
    project = _project()
    stem = f"{_name(project)}-{project['version']}"
    info = f"{stem}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": _metadata(project).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rackscale_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    filename = f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(Path(directory) / filename, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            entry = zipfile.ZipInfo(path, EPOCH)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            whl.writestr(entry, data)
    return filename


def build_wheel(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    return _write_wheel(wheel_directory, {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in _sources()})


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    """A wheel whose `.pth` puts this folder on sys.path: edits here are what `import rackscale` runs."""
    return _write_wheel(wheel_directory, {f"{_name(_project())}.pth": f"{ROOT}\n".encode()})


def build_sdist(sdist_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    project = _project()
    stem = f"{_name(project)}-{project['version']}"
    members = {name: (ROOT / name).read_bytes() for name in SDIST_FILES}
    members |= {p.relative_to(ROOT).as_posix(): p.read_bytes() for p in _sources()}
    members["PKG-INFO"] = _metadata(project).encode()
    filename = f"{stem}.tar.gz"
    with tarfile.open(Path(sdist_directory) / filename, "w:gz") as tar:
        for name, data in sorted(members.items()):
            entry = tarfile.TarInfo(f"{stem}/{name}")
            entry.size, entry.mode, entry.mtime = len(data), 0o644, EPOCH_S
            tar.addfile(entry, io.BytesIO(data))
    return filename


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings: dict[str, Any] | None = None) -> list[str]:
    return []
