"""Read the token payloads (ids, logprobs, loss mask) of chosen trajectories from the lake.

Two readers return the same arrays. `read_from_events` reads the `turn` rows of the
chosen trajectories straight from `events` (the only place tokens are stored) and
assembles each sequence with numpy slices; `read_from_view` asks the `trajectories` SQL
view, which assembles the same lists in DuckDB. bench/sampler.py measures both.

A sequence is every turn's appended input followed by its output, in `seq` order; input
tokens get logprob 0 and mask False; a turn without a stored mask trains on all its
output. A turn whose input broke the prefix invariant stored its full input: the
sequence restarts there (as the `trajectories` view does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.store.sql import placeholders

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

TokenArrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(token_ids int32, logprobs float32, loss_mask bool), aligned element for element."""

TURN_COLUMNS = (
    "trajectory_id",
    "seq",
    "input_token_ids",
    "input_is_full",
    "output_token_ids",
    "output_logprobs",
    "loss_mask",
)


def _flat(column: pa.ChunkedArray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Flattened values and per-row start offsets of a list column (null lists are empty)."""
    array = column.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(array).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    return values, starts


def read_from_events(lake: Lake, run_id: str, trajectory_ids: Sequence[str]) -> dict[str, TokenArrays]:
    """Token arrays of each trajectory, assembled from its `turn` events."""
    if not trajectory_ids:
        return {}
    # only the files and row groups whose statistics may hold an id in the batch's range:
    # time-ordered ids put a batch in a few of a long run's files, and in a few of their row groups
    among = ("trajectory_id", trajectory_ids)
    return assemble(
        lake.read("events", TURN_COLUMNS, "event_type = 'turn' and run_id = ?", [run_id], among=among)
    )


def sequence_start(input_is_full: np.ndarray) -> int:
    """Which of a trajectory's turns (in `seq` order) its sequence starts at: the last that stored its
    full input (TITO drift restarts the sequence there), else the first."""
    restarts = np.flatnonzero(input_is_full)
    return int(restarts[-1]) if len(restarts) else 0


def assemble(turns: pa.Table) -> dict[str, TokenArrays]:
    """Assemble sequences from `turn` rows (any order) with numpy slices."""
    if turns.num_rows == 0:
        return {}
    turns = turns.take(pc.sort_indices(turns, [("trajectory_id", "ascending"), ("seq", "ascending")]))
    tids = turns.column("trajectory_id").to_pylist()
    full = pc.fill_null(turns.column("input_is_full"), False).to_numpy(zero_copy_only=False)
    in_ids, in_at = _flat(turns.column("input_token_ids"), np.int32)
    out_ids, out_at = _flat(turns.column("output_token_ids"), np.int32)
    out_lps, lp_at = _flat(turns.column("output_logprobs"), np.float32)
    masks, mask_at = _flat(turns.column("loss_mask"), np.bool_)
    result: dict[str, TokenArrays] = {}
    start = 0
    n = len(tids)
    while start < n:
        end = start
        while end < n and tids[end] == tids[start]:
            end += 1
        first = start + sequence_start(full[start:end])
        ids_parts, lp_parts, mask_parts = [], [], []
        for i in range(first, end):
            inp = in_ids[in_at[i] : in_at[i + 1]]
            out = out_ids[out_at[i] : out_at[i + 1]]
            n_mask = mask_at[i + 1] - mask_at[i]
            ids_parts += [inp, out]
            lp_parts += [np.zeros(len(inp), np.float32), out_lps[lp_at[i] : lp_at[i + 1]]]
            out_mask = (
                masks[mask_at[i] : mask_at[i + 1]] if n_mask == len(out) else np.ones(len(out), np.bool_)
            )
            mask_parts += [np.zeros(len(inp), np.bool_), out_mask]
        result[tids[start]] = (
            np.concatenate(ids_parts),
            np.concatenate(lp_parts),
            np.concatenate(mask_parts),
        )
        start = end
    return result


def read_from_view(lake: Lake, run_id: str, trajectory_ids: Sequence[str]) -> dict[str, TokenArrays]:
    """Token arrays of each trajectory from the `trajectories` SQL view."""
    if not trajectory_ids:
        return {}
    query = (
        "select trajectory_id, token_ids, logprobs, loss_mask from trajectories "
        f"where run_id = ? and trajectory_id in ({placeholders(len(trajectory_ids))})"
    )
    table = lake.sql(query, [run_id, *trajectory_ids])
    tids = table.column("trajectory_id").to_pylist()
    ids, at = _flat(table.column("token_ids"), np.int32)
    lps, _ = _flat(table.column("logprobs"), np.float32)
    masks, _ = _flat(table.column("loss_mask"), np.bool_)
    return {
        tid: (ids[at[i] : at[i + 1]], lps[at[i] : at[i + 1]], masks[at[i] : at[i + 1]])
        for i, tid in enumerate(tids)
    }


def read_tokens(
    lake: Lake, run_id: str, trajectory_ids: Sequence[str], reader: str = "events"
) -> dict[str, TokenArrays]:
    """Token arrays by reader name: `events` (direct) or `view` (the SQL view)."""
    if reader == "events":
        return read_from_events(lake, run_id, trajectory_ids)
    if reader == "view":
        return read_from_view(lake, run_id, trajectory_ids)
    raise ValueError(f"unknown token reader {reader!r}; choose 'events' or 'view'")
