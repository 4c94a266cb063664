"""Event types, Arrow schemas and validation. Imports pyarrow and numpy only."""

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
