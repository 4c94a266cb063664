"""Dead letters: what the sink could not store, kept whole, with where it came from and why."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pyarrow as pa

from trajlake.ingest import codec
from trajlake.ingest.bus.base import SourcePosition
from trajlake.schemas.tables import DEAD_LETTERS_SCHEMA


def dead_letter(
    pos: SourcePosition | None,
    key: str | None,
    content_type: str,
    raw: bytes,
    reason: str,
    event: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `dead_letters` row; `event` (when the bytes held one) fills the id columns."""
    event = event or {}
    return {
        "dead_letter_id": str(uuid.uuid4()),
        "received_at": dt.datetime.now(dt.UTC),
        "source": str(pos) if pos else "direct",
        "topic": pos.topic if pos else None,
        "partition": pos.partition if pos else None,
        "offset": pos.offset if pos else None,
        "key": key,
        "content_type": content_type,
        "raw": raw,
        "reason": reason,
        "event_id": _str_or_none(event.get("event_id")),
        "event_type": _str_or_none(event.get("event_type")),
        "run_id": _str_or_none(event.get("run_id")),
        "trajectory_id": _str_or_none(event.get("trajectory_id")),
    }


def raw_json(value: Any) -> bytes:
    """The bytes of one rejected JSON element, as it came."""
    return value if isinstance(value, bytes) else json.dumps(value, default=str).encode()


def raw_event(one: pa.Table, content_type: str) -> bytes:
    """One rejected event re-encoded in the wire format it arrived in, readable by `codec.decode`."""
    if content_type == codec.ARROW_CONTENT_TYPE:
        return codec.encode_arrow(one)
    return codec.encode_json([{k: v for k, v in one.to_pylist()[0].items() if v is not None}])


def dead_letters_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a `dead_letters` table."""
    return pa.Table.from_pylist(rows, schema=DEAD_LETTERS_SCHEMA)


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)
