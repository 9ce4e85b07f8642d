"""The router's decisions, pure: which cells a submission is offered to and in what order, which cell a request
names, and how pages of several cells' lists become one page.

A job goes to its tenant's home cell when it has one (RACKSCALE_TENANTS_FILE, `cell`), else to the cells that
answered with a capacity summary, the most free GPUs first: the first that takes the job's shape gets it (a cell
too small for the shape answers 422 and the next is asked). A job never spans cells.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.api import CellSummary
from shared.names import job_cell


@dataclass(frozen=True, slots=True)
class Cells:
    """The cells a router fronts: name → gateway URL in the configured order (the first: the default of one-cell
    views), and tenant → home cell."""

    gateways: tuple[tuple[str, str], ...]
    homes: Mapping[str, str]

    def __post_init__(self) -> None:
        if not self.gateways:
            raise ValueError("a router needs at least one cell (RACKSCALE_CELL_GATEWAYS)")
        known = set(self.names)
        stray = {t: c for t, c in self.homes.items() if c not in known}
        if stray:
            listed = ", ".join(f"{t} → {c}" for t, c in sorted(stray.items()))
            raise ValueError(f"home cells the router has no gateway for: {listed} (cells: {', '.join(self.names)})")

    @property
    def names(self) -> list[str]:
        return [c for c, _ in self.gateways]

    @property
    def default(self) -> str:
        return self.gateways[0][0]

    def url(self, cell: str) -> str:
        return dict(self.gateways)[cell]

    def __contains__(self, cell: object) -> bool:
        return cell in dict(self.gateways)


def submit_order(cells: Cells, tenant: str | None, summaries: Mapping[str, CellSummary]) -> list[str]:
    """The cells to offer a job to, in turn: the tenant's home cell alone, else every cell with a summary, the
    most free GPUs first (ties: the configured order). A cell without a summary (it didn't answer) is left out."""
    home = cells.homes.get(tenant) if tenant is not None else None
    if home is not None:
        return [home]
    known = [c for c in cells.names if c in summaries]
    return sorted(known, key=lambda c: -summaries[c].free)  # sorted is stable: ties keep the configured order


def largest(cells: Iterable[str], summaries: Mapping[str, CellSummary]) -> str:
    """The cell with the most GPUs among `cells` (ties: the first): the one a refusal of every cell names."""
    return max(cells, key=lambda c: summaries[c].gpus if c in summaries else -1)


def refusal(cell: str, summary: CellSummary | None, error: str) -> str:
    """The words of a job no cell takes: the largest cell's own refusal, and its size."""
    size = f" ({summary.gpus} GPUs)" if summary is not None else ""
    return f"no cell can take this job (a job never spans cells); the largest, {cell}{size}: {error}"


class UnknownJob(LookupError):
    """A job id of a cell the router has no gateway for (a 404: no such job here); the message lists its cells."""


class BadCell(ValueError):
    """A `cell` parameter naming no cell of the router, or missing where it is needed (a 422)."""


def cell_of_job(cells: Cells, job_id: str) -> str:
    """The cell a job id belongs to (shared.names.job_cell), when the router fronts it."""
    cell = job_cell(job_id)
    if cell not in cells:
        listed = ", ".join(cells.names)
        raise UnknownJob(f"unknown job {job_id}: its cell {cell} is not one of this router's ({listed})")
    return cell


def named_cell(cells: Cells, cell: str | None, *, required: bool = False) -> str:
    """The cell a `?cell=` parameter names (absent: the default cell, unless `required` and there are several)."""
    if cell is None:
        if required and len(cells.names) > 1:
            raise BadCell(f"cell: name the cell, one of {', '.join(cells.names)} (node names repeat across cells)")
        return cells.default
    if cell not in cells:
        raise BadCell(f"cell: unknown cell {cell!r}, not one of {', '.join(cells.names)}")
    return cell


Item = Mapping[str, Any]


def merge_page(lists: Iterable[Sequence[Item]], key: Callable[[Item], Any], offset: int, limit: int) -> list[Item]:
    """One page (from `offset`, `limit` items) of the cells' lists merged in `key` order: each list is in that order
    and holds at least its cell's first offset + limit items, or all it has (the page may come from one cell)."""
    merged = sorted((item for items in lists for item in items), key=key)
    return merged[offset : offset + limit]


def job_order(job: Item) -> tuple[float, str]:
    """/v1/jobs: submit order (the cells' own order), across cells by submit time."""
    return (float(job.get("submitted_at", 0.0)), str(job.get("id", "")))


def migration_order(move: Item) -> tuple[float, str]:
    """/v1/migrations: newest first."""
    return (-float(move.get("created_at", 0.0)), str(move.get("id", "")))
