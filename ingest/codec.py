"""Wire codec: events <-> message bytes, as Arrow IPC streams or JSON.

A message value is either an Arrow IPC stream (header `content-type:
application/vnd.apache.arrow.stream`) holding events in `EVENTS_SCHEMA` (a subset of its
columns is accepted), or JSON (`application/json`): one event object or an array of them,
so producers in any language can write. See docs/wire-format.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from trajlake.schemas import EventError, conform, events_to_table, try_events_to_table
from trajlake.schemas.errors import TrajlakeError

ARROW_CONTENT_TYPE = "application/vnd.apache.arrow.stream"
JSON_CONTENT_TYPE = "application/json"
CONTENT_TYPE_HEADER = "content-type"


class DecodeError(TrajlakeError, ValueError):
    """A message whose bytes cannot be read as events; it goes to dead letters with this reason."""


def encode_arrow(events: Sequence[Mapping[str, Any]] | pa.Table) -> bytes:
    """Arrow IPC stream bytes for `events` (dicts or a table in `EVENTS_SCHEMA`)."""
    table = events if isinstance(events, pa.Table) else events_to_table(events)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_json(events: Sequence[Mapping[str, Any]]) -> bytes:
    """JSON array bytes for event dicts (datetimes as ISO-8601)."""
    return json.dumps(list(events), default=_json_default, separators=(",", ":")).encode()


def _json_default(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def content_type_of(headers: Mapping[str, str]) -> str:
    """The message's content type; Arrow when the header is absent."""
    return headers.get(CONTENT_TYPE_HEADER, ARROW_CONTENT_TYPE).split(";")[0].strip().lower()


def decode(value: bytes, headers: Mapping[str, str]) -> tuple[pa.Table, list[tuple[Any, str]]]:
    """Decode a message into an events table plus (raw event, reason) for events that can't be stored.

    Raises `DecodeError` when the message as a whole is unreadable. A sink decoding many
    messages uses one `Decoder`, which reads each distinct Arrow schema once.
    """
    return Decoder().decode(value, headers)


class Decoder:
    """Decodes messages, remembering the Arrow schemas it has read.

    Every message of a producer repeats the same wide schema; parsing it costs more than
    reading the message's rows, so each distinct schema is parsed (and checked against the
    events schema) once and later messages only read their record batches.
    """

    def __init__(self, max_schemas: int = 1024) -> None:
        self._schemas: dict[bytes, pa.Schema] = {}
        self._max_schemas = max_schemas

    def decode(self, value: bytes, headers: Mapping[str, str]) -> tuple[pa.Table, list[tuple[Any, str]]]:
        """As `decode` above."""
        content_type = content_type_of(headers)
        if content_type == ARROW_CONTENT_TYPE:
            return self._decode_arrow(value), []
        if content_type == JSON_CONTENT_TYPE:
            return _decode_json(value)
        raise DecodeError(
            f"content-type {content_type!r} is not supported; send {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
        )

    def _decode_arrow(self, value: bytes) -> pa.Table:
        try:
            table = self._read_stream(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, EOFError) as err:
            raise DecodeError(f"not a readable Arrow IPC stream ({len(value)} bytes): {err}") from None
        try:
            return conform(table)
        except EventError as err:
            raise DecodeError(f"Arrow stream does not match the events schema: {err.reason}") from None

    def _read_stream(self, value: bytes) -> pa.Table:
        source = pa.BufferReader(value)
        first = pa.ipc.read_message(source)
        if first.type != "schema":
            raise pa.ArrowInvalid(f"the stream starts with a {first.type} message, not a schema")
        key = first.metadata.to_pybytes()
        schema = self._schemas.get(key)
        if schema is None:
            schema = pa.ipc.read_schema(first)
            if len(self._schemas) < self._max_schemas:
                self._schemas[key] = schema
        batches = []
        while True:
            try:
                message = pa.ipc.read_message(source)
            except EOFError:  # the end-of-stream marker
                break
            if message.type != "record batch":  # dictionary batches: let the full reader handle them
                with pa.ipc.open_stream(pa.py_buffer(value)) as reader:
                    return reader.read_all()
            batches.append(pa.ipc.read_record_batch(message, schema))
        return pa.Table.from_batches(batches, schema)


def _decode_json(value: bytes) -> tuple[pa.Table, list[tuple[Any, str]]]:
    try:
        parsed = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DecodeError(f"not valid JSON ({len(value)} bytes): {err}") from None
    items = parsed if isinstance(parsed, list) else [parsed]
    events: list[Mapping[str, Any]] = []
    bad: list[tuple[Any, str]] = []
    for item in items:
        if isinstance(item, dict):
            events.append(item)
        else:
            bad.append(
                (
                    item,
                    f"JSON value of type {type(item).__name__} is not an event object; send an object or an array of objects",
                )
            )
    table, rejects = try_events_to_table(events)
    bad.extend((events[i], reason) for i, reason in rejects)
    return table, bad
