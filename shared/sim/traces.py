"""Trace loaders: the real traces (Philly and Kalos carried in the repository's data/traces, the Alibaba ones
from a folder of your own) and a documented canonical CSV.

Every loader returns the same `TraceJob` rows plus a tally of the rows it could not use, each with
its reason (`LoadedTrace.skipped`); nothing is dropped silently. A row that is *malformed* (wrong
number of fields, a number that doesn't parse, a required column missing from the header) raises
`TraceFormatError` naming the file and line, because a broken file should stop a run, not thin it.

Formats (detected from the header, or forced with ``fmt=``):

``canonical``  ``job_id,submit_s,gpus,duration_s,tenant`` plus optional ``gpus_per_node,nvlink,segment,
               priority,checkpointable`` (empty cell = not given). ``nvlink`` is required|preferred|none;
               ``checkpointable`` is true|false|1|0|yes|no.
``philly``     Microsoft Philly via Pollux: ``timestamp,duration,num_gpus,gpu_time,cluster``; the VC is the
               tenant, submit time is seconds from the earliest timestamp (rows are not sorted).
``kalos``      Acme/Kalos decoded table ``kalos_llm_jobs.csv``; tenant ``llm``; ``kind`` keeps the job type.
``alibaba-openb`` Alibaba GPU v2023 pods: submit = creation_time, duration = deletion - scheduled time;
               Pending pods (never ran) and CPU-only pods are skipped; GPU-sharing pods count as 1 GPU.
``alibaba-spot`` Alibaba spot v2026 top-job tables: gpus = gpu_request x worker_num; tenant = organization;
               Spot jobs get priority -1 (preemptible by HP jobs).

A directory may be given for a real trace: the loader picks the replayable file in it (`DEFAULT_FILES`).

Where the real traces live (`trace_folder`): the repository carries Philly and Kalos in ``data/traces/``
(CC BY 4.0; see data/README.md). The Alibaba traces state no licence, so they are not carried: put them in
a folder of your own (sub-folders ``alibaba-openb/`` and ``alibaba-spot/`` holding the files `DEFAULT_FILES`
names) and name it with ``$RACKSCALE_TRACES`` (or give the sub-folder to ``rackscale sim --trace``). The
tests read the Alibaba formats from small synthetic fixtures (tests/unit/sim_fixtures/alibaba-*).
"""

from __future__ import annotations

import csv
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

FORMATS = ("canonical", "philly", "kalos", "alibaba-openb", "alibaba-spot")
CANONICAL_COLUMNS = ("job_id", "submit_s", "gpus", "duration_s", "tenant")
CANONICAL_OPTIONAL = ("gpus_per_node", "nvlink", "segment", "priority", "checkpointable")
NVLINK_VALUES = ("required", "preferred", "none")

# the replayable file inside each real trace's folder
DEFAULT_FILES = {
    "philly": "philly.csv",
    "kalos": "kalos_llm_jobs.csv",
    "alibaba-openb": "openb_pod_list_default.csv",
    "alibaba-spot": "spot_gpu_jobs_top_subset.csv",
}

# the real traces a source checkout carries (data/traces/philly, data/traces/kalos), and the variable that
# names a folder with more of them (e.g. alibaba-openb/ and alibaba-spot/, which can't be carried)
DATA_TRACES = Path(__file__).resolve().parents[2] / "data" / "traces"
TRACES_ENV = "RACKSCALE_TRACES"


def trace_folder(name: str, base: str | Path | None = None) -> Path:
    """The folder of real trace `name` (a `DEFAULT_FILES` key): ``base/name`` when `base` is given (e.g. a
    ``--traces`` flag), else ``$RACKSCALE_TRACES/name`` when that folder exists, else ``data/traces/name``."""
    if base is not None:
        where = [Path(base)]
    else:
        env = os.environ.get(TRACES_ENV)
        where = [Path(env)] if env else []
        where.append(DATA_TRACES)
    for folder in where:
        if (folder / name).is_dir():
            return folder / name
    looked = " or ".join(str(w / name) for w in where)
    raise FileNotFoundError(f"no {name} trace folder: looked for {looked}; set {TRACES_ENV} to the folder holding it")


