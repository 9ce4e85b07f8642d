"""What a job file's reader says is wrong, and where: the line of the file, or the command line."""

from __future__ import annotations

COMMAND_LINE = 0  # the `line` of an option given on the command line (overriding the file's)


def where(line: int | None) -> str:
    """The prefix of a message about `line`: `line 7: `, `command line: `, or nothing for the file as a whole."""
    if line is None:
        return ""
    return "command line: " if line == COMMAND_LINE else f"line {line}: "


class JobFileError(ValueError):
    """A job file (or an option given with it) that can't become a job. `line`: the file's line (1-based),
    COMMAND_LINE, or None for the file as a whole; `field`: the body field concerned, when one is."""

    def __init__(self, message: str, line: int | None = None, field: str | None = None) -> None:
        super().__init__(where(line) + message)
        self.message, self.line, self.field = message, line, field
