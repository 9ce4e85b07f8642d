"""Server-sent events (the WHATWG `text/event-stream` format), both ways. Pure: values in, bytes out; lines in,
events out. The gateway writes /v1/events and followed logs with `frame`; clients (the CLI) read them with
`Reader`, which keeps the last event id a reconnect sends as `Last-Event-ID`."""

from __future__ import annotations

from dataclasses import dataclass, field

MEDIA_TYPE = "text/event-stream"
CONNECTED = b": connected\n\n"  # a comment: the stream is live (a client may start what it waits to hear)
KEEP_ALIVE = b": keep-alive\n\n"  # a comment: keeps idle proxies from closing the stream


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str
    id: str | None = None


def frame(event: str, data: bytes, id: int | str | None = None) -> bytes:
    """One event. `data` must hold no line break (JSON does not): it is one `data:` line."""
    head = b"" if id is None else b"id: " + str(id).encode() + b"\n"
    return head + b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


@dataclass(slots=True)
class Reader:
    """Lines of a stream (as read, with or without their line break) in, whole events out."""

    last_id: str | None = None  # the last id the stream set (sticky, as the spec has it)
    _event: str = ""
    _data: list[str] = field(default_factory=list)

    def feed(self, line: str) -> Event | None:
        """The event this line completes (a blank line ends one that carries data), else None."""
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                self._event = ""
                return None
            ev = Event(self._event or "message", "\n".join(self._data), self.last_id)
            self._event, self._data = "", []
            return ev
        if line.startswith(":"):
            return None  # a comment
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id = value
        return None
