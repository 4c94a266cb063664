"""Entropy floor of a lake's token payloads: how few bytes per token any lossless encoding can reach.

Reads a sample of `events` files and, for each token column, sets the bytes the lake spends on
it (Parquet column chunks, compressed) beside the empirical entropy of its values:
  token ids       order-0 entropy of the ids (input and output ids pooled)
  logprobs        float32 values: a lower bound, the larger of the entropies of their high and
                  low 16 bits (each a function of the value), and an estimate, the sum of the two
                  (exact when the halves are independent, as the low bits of a smooth density are)
  loss mask       order-0 entropy of the booleans
Figures are per token of the sample (every stored id: appended input and output), as the lake's
bytes/token. Order-0 entropy is the rate of memoryless data (loadgen draws ids and logprobs
independently); text from a real model has context a higher-order model could use.

    python bench/token_entropy.py --lake DIR [--files 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TOKEN_COLUMNS = ("input_token_ids", "output_token_ids", "output_logprobs", "loss_mask")


def entropy_bits(counts: np.ndarray) -> float:
    """Plug-in (order-0) entropy in bits per value of a histogram."""
    p = counts[counts > 0] / counts.sum()
    return float((p * np.log2(1 / p)).sum())


def values(table: pa.Table, column: str) -> np.ndarray:
    """Every element of a list column, flattened (null lists skipped)."""
    return pc.list_flatten(table.column(column).combine_chunks()).to_numpy(zero_copy_only=False)


def stored_bytes(files: list[str]) -> dict[str, int]:
    """Compressed bytes of each top-level column over `files` (column chunks of every row group)."""
    out: dict[str, int] = {}
    for path in files:
        meta = pq.ParquetFile(path).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                name = chunk.path_in_schema.split(".")[0]
                out[name] = out.get(name, 0) + chunk.total_compressed_size
    return out


def measure(lake_root: Path, n_files: int, seed: int = 0) -> dict[str, Any]:
    from trajlake.store.lake import TABLES, Lake

    lake = Lake(lake_root)
    all_files = lake.files("events")
    files = sorted(random.Random(seed).sample(all_files, min(n_files, len(all_files))))
    turns = pq.read_table(files, columns=list(TOKEN_COLUMNS), filters=pc.field("output_token_ids").is_valid())
    ids = np.concatenate([values(turns, "input_token_ids"), values(turns, "output_token_ids")]).astype(
        np.int64
    )
    logprobs = values(turns, "output_logprobs").astype(np.float32).view(np.uint32)
    mask = values(turns, "loss_mask").astype(np.int64)
    tokens = len(ids)

    h_ids = entropy_bits(np.bincount(ids))
    h_hi = entropy_bits(np.bincount(logprobs >> 16, minlength=1 << 16))
    h_lo = entropy_bits(np.bincount(logprobs & 0xFFFF, minlength=1 << 16))
    h_mask = entropy_bits(np.bincount(mask, minlength=2)) if len(mask) else 0.0
    stored = stored_bytes(files)
    per_token = {name: b / tokens for name, b in stored.items()}
    floor = {
        "token_ids": h_ids / 8,
        "output_logprobs_lower": max(h_hi, h_lo) / 8 * len(logprobs) / tokens,
        "output_logprobs": (h_hi + h_lo) / 8 * len(logprobs) / tokens,
        "loss_mask": h_mask / 8 * len(mask) / tokens,
    }
    live = sum(Path(uri).stat().st_size for name in TABLES for uri in lake.files(name))
    lake_tokens = lake.sql("select sum(total_tokens)::bigint from trajectories").column(0)[0].as_py()
    lake.close()
    return {
        "files": len(files), "tokens": tokens, "logprobs_per_token": len(logprobs) / tokens,
        "distinct_logprob_share": len(np.unique(logprobs)) / max(1, len(logprobs)),
        "entropy_bits": {"token_id": h_ids, "logprob_high16": h_hi, "logprob_low16": h_lo, "loss_mask": h_mask},
        "floor_bytes_per_token": floor,
        "stored_bytes_per_token": {
            "token_ids": per_token.get("input_token_ids", 0) + per_token.get("output_token_ids", 0),
            "output_logprobs": per_token.get("output_logprobs", 0), "loss_mask": per_token.get("loss_mask", 0),
            "other_events_columns": sum(v for k, v in per_token.items() if k not in TOKEN_COLUMNS),
        },
        "lake_data_bytes_per_token": live / lake_tokens if lake_tokens else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", type=Path, required=True, help="the lake to sample")
    parser.add_argument("--files", type=int, default=16, help="events files to sample (default 16)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    result = measure(args.lake, args.files)
    floor, stored = result["floor_bytes_per_token"], result["stored_bytes_per_token"]
    print(f"sample: {result['files']} events files, {result['tokens']:,} tokens, "
          f"{result['logprobs_per_token']:.2f} logprobs per token, "
          f"{result['distinct_logprob_share']:.1%} of logprobs distinct")  # fmt: skip
    print(f"{'column':<18}{'entropy, bits/value':>22}{'floor, B/token':>16}{'stored, B/token':>17}")
    bits = result["entropy_bits"]
    rows = [
        ("token ids", f"{bits['token_id']:.2f}", floor["token_ids"], stored["token_ids"]),
        ("logprobs", f"{max(bits['logprob_high16'], bits['logprob_low16']):.2f}–"
         f"{bits['logprob_high16'] + bits['logprob_low16']:.2f}", floor["output_logprobs"], stored["output_logprobs"]),
        ("loss mask", f"{bits['loss_mask']:.3f}", floor["loss_mask"], stored["loss_mask"]),
    ]  # fmt: skip
    for name, entropy, low, spent in rows:
        print(f"{name:<18}{entropy:>22}{low:>16.3f}{spent:>17.3f}")
    payload_floor = floor["token_ids"] + floor["output_logprobs"] + floor["loss_mask"]
    payload_lower = floor["token_ids"] + floor["output_logprobs_lower"] + floor["loss_mask"]
    print(f"token payload floor: {payload_floor:.3f} B/token (lower bound {payload_lower:.3f}); stored "
          f"{stored['token_ids'] + stored['output_logprobs'] + stored['loss_mask']:.3f}; other events "
          f"columns {stored['other_events_columns']:.3f}; whole lake (data files) "
          f"{result['lake_data_bytes_per_token']:.3f} B/token")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
