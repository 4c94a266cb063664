"""Token list layouts side by side: bytes per token, write and read speed of the `events` table.

    python bench/token_layout.py [--quick] [--json PATH] [--check]

Records a loadgen run (default 3,000 trajectories, quick 300) into a lake, reads its `events`
back as Arrow, then writes that table once per layout with the lake's own Parquet options
(`FileWriter.parquet_options`: zstd, row groups, statistics), changing only how the token lists
(ids, logprobs) are encoded, and reads each file back whole:
  - portable: plain values (`LakeConfig.token_layout` default; every Parquet reader reads it);
  - compact: BYTE_STREAM_SPLIT on ids and logprobs (`token_layout="compact"`, the old default;
    Spark 4.0's vectorized reader rejects it);
  - split_floats: BYTE_STREAM_SPLIT on the logprobs only (rejected by the same readers);
  - delta_ids: DELTA_BINARY_PACKED token ids, plain logprobs (Spark reads it since 3.3);
  - portable_zstd9: plain values at zstd level 9 instead of the lake's 1.
Reports bytes/token of each (every token of the run: prompt, appended input and output), the
write and read seconds, and the ratios of portable to compact (bytes: lower is better; the
harness's `--check` guards them).
"""

from __future__ import annotations

import io
import time
from typing import Any

from harness import Bench, run

LAYOUTS = ("portable", "compact", "split_floats", "delta_ids", "portable_zstd9")
REPEATS = 3
"""Writes and reads of each layout; the fastest counts (the box is shared)."""


def loadgen_events(root: str, trajectories: int) -> tuple[Any, int]:
    """The `events` table of a loadgen run, as Arrow, and the run's token count."""
    import pyarrow.dataset as ds

    from trajlake.ingest.bus.inprocess import InProcessBus
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.rollout.loadgen import LoadgenConfig, generate
    from trajlake.store.lake import Lake

    bus = InProcessBus()
    counts = generate(bus, LoadgenConfig(run_id="bench", trajectories=trajectories, seed=11))
    lake = Lake(root)
    DeltaSink(lake, bus, SinkConfig(update_projections=False)).run(until_idle_s=0.0)
    fs, _ = lake.filesystem()
    events = ds.dataset(lake.files("events"), format="parquet", filesystem=fs).to_table()
    lake.close()
    return events, counts.tokens


def layout_options(work: str, layout: str, schema: Any) -> dict[str, Any]:
    """The lake's writer options of `schema`, with the token lists encoded as `layout` says."""
    import pyarrow as pa

    from trajlake.store.config import LakeConfig
    from trajlake.store.files import numeric_lists
    from trajlake.store.lake import Lake

    base = "compact" if layout == "compact" else "portable"
    options = Lake(f"{work}/{base}", LakeConfig(token_layout=base)).writer.parquet_options(schema)
    floats = [f"{f.name}.list.element" for f in schema if pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type)]  # fmt: skip
    if layout == "split_floats":
        options["use_byte_stream_split"] = floats
    elif layout == "delta_ids":
        ints = [path for path in numeric_lists(schema) if path not in floats]
        options["column_encoding"] = dict.fromkeys(ints, "DELTA_BINARY_PACKED")
    elif layout == "portable_zstd9":
        options["compression_level"] = 9
    return options


def measure(work: str, events: Any, tokens: int, layout: str) -> dict[str, float]:
    """Bytes/token, and the fastest of `REPEATS` writes and reads of `events` in `layout`."""
    import pyarrow.parquet as pq

    options = layout_options(work, layout, events.schema)
    writes, reads = [], []
    for _ in range(REPEATS):
        sink = io.BytesIO()
        started = time.perf_counter()
        pq.write_table(events, sink, **options)
        writes.append(time.perf_counter() - started)
        data = sink.getvalue()
        started = time.perf_counter()
        back = pq.read_table(io.BytesIO(data))
        reads.append(time.perf_counter() - started)
    assert back.equals(events), f"{layout}: the table read back differs from the one written"
    return {
        "bytes_per_token": len(data) / tokens,
        "write_mtok_s": tokens / min(writes) / 1e6,
        "read_mtok_s": tokens / min(reads) / 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    bench = Bench("token_layout", __doc__, ratios={"portable_bytes_ratio": "lower"})
    bench.parser.add_argument(
        "--trajectories", type=int, help="loadgen trajectories (default 3000, quick 300)"
    )
    args = bench.parse(argv)
    trajectories = args.trajectories or (300 if args.quick else 3000)
    with bench.scratch() as work:
        events, tokens = loadgen_events(f"{work}/lake", trajectories)
        figures = {layout: measure(work, events, tokens, layout) for layout in LAYOUTS}
    portable, compact = figures["portable"], figures["compact"]
    result: dict[str, Any] = {
        "trajectories": trajectories,
        "tokens": tokens,
        "events_rows": events.num_rows,
        "layouts": figures,
        "portable_bytes_ratio": portable["bytes_per_token"] / compact["bytes_per_token"],
        "portable_write_ratio": portable["write_mtok_s"] / compact["write_mtok_s"],
        "portable_read_ratio": portable["read_mtok_s"] / compact["read_mtok_s"],
    }
    lines = [f"events of {trajectories:,} loadgen trajectories, {tokens:,} tokens, {events.num_rows:,} rows"]
    lines.append(f"  {'layout':<16}{'B/token':>8}{'write Mtok/s':>14}{'read Mtok/s':>13}")
    for layout, f in figures.items():
        lines.append(
            f"  {layout:<16}{f['bytes_per_token']:>8.2f}{f['write_mtok_s']:>14.1f}{f['read_mtok_s']:>13.1f}"
        )
    lines.append(
        f"portable / compact: bytes x{result['portable_bytes_ratio']:.3f}, write speed "
        f"x{result['portable_write_ratio']:.2f}, read speed x{result['portable_read_ratio']:.2f}"
    )
    return bench.finish(args, result, "\n".join(lines))


if __name__ == "__main__":
    run(main)
