"""Everything of the API but the I/O, shared by `Client` and `AsyncClient`: where the gateway is and with which
token, each operation's request and how its answer is read, which answers are worth asking again, and what a
stream's lines mean. Pure: no sockets here."""

from __future__ import annotations

import json
import os
import platform
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from rackscale import _sse, types
from rackscale._convert import decode, encode
from rackscale.errors import ApiError
from rackscale.types import Accepted, ClusterView, JobBody, JobEvent, JobList, JobState, JobView, LogLine, NodeChanged

T = TypeVar("T")

VERSION = "0.1.0"
URL_ENV = "RACKSCALE_URL"  # the CLI's too
TOKEN_ENV = "RACKSCALE_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8080"
TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})  # a test checks the server's
RETRY_WAIT_MAX_S = 5.0  # the longest Retry-After waited out before asking again
# A stream silent this long is taken for dropped: the gateway writes a keep-alive every 15 s on both streams.
STREAM_IDLE_S = 60.0
FOLLOW_RECONNECTS = 5  # a followed log whose stream drops is asked again this many times (from where it left off)
FOLLOW_RECONNECT_S = 1.0
WAIT_RECHECK_S = 0.2  # after a job's end was heard, how often its view is read until it says so too
PAGE_MAX = 500  # the gateway's largest page
USER_AGENT = f"rackscale-client/{VERSION} python/{platform.python_version()}"

# What submit_file sends a file as, by its extension; anything else is a batch script (#SBATCH lines).
FILE_TYPES = {".yaml": "application/yaml", ".yml": "application/yaml", ".json": "application/json"}
SCRIPT_TYPE = "text/x-shellscript"


@dataclass(frozen=True, slots=True)
class ClusterChanged:
    """`event: cluster` of /v1/events: /v1/cluster changed (another tenant's job moved: a user's token hears only
    that)."""


Event = JobEvent | NodeChanged | ClusterChanged


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the gateway listens: `http(s)://host[:port][/base]`."""

    scheme: str
    host: str
    port: int
    base: str  # a path prefix (a gateway behind a proxy), "" without

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        u = urllib.parse.urlsplit(url.strip())
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL of the gateway: {url!r}")
        port = u.port or (443 if u.scheme == "https" else 80)
        return cls(u.scheme, u.hostname, port, u.path.rstrip("/"))

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.base}"


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    target: str  # path and query, as the request line carries them
    headers: dict[str, str]
    body: bytes | None = None
    retry: bool = False  # safe to ask again after a 503 with Retry-After (reads and cancels; a submit is not)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request and how its (2xx) answer is read: status and body in, the result out."""

    request: Request
    read: Callable[[int, bytes], T]


