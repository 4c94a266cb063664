"""Token summaries: what the store derives from each event's token lists as it writes `events`.

Projections need of the token payloads only their lengths, their sums and each turn's output
repetition. The lake computes these once, as it writes an event, into the trailing columns
of `events` named by `TOKEN_SUMMARY` (`schemas/tables.py`), so a projector that catches up,
rebuilds or revises a trajectory reads scalar columns alone: on `bench/store_write.py`'s
15.9M tokens, reading the new files' token lists back took 0.21-0.31 s of a 0.7 s catch-up,
and their scalars 0.025 s. A file written before these columns existed reads them as null;
its events are summarized from their token lists when read.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.tables import TOKEN_SUMMARY

SUMMARY_COLUMNS = tuple(TOKEN_SUMMARY.names)

REPETITION_NGRAM = 4
"""`turns.output_repetition` is the share of a turn's output 4-grams that repeat an earlier one."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_BLOCK, _SORT_BLOCK, _BLOCK_ROWS = 1 << 16, 1 << 12, 1 << 20
_UNIQUE = np.uint64(0x7FFFFF << 40)  # the row field of no block's row (at most _BLOCK_ROWS)


def _list_sums(col: pa.ChunkedArray | pa.Array, lengths: np.ndarray, dtype: type) -> np.ndarray:
    """Per-row sum of a list column in `dtype` (0 for null or empty lists), in one pass over the
    values: a running sum of all of them in `dtype` with a copy to prepend its zero took 0.5 s of
    a 0.9 s catch-up on `bench/store_write.py`'s 15.9M tokens, the allocations mostly."""
    values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    sums: np.ndarray = np.zeros(len(lengths), dtype=dtype)
    rows = lengths > 0
    if rows.any():  # reduceat sums from each start to the next: the empty rows' starts are left out
        sums[rows] = np.add.reduceat(values, (np.cumsum(lengths) - lengths)[rows], dtype=dtype)
    return sums


def _row_cuts(ends: np.ndarray, step: int) -> np.ndarray:
    """For lists ending at `ends` (cumulative), the number of lists up to the one holding each
    `step`-th value: cuts into blocks of whole lists of about `step` values."""
    return np.searchsorted(ends, np.arange(step, ends[-1], step)) + 1


def ngram_repetition(col: pa.ChunkedArray | pa.Array, n: int = REPETITION_NGRAM) -> np.ndarray:
    """Per row of a list column, the share of its n-grams that repeat an earlier n-gram of the
    row (0: all distinct; NaN: fewer than `n` values), vectorised.

    Each n-gram is hashed to 40 bits under its row's number, in blocks of whole rows of about
    `_BLOCK` values, and the keys sorted in runs of whole rows of about `_SORT_BLOCK`, small
    enough that each sort stays in cache. Few numpy calls per value leave the GIL free for the
    sink's other summary thread: on `bench/store_write.py`'s 10M output tokens, 0.13 s in one
    thread and 0.10 s (0.16 CPU-s) in two, against 0.20 s and 0.26 s (0.36 CPU-s) with blocks
    of 4,096 values hashed and sorted one at a time. Two distinct n-grams of a row share a hash
    with odds near grams²/2⁴¹ (1 in 20,000 for a 10,000-token turn), which can only lower its
    distinct count by one.
    """
    lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0), dtype=np.int64)
    grams = np.maximum(lengths - n + 1, 0)
    out = np.full(len(lengths), np.nan)
    has = grams > 0
    if not has.any():
        return out
    values = np.asarray(pc.list_flatten(col).to_numpy(zero_copy_only=False))
    ends = np.cumsum(lengths)
    cuts = np.minimum(_row_cuts(ends, _BLOCK), len(lengths))
    bounds = np.unique(np.concatenate([cuts, np.arange(0, len(lengths), _BLOCK_ROWS), [len(lengths)]]))
    repeats = np.zeros(len(lengths), np.int64)
    for r0, r1 in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        local = lengths[r0:r1]
        block = values[ends[r0] - local[0] : ends[r1 - 1]].astype(np.uint64)
        windows = len(block) - n + 1
        if windows <= 0:
            continue
        with np.errstate(over="ignore"):  # hashing: arithmetic modulo 2**64
            h = block[:windows] * _GOLDEN
            for k in range(1, n):
                h += block[k : k + windows]
                h *= _GOLDEN
            h ^= h >> np.uint64(29)
            h *= _MIX
            h >>= np.uint64(24)
        h |= np.repeat(np.arange(r1 - r0, dtype=np.uint64), local)[:windows] << np.uint64(40)
        # a window that runs past its row's end is no n-gram: it gets a key of its own
        row_ends = np.cumsum(local)
        past = row_ends[:, None] - 1 - np.arange(n - 1)
        past = past[(past < windows) & (past >= (row_ends - local)[:, None])]
        h[past] = _UNIQUE | past.astype(np.uint64)
        # each run of whole rows sorted alone: equal keys of a row end up side by side
        runs = np.concatenate([[0], row_ends[_row_cuts(row_ends, _SORT_BLOCK) - 1], [windows]])
        runs = np.unique(np.minimum(runs, windows)).tolist()
        keys = h.view(np.int64)  # keys stay under 2**63, and numpy sorts int64 10% faster
        for a, b in itertools.pairwise(runs):
            keys[a:b].sort()
        repeated = h[1:][h[1:] == h[:-1]] >> np.uint64(40)
        repeats[r0:r1] = np.bincount(repeated.astype(np.int64), minlength=r1 - r0)
    out[has] = repeats[has] / grams[has]
    return out


