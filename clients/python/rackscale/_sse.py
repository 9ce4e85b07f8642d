"""Server-sent events (the WHATWG `text/event-stream` format), read a line at a time. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

MEDIA_TYPE = "text/event-stream"


@dataclass(frozen=True, slots=True)
class Event:
    event: str
    data: str
    id: str | None = None  # the stream's last id as of this event (what a reconnect sends as Last-Event-ID)
    own_id: bool = False  # this event set it


@dataclass(slots=True)
class Reader:
    """Lines in (with or without their line break), whole events out."""

    last_id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _own_id: bool = False

    def feed(self, line: str) -> Event | None:
        """The event this line completes (a blank line ends one that carries data), else None."""
        line = line.rstrip("\r\n")
        if not line:
            ev = None
            if self._data:
                ev = Event(self._event or "message", "\n".join(self._data), self.last_id, self._own_id)
            self._event, self._data, self._own_id = "", [], False
            return ev
        if line.startswith(":"):
            return None  # a comment (`: connected`, `: keep-alive`)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self.last_id, self._own_id = value, True
        return None
