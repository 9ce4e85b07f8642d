"""The CLI's HTTP client of the gateway: standard library only (urllib), JSON in and out.

Every failure becomes a `CliError` whose text is what the user reads: an API error names the field and
the gateway's message, a refused connection says to start Rackscale with `rackscale up`.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import sse

URL_ENV = "RACKSCALE_URL"
TOKEN_ENV = "RACKSCALE_TOKEN"  # the caller's bearer token, when the gateway has RACKSCALE_TOKENS_FILE
DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_WAIT_MAX_S = 5.0  # the longest Retry-After a read or cancel waits out before asking again
UP_HINT = "start it with `rackscale up` (or `python -m services.cli up`), or point --url / RACKSCALE_URL at it"


def default_url(env: Mapping[str, str] | None = None) -> str:
    source = os.environ if env is None else env
    return source.get(URL_ENV, "").strip() or DEFAULT_URL


def default_token(env: Mapping[str, str] | None = None) -> str | None:
    source = os.environ if env is None else env
    return source.get(TOKEN_ENV, "").strip() or None


class CliError(Exception):
    """A failure worded for the user; the command exits 1 after printing it."""


class ApiError(CliError):
    """The gateway answered 4xx/5xx with an ErrorBody {"error", "field"} (or something else)."""

    def __init__(self, status: int, error: str, field: str | None = None) -> None:
        self.status = status
        self.error = error
        self.field = field
        super().__init__(format_api_error(status, error, field))


def format_api_error(status: int, error: str, field: str | None) -> str:
    """`error: field 'gpus': must be at least 1 (HTTP 422)`; the gateway's "field: " prefix is not repeated."""
    if field:
        message = error[len(field) + 2 :] if error.startswith(f"{field}: ") else error
        return f"error: field '{field}': {message} (HTTP {status})"
    return f"error: {error} (HTTP {status})"


def api_error(status: int, body: bytes, reason: str = "") -> ApiError:
    """The ApiError for an error answer, whatever its body (a proxy may answer with HTML)."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        field = doc.get("field")
        return ApiError(status, doc["error"], field if isinstance(field, str) else None)
    text = body.decode(errors="replace").strip()[:200] or reason or "no details"
    return ApiError(status, text)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: Any  # decoded JSON
    raw: bytes = b""


@dataclass(frozen=True, slots=True)
class Client:
    base: str = DEFAULT_URL
    timeout_s: float = 10.0
    token: str | None = None
    # a 503 with Retry-After (the view rebuilt from the log, a job not recorded yet) is asked again this many
    # times for reads and cancels (both safe to repeat); a submit is not (its Idempotency-Key is the retry)
    retries: int = 5
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)

    def url(self, path: str, query: Mapping[str, object] | None = None) -> str:
        url = self.base.rstrip("/") + path
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        return f"{url}?{urllib.parse.urlencode(params)}" if params else url

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        query: Mapping[str, object] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Accept": "application/json", **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        with self._open(method, path, query, hdrs, data, self.timeout_s) as resp:
            try:
                status, raw = resp.status, resp.read()
            except OSError as e:  # a reset while reading the answer
                raise self._unreachable(e) from None
        try:
            return Response(status, json.loads(raw) if raw else None, raw)
        except ValueError:
            raise CliError(f"error: {self.base} answered {status} with something that isn't JSON") from None

    def lines(self, path: str, query: Mapping[str, object] | None = None) -> Iterator[str]:
        """A text answer's lines as they come (a followed log: the answer stays open), each with its newline."""
        with self._open("GET", path, query, {"Accept": "text/plain"}, None, timeout=None) as resp:
            try:
                while raw := resp.readline():
                    yield raw.decode("utf-8", "replace")
            except OSError as e:
                raise self._unreachable(e) from None

    def events(self, path: str, query: Mapping[str, object] | None, reader: sse.Reader) -> Iterator[sse.Event]:
        """A server-sent event stream's events as they come, until it closes or the connection drops (then the
        caller may reconnect: `reader.last_id` goes with it as Last-Event-ID)."""
        headers = {"Accept": sse.MEDIA_TYPE}
        if reader.last_id is not None:
            headers["Last-Event-ID"] = reader.last_id
        with self._open("GET", path, query, headers, None, timeout=None) as resp:
            try:
                while raw := resp.readline():
                    ev = reader.feed(raw.decode("utf-8", "replace"))
                    if ev is not None:
                        yield ev
            except OSError:
                return  # dropped: the caller decides whether to go on

    def _open(
        self,
        method: str,
        path: str,
        query: Mapping[str, object] | None,
        headers: dict[str, str],
        data: bytes | None,
        timeout: float | None,
    ) -> Any:
        """The open answer (a context manager), after waiting out 503s with Retry-After for reads and cancels;
        an error answer raises ApiError, no answer CliError. `timeout` None: no limit (a followed stream)."""
        if self.token:
            headers = {**headers, "Authorization": f"Bearer {self.token}"}
        req = urllib.request.Request(self.url(path, query), data=data, method=method, headers=headers)
        for attempt in range(self.retries + 1):
            try:
                return urllib.request.urlopen(req, timeout=timeout)
            except urllib.error.HTTPError as e:
                wait = _retry_after(e) if method in ("GET", "DELETE") and attempt < self.retries else None
                if wait is None:
                    raise api_error(e.code, e.read(), e.reason) from None
                e.close()
                self.sleep(wait)
            except urllib.error.URLError as e:
                raise self._unreachable(e.reason) from None
            except OSError as e:  # a timeout
                raise self._unreachable(e) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _unreachable(self, reason: object) -> CliError:
        if isinstance(reason, ConnectionRefusedError):
            return CliError(
                f"error: cannot reach Rackscale at {self.base}: connection refused.\nIs it running? {UP_HINT}"
            )
        if isinstance(reason, TimeoutError):
            return CliError(f"error: {self.base} did not answer within {self.timeout_s:g}s")
        if isinstance(reason, socket.gaierror):
            return CliError(f"error: cannot resolve the host of {self.base}: {reason}")
        return CliError(f"error: cannot reach Rackscale at {self.base}: {reason}\n{UP_HINT}")

    def get(self, path: str, query: Mapping[str, object] | None = None) -> Any:
        return self.request("GET", path, query=query).body

    def post(self, path: str, body: object = None, headers: Mapping[str, str] | None = None) -> Response:
        return self.request("POST", path, body, headers=headers)

    def delete(self, path: str) -> Response:
        return self.request("DELETE", path)


def _retry_after(e: urllib.error.HTTPError) -> float | None:
    """How long a 503 asks to wait (seconds, at most RETRY_WAIT_MAX_S); None for any other answer."""
    if e.code != 503:
        return None
    try:
        return min(max(float(e.headers.get("Retry-After", "")), 0.0), RETRY_WAIT_MAX_S)
    except ValueError:
        return None  # absent, or an HTTP date: not ours


def quote(segment: str) -> str:
    """One path segment (a job id or node name) as the URL carries it."""
    return urllib.parse.quote(segment, safe="")