# header columns that identify each format (all must be present)
SIGNATURES: dict[str, tuple[str, ...]] = {
    "canonical": CANONICAL_COLUMNS,
    "philly": ("timestamp", "duration", "num_gpus", "cluster"),
    "kalos": ("job_idx", "submit_offset_s", "num_gpus", "duration_s"),
    "alibaba-openb": ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time"),
    "alibaba-spot": ("job_name", "organization", "submit_time", "duration", "gpu_request", "worker_num"),
}


class TraceFormatError(ValueError):
    """A malformed trace file: the message names the file and the line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One usable trace row, in the canonical columns. None: not given by the trace (mapping decides)."""

    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    tenant: str
    gpus_per_node: int | None = None
    nvlink: str | None = None
    segment: int | None = None
    priority: int = 0
    checkpointable: bool | None = None
    kind: str = ""  # the trace's job type where it has one (e.g. Kalos Pretrain)
    line: int = 0  # line in the source file, for reports


@dataclass(slots=True)
class LoadedTrace:
    path: str
    fmt: str
    jobs: list[TraceJob]
    rows: int = 0  # data rows read
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> rows
    skipped_lines: dict[str, list[int]] = field(default_factory=dict)  # reason -> first few line numbers
    notes: Counter[str] = field(default_factory=Counter)  # rows kept but adjusted (e.g. fractional GPUs)

    def skip(self, reason: str, line: int) -> None:
        self.skipped[reason] += 1
        lines = self.skipped_lines.setdefault(reason, [])
        if len(lines) < 5:
            lines.append(line)

    def summary(self) -> dict[str, object]:
        return {
            "path": self.path,
            "format": self.fmt,
            "rows": self.rows,
            "jobs": len(self.jobs),
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_lines": {k: v for k, v in sorted(self.skipped_lines.items())},
            "notes": dict(sorted(self.notes.items())),
        }


# -- entry point ---------------------------------------------------------------------------------------
def resolve_path(path: str | Path, fmt: str | None = None) -> Path:
    """A file as given, or the replayable file inside a real trace's folder."""
    p = Path(path)
    if p.is_dir():
        name = DEFAULT_FILES.get(fmt or p.name)
        if name is None or not (p / name).is_file():
            raise FileNotFoundError(f"{p} is a folder with no known trace file; give the CSV itself")
        return p / name
    if not p.is_file():
        raise FileNotFoundError(f"no trace file at {p}")
    return p


def detect_format(header: list[str]) -> str | None:
    cols = {c.strip() for c in header}
    for fmt in ("canonical", "philly", "kalos", "alibaba-openb", "alibaba-spot"):
        if set(SIGNATURES[fmt]) <= cols:
            return fmt
    return None


def load_trace(path: str | Path, fmt: str | None = None, *, limit: int | None = None) -> LoadedTrace:
    """Load a trace; `limit` stops after that many data rows (for smoke tests)."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    file = resolve_path(path, fmt)
    with file.open(newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceFormatError(str(file), 1, "empty file: no header") from None
        header = [h.strip() for h in header]
        found = detect_format(header)
        use = fmt or found
        if use is None:
            raise TraceFormatError(
                str(file), 1, f"unknown header {header}; give --format ({', '.join(FORMATS)}) or use the canonical CSV"
            )
        missing = [c for c in SIGNATURES[use] if c not in header]
        if missing:
            raise TraceFormatError(str(file), 1, f"format {use}: header lacks columns {missing}")
        out = LoadedTrace(str(file), use, [])
        rows = _rows(reader, header, str(file), limit)
        _LOADERS[use](rows, out)
    if use == "philly":
        _rebase(out)
    out.jobs.sort(key=lambda j: (j.submit_s, j.line))
    return out


Row = tuple[int, dict[str, str]]


def _rows(reader: Iterator[list[str]], header: list[str], path: str, limit: int | None) -> Iterator[Row]:
    width = len(header)
    n = 0
    for rec in reader:
        line = reader.line_num  # type: ignore[attr-defined]
        if not rec or (len(rec) == 1 and not rec[0].strip()):
            continue  # blank line
        if len(rec) != width:
            raise TraceFormatError(path, line, f"{len(rec)} fields, the header has {width}")
        if limit is not None and n >= limit:
            return
        n += 1
        yield line, dict(zip(header, (v.strip() for v in rec), strict=True))


# -- field parsing -------------------------------------------------------------------------------------
class _Ctx:
    __slots__ = ("line", "path")

    def __init__(self, path: str, line: int) -> None:
        self.path, self.line = path, line

    def num(self, row: dict[str, str], col: str, *, empty: float | None = None) -> float:
        raw = row[col]
        if raw == "" and empty is not None:
            return empty
        try:
            v = float(raw)
        except ValueError:
            raise TraceFormatError(self.path, self.line, f"column {col}: {raw!r} is not a number") from None
        if math.isnan(v) or math.isinf(v):
            raise TraceFormatError(self.path, self.line, f"column {col}: {raw!r} is not a finite number")
        return v

    def whole(self, row: dict[str, str], col: str) -> int:
        v = self.num(row, col)
        if v != int(v):
            raise TraceFormatError(self.path, self.line, f"column {col}: {row[col]!r} is not a whole number")
        return int(v)

    def opt_whole(self, row: dict[str, str], col: str) -> int | None:
        if row.get(col, "") == "":
            return None
        return self.whole(row, col)


def _usable(out: LoadedTrace, line: int, gpus: int, duration: float) -> bool:
    """Rows that parse but can't be replayed are skipped with their reason."""
    if gpus <= 0:
        out.skip("no GPUs", line)
        return False
    if duration <= 0:
        out.skip("duration not positive", line)
        return False
    return True


