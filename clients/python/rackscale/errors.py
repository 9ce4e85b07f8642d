"""What the client raises when the gateway says no."""

from __future__ import annotations

import json


class ApiError(Exception):
    """The gateway answered 4xx or 5xx. `message` and `field` are its ErrorBody's (`field`: the dotted path of the
    input it refused, e.g. "topology.segment", when there is one); `retry_after` the seconds a 503 asks to wait.

    Network failures are not ApiErrors: they raise what the standard library raises (ConnectionError, TimeoutError,
    other OSErrors)."""

    def __init__(self, status: int, message: str, field: str | None = None, retry_after: float | None = None) -> None:
        self.status = status
        self.message = message
        self.field = field
        self.retry_after = retry_after
        where = f" (field {field})" if field else ""
        super().__init__(f"HTTP {status}: {message}{where}")

    @classmethod
    def from_answer(cls, status: int, body: bytes, reason: str = "", retry_after: float | None = None) -> ApiError:
        """The error for an error answer, whatever its body (a proxy in between may answer with HTML)."""
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            field = doc.get("field")
            return cls(status, doc["error"], field if isinstance(field, str) else None, retry_after)
        text = body.decode("utf-8", "replace").strip()[:200] or reason or "no details"
        return cls(status, text, None, retry_after)
