"""Writing a table's data files: Parquet laid out for tokens (zstd; token lists in the configured layout),
with the Delta statistics of each file, written in parallel, never seen half-written.

A file written here is not in the table until a commit (`store/commits.py`) adds its `AddAction`.
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from trajlake.store.config import LakeConfig
from trajlake.store.delta_log import DeltaLog
from trajlake.store.storage import Storage
from trajlake.store.summaries import is_summarized, summarize, summary, with_summary
from trajlake.store.tables import SCHEMAS, STATS_COLUMNS, conform

MIN_ROWS_PER_FILE = 20_000
"""Fewest rows worth a file (and a writing thread) of their own in `write_files`."""
SUMMARIZE_SLICE_ROWS = 4_096
"""Fewest events worth a thread of their own in `summarized`."""


class FileWriter:
    """Writes new data files of a lake's tables (each table's schema evolved first, through its log)."""

    def __init__(self, storage: Storage, log: DeltaLog, config: LakeConfig) -> None:
        self.storage = storage
        self.log = log
        self.config = config

    def write_file(self, name: str, data: pa.Table) -> AddAction:
        """Write `data` as one new Parquet file of table `name` (not yet committed); events
        get their token summary (`store/summaries.py`) unless they carry it."""
        self.log.evolve(name)  # creates the table (and its directory) on first write
        data = conform(summarize(data) if name == "events" else data, SCHEMAS[name])
        if data.num_columns and data.column(0).num_chunks > 1:
            data = data.combine_chunks()  # many small batches write far slower than one

        def write(out: Any) -> dict[str, Any]:
            pq.write_table(data, out, **self.parquet_options(data.schema))
            return file_stats(data)

        return self._new_file(name, write)

    def write_batches(self, name: str, batches: Iterable[pa.RecordBatch]) -> AddAction:
        """Write a stream of batches as one new Parquet file of `name` (not yet committed).

        Memory holds one row group (`row_group_rows`) at a time, however big the file: how
        `compact` merges files.
        """
        self.log.evolve(name)
        schema = SCHEMAS[name]
        options = self.parquet_options(schema)
        group_rows = options.pop("row_group_size")

        def write(out: Any) -> dict[str, Any]:
            stats = file_stats(schema.empty_table())
            pending: list[pa.RecordBatch] = []
            with pq.ParquetWriter(out, schema, **options) as writer:

                def flush() -> None:
                    nonlocal stats
                    group = pa.Table.from_batches(pending)
                    if name == "events":  # rows of a file older than the token summary get it
                        group = summarize(group)
                    group = conform(group, schema).combine_chunks()
                    writer.write_table(group, row_group_size=group_rows)
                    stats = merge_stats(stats, file_stats(group))
                    pending.clear()

                for batch in batches:
                    pending.append(batch)
                    if sum(b.num_rows for b in pending) >= group_rows:
                        flush()
                if pending:
                    flush()
            return stats

        return self._new_file(name, write)

    def _new_file(self, name: str, write: Callable[[Any], dict[str, Any]]) -> AddAction:
        """A new file of `name`, its bytes written by `write(stream)`, which returns its Delta stats.

        Locally the file is written under a temporary name and renamed: a reader never sees a
        half-written file.
        """
        rel = f"part-{int(time.time() * 1000):013d}-{uuid.uuid4().hex}.zstd.parquet"
        fs, root = self.storage.filesystem()
        path = f"{root}/{name}/{rel}"
        tmp = f"{root}/{name}/.{rel}.tmp" if self.storage.is_local else path
        with fs.open_output_stream(tmp) as out:
            stats = write(out)
        if self.storage.is_local:
            os.replace(tmp, path)
        size = fs.get_file_info(path).size
        return AddAction(rel, size, {}, int(time.time() * 1000), True, json.dumps(stats))

    def write_files(self, name: str, data: pa.Table) -> list[AddAction]:
        """Write `data` as `file_parts(rows)` files, in parallel threads (pyarrow releases the GIL).

        A table whose chunks are the parts (see `combine_in_parts`) is split at its chunk
        boundaries, so each thread writes contiguous memory.
        """
        parts = file_parts(data.num_rows)
        if parts == 1:
            return [self.write_file(name, data)] if data.num_rows else []
        slices = split_rows(data, parts)
        with ThreadPoolExecutor(len(slices)) as pool:
            return list(pool.map(lambda part: self.write_file(name, part), slices))

    def parquet_options(self, schema: pa.Schema) -> dict[str, Any]:
        """The `pyarrow.parquet` writer options of a file of `schema` (`LakeConfig.token_layout`)."""
        # `compact`: BYTE_STREAM_SPLIT puts the bytes of one significance together, as zstd's entropy
        # coding needs (ids 14.0 -> 11.3 bits, their order-0 entropy 9.9), but Spark's vectorized
        # reader rejects the encoding; `portable` is plain values, which every reader reads
        split = numeric_lists(schema) if self.config.token_layout == "compact" else []
        scalars = [f.name for f in schema if not pa.types.is_list(f.type)]
        return {
            "compression": self.config.compression,
            "compression_level": self.config.compression_level,
            "row_group_size": self.config.row_group_rows,
            # dictionaries pay off for repetitive strings; for Zipf token ids they only cost time
            "use_dictionary": [f.name for f in schema if pa.types.is_string(f.type)],
            "use_byte_stream_split": split or False,
            # min/max of scalar columns let DuckDB skip row groups; on token lists they are noise
            "write_statistics": scalars,
        }


def numeric_lists(schema: pa.Schema) -> list[str]:
    """The Parquet paths of the values of `schema`'s lists of numbers (token ids, logprobs)."""
    return [
        f"{f.name}.list.element"
        for f in schema
        if pa.types.is_list(f.type)
        and (pa.types.is_integer(f.type.value_type) or pa.types.is_floating(f.type.value_type))
    ]


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def file_parts(rows: int) -> int:
    """How many files `write_files` writes `rows` as: one per core, each of `MIN_ROWS_PER_FILE` or more."""
    return max(1, min(cores(), rows // MIN_ROWS_PER_FILE))


def split_rows(data: pa.Table, parts: int) -> list[pa.Table]:
    """`data` as up to `parts` contiguous slices (no copy), one for a thread each: at its chunk
    boundaries when it has that many chunks (see `combine_in_parts`), else of about equal rows."""
    if data.num_columns and data.column(0).num_chunks == parts:
        bounds = np.cumsum([0] + [len(c) for c in data.column(0).chunks])
    else:
        bounds = np.linspace(0, data.num_rows, parts + 1).astype(int)
    return [data.slice(int(a), int(b - a)) for a, b in itertools.pairwise(bounds) if b > a]


def summarized(events: pa.Table) -> pa.Table:
    """`summarize(events)`, slices of rows on a thread per core: rows are independent, and
    numpy's hashing and sorts and pyarrow's kernels release the GIL. On `bench/store_write.py`'s
    44k events (15.9M tokens), 0.20 s in one thread and 0.16 s (0.25 CPU-s) in two; while the
    n-gram hashing made a numpy call per 4,096 values, two threads took 0.33 s (0.46 CPU-s)."""
    parts = max(1, min(cores(), events.num_rows // SUMMARIZE_SLICE_ROWS))
    if parts == 1 or is_summarized(events):
        return summarize(events)
    slices = split_rows(events, parts)
    with ThreadPoolExecutor(len(slices)) as pool:
        # only the small summary columns are concatenated: the events keep their chunks
        return with_summary(events, pa.concat_tables(pool.map(summary, slices)).combine_chunks())


def combine_in_parts(tables: Sequence[pa.Table]) -> pa.Table:
    """Concatenate many small tables into one whose chunks are one contiguous block per file
    `write_files` will write (`file_parts`), each combined on a thread of its own.

    Parquet writes contiguous memory several times faster than thousands of small batches.
    A batch of one file is one block: split in two, the file's writer would copy it whole
    again, and validation would copy its token lists to read them as one array.
    """
    if not tables:
        raise ValueError("no tables to combine")
    parts = min(file_parts(sum(t.num_rows for t in tables)), len(tables))
    if parts == 1:
        return pa.concat_tables(tables).combine_chunks()
    bounds = np.linspace(0, len(tables), parts + 1).astype(int)
    groups = [tables[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    with ThreadPoolExecutor(len(groups)) as pool:
        blocks = list(pool.map(lambda g: pa.concat_tables(g).combine_chunks(), groups))
    return pa.concat_tables(blocks)


def file_stats(data: pa.Table) -> dict[str, Any]:
    """The Delta statistics of a file holding `data`: rows, and min, max and nulls of `STATS_COLUMNS`."""
    stats: dict[str, Any] = {"numRecords": data.num_rows}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name in STATS_COLUMNS:
        if name not in data.column_names:
            continue
        col = data.column(name)
        nulls[name] = col.null_count
        if data.num_rows and col.null_count < data.num_rows:
            mm = pc.min_max(col)
            lo[name], hi[name] = _stat_value(mm["min"].as_py()), _stat_value(mm["max"].as_py())
    stats.update(minValues=lo, maxValues=hi, nullCount=nulls)
    return stats


def merge_stats(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The Delta statistics of two files' rows together."""
    merged = {"numRecords": a["numRecords"] + b["numRecords"], "minValues": {}, "maxValues": {}}
    for key, pick in (("minValues", min), ("maxValues", max)):
        for col in a[key].keys() | b[key].keys():
            values = [v for v in (a[key].get(col), b[key].get(col)) if v is not None]
            merged[key][col] = pick(values)
    names = a["nullCount"].keys() | b["nullCount"].keys()
    merged["nullCount"] = {c: a["nullCount"].get(c, 0) + b["nullCount"].get(c, 0) for c in names}
    return merged


def _stat_value(value: Any) -> Any:
    """A min/max as the Delta log stores it: timestamps as ISO-8601 UTC strings, to the microsecond
    (one fixed width, so `merge_stats` compares them as strings)."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return value