# -- loaders -------------------------------------------------------------------------------------------
def _load_canonical(rows: Iterator[Row], out: LoadedTrace) -> None:
    seen: set[str] = set()
    for line, row in rows:
        out.rows += 1
        c = _Ctx(out.path, line)
        job_id = row["job_id"]
        if not job_id:
            raise TraceFormatError(out.path, line, "column job_id: empty")
        if job_id in seen:
            out.skip("duplicate job_id", line)
            continue
        submit = c.num(row, "submit_s")
        gpus = c.whole(row, "gpus")
        duration = c.num(row, "duration_s")
        if submit < 0:
            out.skip("negative submit time", line)
            continue
        if not _usable(out, line, gpus, duration):
            continue
        nvlink = row.get("nvlink", "") or None
        if nvlink is not None and nvlink not in NVLINK_VALUES:
            raise TraceFormatError(out.path, line, f"column nvlink: {nvlink!r} is not one of {NVLINK_VALUES}")
        ckpt_raw = row.get("checkpointable", "").lower()
        if ckpt_raw in ("", "none"):
            ckpt: bool | None = None
        elif ckpt_raw in ("1", "true", "yes"):
            ckpt = True
        elif ckpt_raw in ("0", "false", "no"):
            ckpt = False
        else:
            raise TraceFormatError(out.path, line, f"column checkpointable: {ckpt_raw!r} is not true/false")
        gpn = c.opt_whole(row, "gpus_per_node")
        seg = c.opt_whole(row, "segment")
        if gpn is not None and gpn < 1:
            raise TraceFormatError(out.path, line, f"column gpus_per_node: must be at least 1, got {gpn}")
        if seg is not None and seg < 1:
            raise TraceFormatError(out.path, line, f"column segment: must be at least 1, got {seg}")
        seen.add(job_id)
        out.jobs.append(
            TraceJob(
                job_id=job_id,
                submit_s=submit,
                gpus=gpus,
                duration_s=duration,
                tenant=row["tenant"] or "default",
                gpus_per_node=gpn,
                nvlink=nvlink,
                segment=seg,
                priority=c.opt_whole(row, "priority") or 0,
                checkpointable=ckpt,
                line=line,
            )
        )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _load_philly(rows: Iterator[Row], out: LoadedTrace) -> None:
    for line, row in rows:
        out.rows += 1
        c = _Ctx(out.path, line)
        stamp = row["timestamp"]
        try:
            when = datetime.fromisoformat(stamp).replace(tzinfo=UTC)
        except ValueError:
            raise TraceFormatError(out.path, line, f"column timestamp: {stamp!r} is not YYYY-mm-dd HH:MM:SS") from None
        duration = c.num(row, "duration")
        gpus = c.whole(row, "num_gpus")
        if not _usable(out, line, gpus, duration):
            continue
        # absolute seconds for now; `_rebase` makes them relative to the earliest submit
        out.jobs.append(
            TraceJob(
                f"philly-{line}",
                (when - _EPOCH).total_seconds(),
                gpus,
                duration,
                row["cluster"] or "default",
                line=line,
            )
        )


