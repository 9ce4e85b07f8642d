"""A small HTTP/1.1 client on asyncio streams, for `AsyncClient`: one request per connection (`Connection: close`),
answers framed by Content-Length, chunked transfer coding or the connection's close. That is all the gateway
speaks, and it keeps the client free of dependencies while a stream (events, a followed log) stays a plain
coroutine: cancelling it closes its socket at once, where a thread blocked in a read could not be stopped."""

from __future__ import annotations

import asyncio
import ssl

from rackscale._protocol import Endpoint, Request

LINE_MAX = 1 << 20  # the longest line read: a status line, a header, a chunk size; a body line of a stream
READ_SIZE = 1 << 16


class ProtocolError(ConnectionError):
    """The server's answer isn't HTTP/1.1 as this client reads it."""


class Answer:
    """One request's open answer: status and headers read, the body read on demand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}  # lower-case names
        self._chunked = False
        self._left: int | None = None  # bytes of the body (Content-Length) or of the chunk still to come
        self._done = False
        self._buffer = b""

    @classmethod
    async def open(cls, endpoint: Endpoint, request: Request) -> Answer:
        context = ssl.create_default_context() if endpoint.scheme == "https" else None
        reader, writer = await asyncio.open_connection(
            endpoint.host,
            endpoint.port,
            ssl=context,
            server_hostname=endpoint.host if context else None,
            limit=LINE_MAX,
        )
        answer = cls(reader, writer)
        try:
            writer.write(_head(endpoint, request) + (request.body or b""))
            await writer.drain()
            await answer._read_head(request.method)
        except BaseException:
            answer.close()
            raise
        return answer

    async def _read_head(self, method: str) -> None:
        while True:
            version, _, rest = (await self._line()).decode("latin-1").partition(" ")
            status, _, reason = rest.partition(" ")
            if not version.startswith("HTTP/1.") or not status.isdigit():
                raise ProtocolError(f"not an HTTP/1.x status line: {version} {rest}")
            self.status, self.reason = int(status), reason
            headers: dict[str, str] = {}
            while line := await self._line():
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            if self.status >= 200:
                break  # 1xx interim answers (100 Continue) come before the real one
        self.headers = headers
        coding = headers.get("transfer-encoding", "").lower()
        if method == "HEAD" or self.status in (204, 304):
            self._done = True
        elif "chunked" in coding:
            self._chunked = True
        elif "content-length" in headers:
            self._left = int(headers["content-length"])
            self._done = self._left == 0

    async def _line(self) -> bytes:
        """One CRLF-terminated line of the head or the chunk framing, without its line break."""
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as e:
            raise ProtocolError("the connection closed in the middle of the answer's framing") from e
        except asyncio.LimitOverrunError as e:
            raise ProtocolError("a line of the answer's framing is too long") from e
        return line.rstrip(b"\r\n")

    async def _some(self) -> bytes:
        """The next piece of the body; b"" once it has all come."""
        if self._done:
            return b""
        if self._chunked:
            if not self._left:
                size = int((await self._line()).split(b";", 1)[0], 16)
                if size == 0:
                    while await self._line():  # trailers, up to the blank line
                        pass
                    self._done = True
                    return b""
                self._left = size
            data = await self._reader.read(min(self._left, READ_SIZE))
            if not data:
                raise ProtocolError("the connection closed in the middle of a chunk")
            self._left -= len(data)
            if self._left == 0 and await self._reader.readexactly(2) != b"\r\n":
                raise ProtocolError("a chunk did not end with CRLF")
            return data
        if self._left is not None:
            data = await self._reader.read(min(self._left, READ_SIZE))
            if not data:
                raise ProtocolError(f"the connection closed with {self._left} bytes of the body still to come")
            self._left -= len(data)
            self._done = self._left == 0
            return data
        data = await self._reader.read(READ_SIZE)  # framed by the close
        self._done = not data
        return data

    async def read(self) -> bytes:
        """The whole body (after what readline has taken)."""
        parts = [self._buffer]
        self._buffer = b""
        while data := await self._some():
            parts.append(data)
        return b"".join(parts)

    async def readline(self) -> bytes:
        """The body's next line with its newline (the last may lack one); b"" at the end of the body."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line, self._buffer = self._buffer[: end + 1], self._buffer[end + 1 :]
                return line
            if len(self._buffer) > LINE_MAX:
                raise ProtocolError("a line of the body is too long")
            data = await self._some()
            if not data:
                line, self._buffer = self._buffer, b""
                return line
            self._buffer += data

    def close(self) -> None:
        self._writer.close()

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def _head(endpoint: Endpoint, request: Request) -> bytes:
    lines = [f"{request.method} {request.target} HTTP/1.1", f"Host: {endpoint.netloc}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in request.headers.items()]
    if request.body is not None or request.method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(request.body or b'')}")
    for line in lines:
        if "\r" in line or "\n" in line:
            raise ValueError(f"a line break in a request header: {line!r}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
