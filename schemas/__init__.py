"""Event types, Arrow schemas and validation (pyarrow and numpy), and the settings models (pydantic only).

The event names load on first use, so `trajlake.schemas.settings` (imported by every command's
argument parser) pulls in no pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.schemas.convert import conform, events_to_table, table_to_events, try_events_to_table
    from trajlake.schemas.errors import EventError
    from trajlake.schemas.events import (
        EVENT_TYPES,
        EVENTS_SCHEMA,
        FAILURE_LABELS,
        FAILURE_ORIGINS,
        SCHEMA_VERSION,
        STATUSES,
        make_event,
        new_event_id,
    )
    from trajlake.schemas.tables import TABLE_SCHEMAS
    from trajlake.schemas.validation import ValidationResult, validate

_HOME = {
    "conform": "convert", "events_to_table": "convert", "table_to_events": "convert",
    "try_events_to_table": "convert", "EventError": "errors", "EVENT_TYPES": "events",
    "EVENTS_SCHEMA": "events", "FAILURE_LABELS": "events", "FAILURE_ORIGINS": "events",
    "SCHEMA_VERSION": "events", "STATUSES": "events", "make_event": "events", "new_event_id": "events",
    "TABLE_SCHEMAS": "tables", "ValidationResult": "validation", "validate": "validation",
}  # fmt: skip

__all__ = [
    "EVENTS_SCHEMA", "EVENT_TYPES", "FAILURE_LABELS", "FAILURE_ORIGINS", "SCHEMA_VERSION", "STATUSES",
    "TABLE_SCHEMAS", "EventError", "ValidationResult", "conform", "events_to_table", "make_event",
    "new_event_id", "table_to_events", "try_events_to_table", "validate",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trajlake.schemas' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trajlake.schemas.{_HOME[name]}"), name)
