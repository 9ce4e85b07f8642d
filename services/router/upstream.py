"""The router's HTTP client of the cells' gateways: one connection pool, requests forwarded as they came (the
caller's Authorization and the other end-to-end headers pass through: the cells check tokens), and a cell that
can't be reached told apart from one that answered."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlencode

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from services.router.routing import Cells

# What a client's request carries on to a cell, and what of a cell's answer goes back (not the hop-by-hop headers,
# nor what aiohttp sets for the answer it writes).
REQUEST_HEADERS = (
    "Authorization",
    "Idempotency-Key",
    "traceparent",
    "tracestate",
    "Last-Event-ID",
    "Content-Type",
    "Accept",
)
_NOT_PASSED_BACK = frozenset(
    h.lower()
    for h in ("Connection", "Keep-Alive", "Transfer-Encoding", "Content-Length", "Content-Encoding", "Server", "Date")
)
CELL_HEADER = "X-Rackscale-Cell"  # on every answer a cell gave: which one
MISSING_HEADER = "X-Rackscale-Cells-Missing"  # on a list or merged stream without these cells (comma-separated)
CONNECT_S = 3.0  # a cell that takes longer to accept a connection counts as unreachable
REQUEST_S = 30.0  # a whole answer (not a stream) takes at most this long


class CellUnavailable(Exception):
    """A cell's gateway could not be reached, or broke off. `sent`: the request may have reached it (a submit then
    may have been accepted: not offered to another cell)."""

    def __init__(self, cell: str, reason: str, *, sent: bool) -> None:
        super().__init__(f"cell {cell} is unavailable: {reason}")
        self.cell, self.reason, self.sent = cell, reason, sent


@dataclass(frozen=True, slots=True)
class Answer:
    """A cell's whole answer."""

    cell: str
    status: int
    headers: CIMultiDict[str]  # what passes back to the client, CELL_HEADER included
    body: bytes


def passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers a cell gets."""
    return {h: headers[h] for h in REQUEST_HEADERS if h in headers}


def passed_back(headers: CIMultiDictProxy[str], cell: str) -> CIMultiDict[str]:
    out = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _NOT_PASSED_BACK)
    out[CELL_HEADER] = cell
    return out


def _reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError | asyncio.TimeoutError):
        return "no answer in time"
    if isinstance(e, aiohttp.ClientConnectorError):
        return f"connection failed ({e.os_error.strerror or e.os_error})"
    return str(e) or type(e).__name__


class Upstream:
    """Requests to the cells' gateways. `open` gives the response to read (a stream), `call` the whole answer."""

    def __init__(self, cells: Cells, *, connect_s: float = CONNECT_S, request_s: float = REQUEST_S) -> None:
        self.cells = cells
        self.connect_s, self.request_s = connect_s, request_s
        self._session: aiohttp.ClientSession | None = None
        self._streams: set[aiohttp.ClientResponse] = set()

    async def start(self) -> None:
        # no pool limit: every followed log and event stream holds a connection for as long as it lasts
        connector = aiohttp.TCPConnector(limit=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        self.close_streams()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def close_streams(self) -> None:
        """End every stream being read from a cell (the router stops: the clients' streams end, they reconnect)."""
        for resp in list(self._streams):
            resp.close()

    def url(self, cell: str, path: str, query: Iterable[tuple[str, str]] = ()) -> URL:
        qs = urlencode(list(query), quote_via=quote)
        return URL(self.cells.url(cell) + path + (f"?{qs}" if qs else ""), encoded=True)

    async def open(
        self,
        cell: str,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        stream: bool = False,
        within_s: float | None = None,
    ) -> aiohttp.ClientResponse:
        """The cell's response, its headers read (the caller reads the body, then `done`). CellUnavailable when the
        cell can't be reached (`sent` False: nothing reached it) or breaks off. A stream has no time limit; another
        answer `within_s` (default request_s)."""
        assert self._session is not None, "Upstream.start() first"
        total = None if stream else within_s or self.request_s
        timeout = aiohttp.ClientTimeout(total=total, sock_connect=self.connect_s, connect=self.connect_s)
        try:
            resp = await self._session.request(
                method,
                self.url(cell, path, query),
                headers=dict(headers or {}),
                data=body,
                allow_redirects=False,  # a redirect is the client's to follow (through the router)
                timeout=timeout,
            )
        except aiohttp.ClientConnectorError as e:
            raise CellUnavailable(cell, _reason(e), sent=False) from None
        except (aiohttp.ClientError, TimeoutError) as e:
            raise CellUnavailable(cell, _reason(e), sent=True) from None
        self._streams.add(resp)
        return resp

    def done(self, resp: aiohttp.ClientResponse) -> None:
        self._streams.discard(resp)
        resp.close()

    async def call(
        self,
        cell: str,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        within_s: float | None = None,
    ) -> Answer:
        """The cell's whole answer."""
        resp = await self.open(cell, method, path, query=query, headers=headers, body=body, within_s=within_s)
        try:
            data = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise CellUnavailable(cell, _reason(e), sent=True) from None
        finally:
            self.done(resp)
        return Answer(cell, resp.status, passed_back(resp.headers, cell), data)

    async def call_all(
        self,
        cells: Iterable[str],
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        headers: Mapping[str, str] | None = None,
        within_s: float | None = None,
    ) -> dict[str, Answer | CellUnavailable]:
        """The same request to each cell at once: each one's answer, or why there is none."""
        names = list(cells)
        q = list(query)
        calls = (self.call(c, method, path, query=q, headers=headers, within_s=within_s) for c in names)
        got = await asyncio.gather(*calls, return_exceptions=True)
        out: dict[str, Answer | CellUnavailable] = {}
        for cell, result in zip(names, got, strict=True):
            if isinstance(result, Answer | CellUnavailable):
                out[cell] = result
            elif isinstance(result, BaseException):
                raise result
        return out
