"""The event model's derived forms: the Arrow schema of `events`, required fields, new events.

The model itself (event types, one declaration per field) is `fields.py`. Every event is a
flat mapping. The envelope fields are shared by all types; each type adds its own fields,
and everything a type does not use is null in the `events` table. Token payloads
(`input_token_ids`, `output_token_ids`, `output_logprobs`, `loss_mask`) are stored once,
here; projections reference them rather than copying them.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from typing import Any

import pyarrow as pa

from trajlake.schemas.fields import (
    BATCH_CONSUMED,
    EVENT_TYPES,
    FAILURE_LABELS,
    FAILURE_ORIGINS,
    FIELDS,
    POLICY_UPDATED,
    REWARD,
    STATUSES,
    TOOL_CALL,
    TOOL_RESULT,
    TRAJECTORY_EVENT_TYPES,
    TRAJECTORY_FINISHED,
    TRAJECTORY_STARTED,
    TURN,
    body_fields_of,
)

__all__ = [
    "BATCH_CONSUMED",
    "EVENTS_SCHEMA",
    "EVENT_FIELDS",
    "EVENT_TYPES",
    "FAILURE_LABELS",
    "FAILURE_ORIGINS",
    "JSON_FIELDS",
    "POLICY_UPDATED",
    "REQUIRED_FIELDS",
    "REWARD",
    "SCHEMA_VERSION",
    "STATUSES",
    "TOKEN_FIELDS",
    "TOOL_CALL",
    "TOOL_RESULT",
    "TRAJECTORY_EVENT_TYPES",
    "TRAJECTORY_FINISHED",
    "TRAJECTORY_STARTED",
    "TURN",
    "body_fields_of",
    "make_event",
    "new_event_id",
    "utc_now",
]

SCHEMA_VERSION = 1
"""The schema version producers write today."""

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

# Everything below is derived from the declaration in fields.py ---------------------------
EVENTS_SCHEMA = pa.schema([pa.field(f.name, f.type, nullable=f.nullable) for f in FIELDS])
"""Arrow schema of the `events` table and of the Arrow IPC wire format."""

EVENT_FIELDS = {f.name: f for f in EVENTS_SCHEMA}

JSON_FIELDS = frozenset(f.name for f in FIELDS if f.json)
"""Fields stored as JSON text; producers may hand over dicts and lists."""

TOKEN_FIELDS = tuple(f.name for f in FIELDS if f.tokens)

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    event_type: tuple(f.name for f in FIELDS if f.nullable and event_type in f.required_by)
    for event_type in EVENT_TYPES
}
"""Fields (besides the envelope) that each type must carry, non-null."""

NON_NULL_FIELDS = tuple(f.name for f in FIELDS if not f.nullable)
"""Envelope fields no event may leave null."""

ENUM_FIELDS = {f.name: f.allowed for f in FIELDS if f.allowed}
"""Fields restricted to a set of values, with those values."""


_rand = random.Random(int.from_bytes(os.urandom(16), "big"))


def _reseed() -> None:
    """A forked child must not repeat its parent's random stream."""
    _rand.seed(int.from_bytes(os.urandom(16), "big"))


os.register_at_fork(after_in_child=_reseed)


def new_event_id() -> str:
    """A UUIDv7 string: unique, and sortable by creation time."""
    ms = time.time_ns() // 1_000_000
    value = (
        (ms & 0xFFFFFFFFFFFF) << 80
        | 0x7 << 76
        | _rand.getrandbits(12) << 64
        | 0b10 << 62
        | _rand.getrandbits(62)
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC (the type of `event_time`)."""
    return dt.datetime.now(dt.UTC)


def make_event(event_type: str, run_id: str, **fields: Any) -> dict[str, Any]:
    """Build an event dict with a fresh envelope; unknown field names raise `TypeError`."""
    unknown = set(fields) - set(EVENT_FIELDS)
    if unknown:
        raise TypeError(f"unknown event field(s) {sorted(unknown)}; known fields: {sorted(EVENT_FIELDS)}")
    event: dict[str, Any] = {
        "event_id": new_event_id(),
        "event_type": event_type,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "event_time": utc_now(),
    }
    event.update(fields)
    return event