@dataclass(frozen=True, slots=True)
class Api:
    """The requests of every operation against one gateway, with one token."""

    endpoint: Endpoint
    token: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str | None, token: str | None, env: Mapping[str, str] | None = None) -> Api:
        """`url` or $RACKSCALE_URL or the local default; `token` or $RACKSCALE_TOKEN (or none: an open gateway)."""
        source = os.environ if env is None else env
        url = url or source.get(URL_ENV, "").strip() or DEFAULT_URL
        token = token or source.get(TOKEN_ENV, "").strip() or None
        return cls(Endpoint.parse(url), token)

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None = None,
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        headers: Mapping[str, str] | None = None,
        retry: bool = False,
    ) -> Request:
        target = self.endpoint.base + path
        params = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        if params:
            target += "?" + urllib.parse.urlencode(params)
        hdrs = {"Accept": accept, "User-Agent": USER_AGENT, **(headers or {})}
        if content_type is not None:
            hdrs["Content-Type"] = content_type
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        return Request(method, target, hdrs, body, retry)

    # -- jobs ----------------------------------------------------------------------------------------------------
    def submit(self, body: JobBody | Mapping[str, Any], idempotency_key: str | None = None) -> Call[Accepted]:
        return self._submit(_job_json(body), "application/json", idempotency_key)

    def submit_file(self, path: str | os.PathLike[str], idempotency_key: str | None = None) -> Call[Accepted]:
        """The file as it is (the gateway reads YAML and batch scripts itself): YAML by a .yaml/.yml name, JSON by
        .json, else a script."""
        p = Path(path)
        return self._submit(p.read_bytes(), FILE_TYPES.get(p.suffix.lower(), SCRIPT_TYPE), idempotency_key)

    def _submit(self, data: bytes, content_type: str, idempotency_key: str | None) -> Call[Accepted]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        req = self.request("POST", "/v1/jobs", body=data, content_type=content_type, headers=headers)
        return Call(req, _accepted)

    def dry_run(self, body: JobBody | Mapping[str, Any]) -> Call[types.DryRunView]:
        req = self.request("POST", "/v1/jobs", {"dry_run": True}, body=_job_json(body), content_type="application/json")
        return Call(req, lambda _, data: decode(types.DryRunView, json.loads(data)))

    def get(self, job_id: str) -> Call[JobView]:
        req = self.request("GET", f"/v1/jobs/{_segment(job_id)}", retry=True)
        return Call(req, lambda _, data: decode(JobView, json.loads(data)))

    def list(
        self,
        *,
        tenant: str | None = None,
        state: str | None = None,
        array: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Call[JobList]:
        query = {"tenant": tenant, "state": state, "array": array, "limit": limit, "offset": offset}
        req = self.request("GET", "/v1/jobs", query, retry=True)
        return Call(req, lambda _, data: decode(JobList, json.loads(data)))

    def cancel(self, job_id: str) -> Call[Accepted]:
        req = self.request("DELETE", f"/v1/jobs/{_segment(job_id)}", retry=True)
        return Call(req, _accepted)

    def usage(
        self,
        *,
        tenant: str | None = None,
        from_: str | date | float | None = None,
        to: str | date | float | None = None,
        by: str | None = None,
        csv: bool = False,
    ) -> Call[types.UsageView | str]:
        query = {"tenant": tenant, "from": from_, "to": to, "by": by, "format": "csv" if csv else None}
        accept = "text/csv" if csv else "application/json"
        req = self.request("GET", "/v1/usage", query, accept=accept, retry=True)
        if csv:
            return Call(req, lambda _, data: data.decode("utf-8"))
        return Call(req, lambda _, data: decode(types.UsageView, json.loads(data)))

    def cluster(self) -> Call[ClusterView]:
        req = self.request("GET", "/v1/cluster", retry=True)
        return Call(req, lambda _, data: decode(ClusterView, json.loads(data)))

    # -- streams -------------------------------------------------------------------------------------------------
    def events(self) -> Request:
        return self.request("GET", "/v1/events", accept=_sse.MEDIA_TYPE, retry=True)

    def logs(
        self,
        job_id: str,
        *,
        follow: bool,
        rank: int | None = None,
        tail: int | None = None,
        since: float | None = None,
        attempt: int | None = None,
        last_id: str | None = None,
    ) -> Request:
        query = {"rank": rank, "tail": tail, "since": since, "attempt": attempt, "follow": True if follow else None}
        headers = {"Last-Event-ID": last_id} if last_id is not None else None
        accept = _sse.MEDIA_TYPE if follow else "text/plain"
        return self.request(
            "GET", f"/v1/jobs/{_segment(job_id)}/logs", query, accept=accept, headers=headers, retry=True
        )


# -- answers -------------------------------------------------------------------------------------------------------


def error_of(status: int, headers: Mapping[str, str], body: bytes, reason: str = "") -> ApiError:
    return ApiError.from_answer(status, body, reason, retry_after(headers))


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a Retry-After header asks for (an HTTP date is not read: None)."""
    try:
        return max(float(headers.get("retry-after", "")), 0.0)
    except ValueError:
        return None


def retry_wait(request: Request, status: int, headers: Mapping[str, str]) -> float | None:
    """How long to wait before asking again (None: don't). Only a 503 with Retry-After (the view rebuilt from the
    log, a job not recorded yet) of a request that is safe to repeat."""
    wait = retry_after(headers) if status == 503 and request.retry else None
    return None if wait is None else min(wait, RETRY_WAIT_MAX_S)


def event_of(ev: _sse.Event) -> Event | None:
    """A /v1/events event, typed; None for a kind this client doesn't know (a newer gateway's)."""
    if ev.event == "job":
        return decode(JobEvent, json.loads(ev.data))
    if ev.event == "node":
        return decode(NodeChanged, json.loads(ev.data))
    if ev.event == "cluster":
        return ClusterChanged()
    return None


_DROPPED = re.compile(r"^\[rackscale: (\d+) lines? dropped: .*\]$")


def text_line(line: str, rank: int | None) -> LogLine:
    """One line of a plain-text log answer (with or without its newline) as the LogLine a followed log sends:
    without `rank` each line starts with "<rank>: "; a missing-lines marker says how many."""
    line = line.removesuffix("\n")
    if rank is None:
        head, sep, rest = line.partition(": ")
        if sep and head.isdigit():
            rank, line = int(head), rest
        else:
            rank = -1  # not a line of the format: shown as it came
    dropped = _DROPPED.match(line)
    return LogLine(rank=rank, text=line, dropped=int(dropped.group(1)) if dropped else 0)


@dataclass(slots=True)
class LogFollower:
    """A followed log's events in, its lines out, each once across reconnects. The gateway marks only a chunk's
    last line with an id (its place in the log); a reconnect sending that id goes on after the whole chunk, so a
    chunk's lines are held until that line comes: a stream that drops mid-chunk sends them again, whole."""

    reader: _sse.Reader = field(default_factory=_sse.Reader)
    held: list[LogLine] = field(default_factory=list)
    ended: bool = False

    @property
    def last_id(self) -> str | None:
        return self.reader.last_id

    def feed(self, raw: bytes) -> list[LogLine]:
        ev = self.reader.feed(raw.decode("utf-8", "replace"))
        if ev is None:
            return []
        if ev.event == "line":
            self.held.append(decode(LogLine, json.loads(ev.data)))
            if not ev.own_id:
                return []
        elif ev.event == "end":
            self.ended = True
        else:
            return []
        out, self.held = self.held, []
        return out

    def dropped(self) -> None:
        """The stream broke: what it held of an unfinished chunk comes again after the reconnect."""
        self.held = []
        self.reader = _sse.Reader(last_id=self.reader.last_id)


# -- helpers -------------------------------------------------------------------------------------------------------


def _job_json(body: JobBody | Mapping[str, Any]) -> bytes:
    if isinstance(body, JobBody):
        return json.dumps(encode(body)).encode()
    if isinstance(body, Mapping):
        return json.dumps(dict(body)).encode()
    raise TypeError(f"a job body is a JobBody or a dict, not {type(body).__name__}")


def _accepted(status: int, data: bytes) -> Accepted:
    """202 Accepted, or 200 with the job's view (an earlier submit with the same Idempotency-Key): its id and state."""
    doc = json.loads(data)
    return Accepted(id=str(doc["id"]), state=str(doc["state"]))


def _segment(value: str) -> str:
    if not value:
        raise ValueError("an empty job id")
    return urllib.parse.quote(value, safe="")


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)
