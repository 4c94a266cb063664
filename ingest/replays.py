"""Replays: events delivered a second time, told apart from events that conflict.

A producer that resends a message the broker had already appended (its acknowledgement was
lost; a spool resends a batch after an outage) puts the same events on the topic twice, at
new offsets, so offsets in the Delta log cannot tell. The events can: a replay repeats a
stored event (or one earlier in the batch) whole, its trajectory, seq, event id and every
field alike. Such rows are dropped and counted; a repeated seq with another event id or other
content is a conflict, and validation still sends it to dead letters.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.events import EVENTS_SCHEMA
from trajlake.schemas.validation import repeated_seqs
from trajlake.store.lake import Lake
from trajlake.store.reads import placeholders

WIRE_COLUMNS = tuple(EVENTS_SCHEMA.names)
"""What a replay must repeat: every field an event carries (the lake's token summary is derived)."""


def drop_replays(
    batch: pa.Table, known: Mapping[str, Mapping[int, str]], lake: Lake
) -> tuple[pa.Table, np.ndarray | None, int]:
    """`batch` without the rows that repeat an event whole, the indices in `batch` of the rows kept
    (None: all), and how many were dropped.

    Args:
        batch: decoded events, in arrival order.
        known: per trajectory, the stored events' seqs -> event ids (`SeqCache.known`).
        lake: where the stored events are read back, to compare their content.
    """
    replays = _run_event_replays(batch, lake)
    candidates = repeated_seqs(batch, known)
    if candidates.size:
        replays += _trajectory_event_replays(batch, known, lake, candidates)
    if not replays:
        return batch, None, 0
    keep = np.ones(batch.num_rows, dtype=bool)
    keep[replays] = False
    return batch.filter(pa.array(keep)), np.flatnonzero(keep), len(replays)


def _trajectory_event_replays(
    batch: pa.Table, known: Mapping[str, Mapping[int, str]], lake: Lake, candidates: np.ndarray
) -> list[int]:
    """The rows among `candidates` (repeated trajectory seqs) that repeat a stored or earlier event whole."""
    tids = batch.column("trajectory_id").to_pylist()
    seqs = batch.column("seq").to_pylist()
    ids = batch.column("event_id").to_pylist()
    first: dict[tuple[str, int], int] = {}
    for i in range(batch.num_rows):
        if tids[i] is not None and seqs[i] is not None:
            first.setdefault((tids[i], seqs[i]), i)
    earlier, stored_ids = {}, {}
    for i in candidates.tolist():
        key = (tids[i], seqs[i])
        if known.get(tids[i], {}).get(seqs[i]) == ids[i]:
            stored_ids[i] = ids[i]
        elif first[key] != i and ids[first[key]] == ids[i]:
            earlier[i] = first[key]
    stored = _stored_rows(
        lake, sorted(set(stored_ids.values())), among=("trajectory_id", sorted({tids[i] for i in stored_ids}))
    )
    rows = batch.select(list(WIRE_COLUMNS))
    replays = [i for i, j in earlier.items() if _row(rows, i) == _row(rows, j)]
    return replays + [i for i, event_id in stored_ids.items() if stored.get(event_id) == _row(rows, i)]


def _run_event_replays(batch: pa.Table, lake: Lake) -> list[int]:
    """The rows of run-level events (no trajectory, no seq: a policy update) that repeat a stored
    or earlier event of the same id whole. They are few (one per policy version), so each batch
    holding some looks their ids up in the lake."""
    mask = pc.and_(pc.is_null(batch.column("trajectory_id")), pc.is_valid(batch.column("event_id")))
    rows = np.flatnonzero(np.asarray(mask))
    if not rows.size:
        return []
    ids = dict(zip(rows.tolist(), batch.column("event_id").take(pa.array(rows)).to_pylist(), strict=True))
    wire = batch.select(list(WIRE_COLUMNS))
    first: dict[str, int] = {}
    for i, event_id in ids.items():
        first.setdefault(event_id, i)
    wanted = sorted(first)
    stored = _stored_rows(lake, wanted, among=("event_id", wanted), where="trajectory_id is null")
    replays = [
        i
        for i, event_id in ids.items()
        if first[event_id] != i and _row(wire, i) == _row(wire, first[event_id])
    ]
    return replays + [i for event_id, i in first.items() if stored.get(event_id) == _row(wire, i)]


def _stored_rows(
    lake: Lake, event_ids: list[str], among: tuple[str, list[str]], where: str = "true"
) -> dict[str, dict]:
    """The stored events `event_ids`, as rows of their wire columns, by event id; read from the
    files whose statistics may hold the `among` values (their trajectories, or the ids themselves)."""
    if not event_ids or not lake.exists("events"):
        return {}
    found = lake.read(
        "events",
        list(WIRE_COLUMNS),
        f"event_id in ({placeholders(len(event_ids))}) and {where}",
        event_ids,
        among=among,
    )
    return {row["event_id"]: row for row in found.to_pylist()}


def _row(rows: pa.Table, i: int) -> dict:
    return rows.slice(i, 1).to_pylist()[0]
