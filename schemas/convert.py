"""Convert between event dicts (what producers build) and Arrow tables in `EVENTS_SCHEMA`."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from trajlake.schemas.errors import EventError
from trajlake.schemas.events import EVENT_FIELDS, EVENTS_SCHEMA, JSON_FIELDS


def _coerce_time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    raise EventError(
        f"event_time={value!r} is not a time; send an ISO-8601 string or epoch seconds",
        field="event_time",
    )


def normalize_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy ready for Arrow: JSON fields as text, `event_time` as aware datetime.

    Raises `EventError` for unknown fields or an unreadable `event_time`.
    """
    unknown = [k for k in event if k not in EVENT_FIELDS]
    if unknown:
        raise EventError(
            f"unknown field(s) {sorted(unknown)}; put free-form data under 'attributes'",
            field=unknown[0],
        )
    row = dict(event)
    for name in JSON_FIELDS:
        value = row.get(name)
        if value is not None and not isinstance(value, str):
            row[name] = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if "event_time" in row and row["event_time"] is not None:
        row["event_time"] = _coerce_time(row["event_time"])
    return row


def events_to_table(events: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Build one Arrow table from event dicts; raises `EventError` naming the first bad event."""
    rows = []
    for index, event in enumerate(events):
        try:
            rows.append(normalize_event(event))
        except EventError as err:
            err.index = index
            raise
    try:
        return _columns_to_table(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
        for index, row in enumerate(rows):  # find the culprit for a precise reason
            _row_to_table(row, index)
        raise


def _columns_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Column-wise construction: much faster than `Table.from_pylist` for wide, sparse rows."""
    n = len(rows)
    present: set[str] = set()
    for row in rows:
        present.update(row)
    arrays = []
    for f in EVENTS_SCHEMA:
        if f.name in present:
            arrays.append(pa.array([row.get(f.name) for row in rows], type=f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=EVENTS_SCHEMA)


def _row_to_table(row: Mapping[str, Any], index: int) -> pa.Table:
    for name, value in row.items():
        try:
            pa.array([value], type=EVENT_FIELDS[name].type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError) as err:
            raise EventError(
                f"{name}={_short(value)} does not fit type {EVENT_FIELDS[name].type}: {err}; "
                f"send a value of that type",
                field=name,
                index=index,
            ) from None
    return pa.Table.from_pylist([row], schema=EVENTS_SCHEMA)


def try_events_to_table(
    events: Sequence[Mapping[str, Any]],
) -> tuple[pa.Table, list[tuple[int, str]]]:
    """Like `events_to_table`, but keep the good events and return (index, reason) for bad ones."""
    try:
        return events_to_table(events), []
    except EventError:
        pass
    good: list[pa.Table] = []
    bad: list[tuple[int, str]] = []
    for index, event in enumerate(events):
        try:
            good.append(_row_to_table(normalize_event(event), index))
        except EventError as err:
            bad.append((index, err.reason))
    table = pa.concat_tables(good) if good else EVENTS_SCHEMA.empty_table()
    return table, bad


def table_to_events(table: pa.Table) -> list[dict[str, Any]]:
    """Event dicts from an `events` table, with null fields dropped."""
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def conform(table: pa.Table) -> pa.Table:
    """Cast a table holding a subset of the events columns to the full `EVENTS_SCHEMA`.

    Missing columns become null; raises `EventError` naming a column of the wrong type.
    """
    if table.schema.equals(EVENTS_SCHEMA):
        return table
    columns = []
    for f in EVENTS_SCHEMA:
        if f.name in table.column_names:
            col = table.column(f.name)
            if not col.type.equals(f.type):
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                    raise EventError(
                        f"column {f.name} has type {col.type}, expected {f.type}: {err}",
                        field=f.name,
                    ) from None
            columns.append(col)
        else:
            columns.append(pa.nulls(table.num_rows, f.type))
    extra = set(table.column_names) - set(EVENT_FIELDS)
    if extra:
        raise EventError(f"unknown column(s) {sorted(extra)}; put free-form data under 'attributes'")
    return pa.Table.from_arrays(columns, schema=EVENTS_SCHEMA)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