def is_summarized(events: pa.Table) -> bool:
    """True when every row of `events` carries its token summary."""
    names = events.column_names
    return all(c in names for c in SUMMARY_COLUMNS) and events.column("n_output_tokens").null_count == 0


def summarize(events: pa.Table) -> pa.Table:
    """`events` with the token summary columns appended (as they are when every row has them)."""
    return events if is_summarized(events) else with_summary(events, summary(events))


def with_summary(events: pa.Table, columns: pa.Table) -> pa.Table:
    """`events` with `columns` (a `summary` of its rows) as its trailing summary columns, its own
    columns untouched: the sink's batch keeps its one contiguous chunk, which Parquet and
    validation read without a copy."""
    out = events.drop_columns([c for c in SUMMARY_COLUMNS if c in events.column_names])
    for name in SUMMARY_COLUMNS:
        out = out.append_column(TOKEN_SUMMARY.field(name), columns.column(name))
    return out


def summary(events: pa.Table) -> pa.Table:
    """The token summary of each event, as a table of the `TOKEN_SUMMARY` columns.

    Per event: the lengths of its input and output token lists, its loss tokens (the mask's
    sum, or every output token without a mask), the sum of its output logprobs, and the share
    of its output's n-grams that repeat (`ngram_repetition`; null under `REPETITION_NGRAM`
    tokens). An event without token lists gets zeros and a null repetition.
    """

    def lengths(name: str) -> np.ndarray:
        return np.asarray(
            pc.fill_null(pc.list_value_length(events.column(name)), 0).to_numpy(zero_copy_only=False),
            dtype=np.int64,
        )

    n_in, n_out = lengths("input_token_ids"), lengths("output_token_ids")
    n_mask = lengths("loss_mask")
    n_lp = lengths("output_logprobs")
    loss = _list_sums(events.column("loss_mask"), n_mask, np.int64)
    has_mask = pc.is_valid(events.column("loss_mask")).to_numpy(zero_copy_only=False)
    repetition = ngram_repetition(events.column("output_token_ids"))
    columns = {
        "n_input_tokens": pa.array(n_in, pa.int64()),
        "n_output_tokens": pa.array(n_out, pa.int64()),
        "n_loss_tokens": pa.array(np.where(has_mask, loss, n_out).astype(np.int64), pa.int64()),
        "sum_logprob": pa.array(_list_sums(events.column("output_logprobs"), n_lp, np.float64)),
        "output_repetition": pa.array(repetition, pa.float64(), mask=np.isnan(repetition)),
    }
    return pa.table([columns[name] for name in SUMMARY_COLUMNS], schema=TOKEN_SUMMARY)
