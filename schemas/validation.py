"""Ingest-time invariants of docs/design.md#events, checked on whole Arrow batches at once.

`validate(table)` returns the rows that pass and, for each row that fails, a reason that
names the field, the offending value and the fix. Checks are vectorised with
`pyarrow.compute`; only failing rows are looked at one by one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.schemas.events import (
    ENUM_FIELDS,
    EVENT_TYPES,
    NON_NULL_FIELDS,
    REQUIRED_FIELDS,
    SUPPORTED_SCHEMA_VERSIONS,
    TRAJECTORY_EVENT_TYPES,
    TURN,
)


@dataclass
class ValidationResult:
    """The rows that passed (`valid`) and a reason for each row that did not."""

    valid: pa.Table
    rejected: pa.Table
    reasons: list[str]
    valid_index: np.ndarray
    rejected_index: np.ndarray

    @property
    def ok(self) -> bool:
        return not self.reasons


def _np_bool(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _add(reasons: dict[int, list[str]], rows: Iterable[int], make: object) -> None:
    for i in rows:
        reasons.setdefault(int(i), []).append(make(int(i)) if callable(make) else str(make))


def _list_row_flags(col: pa.ChunkedArray, flag_values: np.ndarray, n: int) -> np.ndarray:
    """OR-reduce a per-element flag over each list row."""
    flags = np.zeros(n, dtype=bool)
    flags[_global_parents(col)[flag_values]] = True
    return flags


def _first_bad(values: list[float | int], predicate: object) -> object:
    return next((v for v in values if predicate(v)), None)  # type: ignore[operator]


def validate(table: pa.Table, known_seqs: Mapping[str, Collection[int]] | None = None) -> ValidationResult:
    """Check every invariant on a batch in `EVENTS_SCHEMA`.

    Args:
        table: events, in arrival order.
        known_seqs: per trajectory, the seqs already stored in the lake; a repeat is rejected.
    """
    n = table.num_rows
    reasons: dict[int, list[str]] = {}
    etype = table.column("event_type")

    unknown = ~_np_bool(pc.is_in(etype, value_set=pa.array(EVENT_TYPES)))
    _add(
        reasons,
        np.flatnonzero(unknown),
        lambda i: f"event_type={etype[i].as_py()!r} is unknown; use one of {', '.join(EVENT_TYPES)}",
    )
    versions = table.column("schema_version")
    bad_version = ~_np_bool(
        pc.is_in(versions, value_set=pa.array(sorted(SUPPORTED_SCHEMA_VERSIONS), pa.int16()))
    )
    vlist = versions.to_pylist()
    _add(
        reasons,
        np.flatnonzero(bad_version),
        lambda i: (
            f"schema_version={vlist[i]!r} is not supported (supported: {sorted(SUPPORTED_SCHEMA_VERSIONS)}); "
            "upgrade trajlake on the sink or write a supported version"
        ),
    )
    # a null event_type or schema_version is reported by its own check above, with the fix
    for name in (n for n in NON_NULL_FIELDS if n not in ("event_type", "schema_version")):
        missing = _np_bool(pc.is_null(table.column(name)))
        _add(
            reasons,
            np.flatnonzero(missing),
            f"{name} is missing; every event needs the envelope field {name}",
        )

    for event_type, required in REQUIRED_FIELDS.items():
        is_type = _np_bool(pc.equal(etype, event_type))
        if not is_type.any():
            continue
        for name in required:
            missing = is_type & _np_bool(pc.is_null(table.column(name)))
            _add(
                reasons, np.flatnonzero(missing), f"{name} is missing; a {event_type} event must carry {name}"
            )

    seq = table.column("seq")
    negative_seq = _np_bool(pc.less(seq, 0))
    _add(
        reasons,
        np.flatnonzero(negative_seq),
        lambda i: f"seq={seq[i].as_py()} is negative; seq counts 0,1,2,… per trajectory",
    )

    _check_enums(table, reasons)
    if bool(_np_bool(pc.equal(etype, TURN)).any()):
        _check_turns(table, reasons)
    _check_duplicate_seq(table, reasons, known_seqs or {})

    bad_rows = np.zeros(n, dtype=bool)
    bad_rows[list(reasons)] = True
    good_idx = np.flatnonzero(~bad_rows)
    bad_idx = np.flatnonzero(bad_rows)
    return ValidationResult(
        valid=table.take(pa.array(good_idx, pa.int64())) if len(bad_idx) else table,
        rejected=table.take(pa.array(bad_idx, pa.int64())) if len(bad_idx) else table.slice(0, 0),
        reasons=["; ".join(reasons[int(i)]) for i in bad_idx],
        valid_index=good_idx,
        rejected_index=bad_idx,
    )


def _check_enums(table: pa.Table, reasons: dict[int, list[str]]) -> None:
    for name, allowed in ENUM_FIELDS.items():
        col = table.column(name)
        bad = _np_bool(pc.invert(pc.is_in(col, value_set=pa.array(allowed)))) & ~_np_bool(pc.is_null(col))
        values = col.to_pylist() if bad.any() else []
        _add(
            reasons,
            np.flatnonzero(bad),
            lambda i, n=name, a=allowed, v=values: f"{n}={v[i]!r} is not allowed; use one of {', '.join(a)}",
        )


def _check_turns(table: pa.Table, reasons: dict[int, list[str]]) -> None:
    n = table.num_rows
    ids = table.column("output_token_ids")
    lps = table.column("output_logprobs")
    mask = table.column("loss_mask")
    inputs = table.column("input_token_ids")
    n_ids = pc.list_value_length(ids)
    n_lps = pc.list_value_length(lps)
    n_mask = pc.list_value_length(mask)
    diff = _np_bool(pc.not_equal(n_ids, n_lps))
    _add(
        reasons,
        np.flatnonzero(diff),
        lambda i: (
            f"output_token_ids has {n_ids[i].as_py()} ids but output_logprobs has {n_lps[i].as_py()} values; "
            "send one logprob per sampled token"
        ),
    )
    mask_diff = _np_bool(pc.not_equal(n_mask, n_ids))
    _add(
        reasons,
        np.flatnonzero(mask_diff),
        lambda i: (
            f"loss_mask has {n_mask[i].as_py()} entries for {n_ids[i].as_py()} output tokens; "
            "the mask must cover exactly the turn's output tokens"
        ),
    )

    flat_lp = pc.list_flatten(lps)  # chunked, no copy: the fast path below never materialises it
    mm = pc.min_max(flat_lp)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    clean = lo is None or (hi <= 0 and lo > -np.inf and not pc.any(pc.is_nan(flat_lp)).as_py())
    if not clean:  # NaN or +inf or a positive value somewhere: find the rows
        lp_values = flat_lp.to_numpy()
        with np.errstate(invalid="ignore"):
            bad_lp = ~np.isfinite(lp_values) | (lp_values > 0)
        rows = _list_row_flags(lps, bad_lp, n)
        _add(
            reasons,
            np.flatnonzero(rows),
            lambda i: (
                f"output_logprobs contains {_first_bad(lps[i].as_py(), lambda v: not (v <= 0))!r}; "
                "logprobs must be finite and <= 0 (send log-probabilities, not probabilities or logits)"
            ),
        )

    vocab = table.column("vocab_size")
    for name, col in (("output_token_ids", ids), ("input_token_ids", inputs)):
        flat_ids = pc.list_flatten(col)
        mm = pc.min_max(flat_ids)
        if mm["min"].as_py() is None:
            continue
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        smallest_vocab = pc.min(vocab).as_py()
        if lo >= 0 and (smallest_vocab is None or hi < smallest_vocab):
            continue  # every id is in range for every row's vocabulary
        flat = flat_ids.to_numpy()
        negative = flat < 0
        if negative.any():
            rows = _list_row_flags(col, negative, n)
            _add(
                reasons,
                np.flatnonzero(rows),
                lambda i, c=col, nm=name: (
                    f"{nm} contains {_first_bad(c[i].as_py(), lambda v: v < 0)!r}; token ids must be >= 0"
                ),
            )
        if vocab.null_count < n:
            parents = _global_parents(col)
            limits = np.asarray(pc.fill_null(vocab, np.iinfo(np.int64).max).to_numpy(zero_copy_only=False))
            too_big = flat >= limits[parents]
            if too_big.any():
                rows = np.zeros(n, dtype=bool)
                rows[parents[too_big]] = True
                _add(
                    reasons,
                    np.flatnonzero(rows),
                    lambda i, c=col, nm=name: (
                        f"{nm} contains {_first_bad(c[i].as_py(), lambda v, lim=vocab[i].as_py(): v >= lim)!r} "
                        f">= vocab_size {vocab[i].as_py()}; ids must be below the declared vocab size"
                    ),
                )


def _global_parents(col: pa.ChunkedArray) -> np.ndarray:
    parts = []
    start = 0
    for chunk in col.chunks:
        parts.append(pc.list_parent_indices(chunk).to_numpy() + start)
        start += len(chunk)
    return np.concatenate(parts) if parts else np.array([], dtype=np.int64)


def repeated_seqs(
    table: pa.Table, known_seqs: Mapping[str, Collection[int]], eligible: np.ndarray | None = None
) -> np.ndarray:
    """Rows of trajectory events whose (trajectory, seq) came earlier in `table` or is among
    `known_seqs` (the first one wins), among the `eligible` rows (a mask; default: all)."""
    tid_col, seq_col = table.column("trajectory_id"), table.column("seq")
    mask = (
        _np_bool(pc.is_in(table.column("event_type"), value_set=pa.array(sorted(TRAJECTORY_EVENT_TYPES))))
        & _np_bool(pc.is_valid(tid_col))
        & _np_bool(pc.is_valid(seq_col))
    )
    if eligible is not None:
        mask &= eligible
    rows = np.flatnonzero(mask)
    if not rows.size:
        return rows
    encoded = pc.dictionary_encode(tid_col.take(pa.array(rows))).combine_chunks()
    codes = encoded.indices.to_numpy()
    names = encoded.dictionary.to_pylist()
    seqs = seq_col.take(pa.array(rows)).to_numpy()
    order = np.lexsort((np.arange(rows.size), seqs, codes))  # by trajectory, seq, then arrival
    repeat = np.zeros(rows.size, dtype=bool)
    sorted_codes, sorted_seqs = codes[order], seqs[order]
    repeat[order[1:]] = (sorted_codes[1:] == sorted_codes[:-1]) & (sorted_seqs[1:] == sorted_seqs[:-1])
    if known_seqs:
        known_codes = [code for code, name in enumerate(names) if known_seqs.get(name)]
        for j in np.flatnonzero(np.isin(codes, known_codes)):
            if int(seqs[j]) in known_seqs[names[codes[j]]]:
                repeat[j] = True
    return rows[repeat]


def _check_duplicate_seq(
    table: pa.Table,
    reasons: dict[int, list[str]],
    known_seqs: Mapping[str, Collection[int]],
) -> None:
    """Reject a (trajectory, seq) seen earlier in the batch or already stored; the first one wins."""
    eligible = np.ones(table.num_rows, dtype=bool)
    if reasons:  # rows rejected already neither count as a first occurrence nor get a second reason
        eligible[list(reasons)] = False
    tid_col, seq_col = table.column("trajectory_id"), table.column("seq")
    for row in repeated_seqs(table, known_seqs, eligible).tolist():
        reasons.setdefault(row, []).append(
            f"seq={seq_col[row].as_py()} is a duplicate within trajectory {tid_col[row].as_py()}; "
            "each event of a trajectory needs its own seq"
        )
