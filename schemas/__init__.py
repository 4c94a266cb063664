"""Event types, Arrow schemas and validation. Imports pyarrow and numpy only, and only on first use:
`trajlake.schemas.errors` (and settings) load without them, so `trajlake --help` stays instant."""

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

__all__ = [
    "EVENTS_SCHEMA",
    "EVENT_TYPES",
    "FAILURE_LABELS",
    "FAILURE_ORIGINS",
    "SCHEMA_VERSION",
    "STATUSES",
    "TABLE_SCHEMAS",
    "EventError",
    "ValidationResult",
    "conform",
    "events_to_table",
    "make_event",
    "new_event_id",
    "table_to_events",
    "try_events_to_table",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'trajlake.schemas' has no attribute {name!r}")
    for module in ("convert", "errors", "events", "tables", "validation"):
        found = getattr(importlib.import_module(f"trajlake.schemas.{module}"), name, None)
        if found is not None:
            return found
    raise AttributeError(name)
