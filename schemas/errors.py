"""The root of trajlake's errors, and the errors raised while building or checking events."""

from __future__ import annotations


class TrajlakeError(Exception):
    """A failure whose message names what went wrong and the fix; the CLI prints it without a traceback
    and exits 2. Each stage's errors derive from it (with the builtin they always were, for callers
    that catch that)."""


class CliError(TrajlakeError):
    """A command's input or situation the user must fix (a missing run, a bad query): printed to
    stderr without a traceback, exit code 2."""


class EventError(TrajlakeError, ValueError):
    """An event that breaks the event model; the message names the field, the value and the fix."""

    def __init__(self, reason: str, *, field: str | None = None, index: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
        self.index = index