def _rebase(out: LoadedTrace) -> None:
    if not out.jobs:
        return
    t0 = min(j.submit_s for j in out.jobs)
    out.jobs = [TraceJob(j.job_id, j.submit_s - t0, j.gpus, j.duration_s, j.tenant, line=j.line) for j in out.jobs]


def _load_kalos(rows: Iterator[Row], out: LoadedTrace) -> None:
    for line, row in rows:
        out.rows += 1
        c = _Ctx(out.path, line)
        submit = c.num(row, "submit_offset_s")
        gpus = c.whole(row, "num_gpus")
        duration = c.num(row, "duration_s")
        state = row.get("state", "COMPLETED")
        if state and state != "COMPLETED":
            out.skip(f"state {state} (only completed jobs have a true runtime)", line)
            continue
        if not _usable(out, line, gpus, duration):
            continue
        out.jobs.append(
            TraceJob(
                f"kalos-{row['job_idx'] or line}",
                submit,
                gpus,
                duration,
                "llm",
                kind=row.get("job_type", ""),
                line=line,
            )
        )


def _load_openb(rows: Iterator[Row], out: LoadedTrace) -> None:
    for line, row in rows:
        out.rows += 1
        c = _Ctx(out.path, line)
        gpus = c.whole(row, "num_gpu")
        milli = c.num(row, "gpu_milli", empty=0.0)
        submit = c.num(row, "creation_time")
        if gpus <= 0:
            out.skip("no GPUs (CPU-only pod)", line)
            continue
        if row["scheduled_time"] == "":
            out.skip(f"never ran (phase {row.get('pod_phase') or '?'}, no scheduled_time)", line)
            continue
        start = c.num(row, "scheduled_time")
        end = c.num(row, "deletion_time")
        if end - start <= 0:
            out.skip("duration not positive", line)
            continue
        if gpus == 1 and 0 < milli < 1000:
            out.notes["GPU-sharing pod counted as 1 whole GPU"] += 1
        out.jobs.append(
            TraceJob(
                row["name"] or f"openb-{line}",
                submit,
                gpus,
                end - start,
                row.get("qos") or "default",
                kind=row.get("qos", ""),
                line=line,
            )
        )


def _load_spot(rows: Iterator[Row], out: LoadedTrace) -> None:
    seen: set[str] = set()
    for line, row in rows:
        out.rows += 1
        c = _Ctx(out.path, line)
        per_worker = c.num(row, "gpu_request")
        workers = c.whole(row, "worker_num")
        submit = c.num(row, "submit_time")
        duration = c.num(row, "duration")
        name = row["job_name"] or f"spot-{line}"
        if name in seen:
            out.skip("duplicate job_name", line)
            continue
        if per_worker != int(per_worker):
            out.skip("fractional GPUs per worker", line)
            continue
        gpus = int(per_worker) * workers
        if not _usable(out, line, gpus, duration):
            continue
        seen.add(name)
        prio = -1 if row.get("job_type", "").lower() == "spot" else 0
        out.jobs.append(
            TraceJob(
                f"spot-{name}",
                submit,
                gpus,
                duration,
                f"org{row['organization'] or '?'}",
                priority=prio,
                kind=row.get("job_type", ""),
                line=line,
            )
        )


_LOADERS: dict[str, Callable[[Iterator[Row], LoadedTrace], None]] = {
    "canonical": _load_canonical,
    "philly": _load_philly,
    "kalos": _load_kalos,
    "alibaba-openb": _load_openb,
    "alibaba-spot": _load_spot,
}


def write_canonical(jobs: list[TraceJob], path: str | Path) -> None:
    """Write jobs as the canonical CSV (for converting a trace once and editing it by hand)."""
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*CANONICAL_COLUMNS, *CANONICAL_OPTIONAL])
        for j in jobs:
            w.writerow(
                [
                    j.job_id,
                    f"{j.submit_s:g}",
                    j.gpus,
                    f"{j.duration_s:g}",
                    j.tenant,
                    "" if j.gpus_per_node is None else j.gpus_per_node,
                    j.nvlink or "",
                    "" if j.segment is None else j.segment,
                    j.priority,
                    "" if j.checkpointable is None else str(j.checkpointable).lower(),
                ]
            )
