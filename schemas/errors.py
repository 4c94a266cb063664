"""Errors raised while building or checking events."""

from __future__ import annotations


class EventError(ValueError):
    """An event that breaks the event model; the message names the field, the value and the fix."""

    def __init__(self, reason: str, *, field: str | None = None, index: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field
        self.index = index
