"""Compaction: merge small files (optimize), rewrite files of a token layout the lake no longer
writes (relayout), delete unreferenced ones (vacuum, guarded), and checkpoint the Delta log of
each table it changed; and the size tiers a sink merges after each commit (`merge_tiers`), so
projections keep tens of files however many commits a run makes.

Merged files are written by the lake's own Parquet writer (so token payloads keep the lake's
layout) and committed with `dataChange=false` together with the removal of the
files they replace, in one Delta commit. Projections advance on files added with
`dataChange=true`, so they are never re-fed rows they already hold.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from trajlake.store.errors import CommitConflict, LakeError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

MIN_RETENTION_HOURS = 168
"""Files younger than this stay, so readers and sinks on an older snapshot keep working."""

TARGET_FILE_BYTES = 256 << 20

TRAJECTORIES_FILE_BYTES = 8 << 20
"""The size `trajectories` files are merged up to (about 100k trajectories): a sampler reads only the
files whose versions reach into its staleness window, and the run in one merged file put every
row of it in reach, at every batch after a compaction."""


def target_bytes(name: str) -> int:
    """The size files of table `name` are merged up to."""
    return TRAJECTORIES_FILE_BYTES if name == "trajectories" else TARGET_FILE_BYTES


@dataclass
class CompactionReport:
    """What `compact` did to each table."""

    files_removed: dict[str, int] = field(default_factory=dict)
    files_added: dict[str, int] = field(default_factory=dict)
    vacuumed: dict[str, int] = field(default_factory=dict)
    files_raced: dict[str, int] = field(default_factory=dict)
    """Files left as they were because another writer replaced some of their bin meanwhile (a
    concurrent compaction, or a sink's merge); the next run merges what is left."""


def check_retention(retention_hours: int, allow_short: bool) -> None:
    """Raise unless the retention respects the guard (or the caller overrides it)."""
    if retention_hours < 0:
        raise LakeError(f"retention must be >= 0 hours (got {retention_hours})")
    if retention_hours < MIN_RETENTION_HOURS and not allow_short:
        raise LakeError(
            f"retention {retention_hours}h is below the {MIN_RETENTION_HOURS}h guard: readers or sinks "
            "on an older snapshot would lose files; pass --allow-short-retention to override"
        )


def _bins(sizes: list[tuple[str, int]], target: int) -> list[list[tuple[str, int]]]:
    """Consecutive groups of files, each up to about `target` bytes."""
    bins: list[list[tuple[str, int]]] = [[]]
    total = 0
    for path, size in sizes:
        if bins[-1] and total + size > target:
            bins.append([])
            total = 0
        bins[-1].append((path, size))
        total += size
    return [b for b in bins if len(b) > 1]


def optimize(lake: Lake, name: str) -> tuple[int, int, int]:
    """Merge the small files of one table; return (files removed, files added, files raced)."""
    target = target_bytes(name)
    return _merge_bins(lake, name, _bins([f for f in _sizes(lake, name) if f[1] < target], target))


def merge_tiers(lake: Lake, name: str, fanin: int) -> tuple[int, int, int]:
    """Merge the files of one table whose size has the same order of magnitude (powers of
    `fanin` bytes) once `fanin` of them pile up; return (files removed, files added, files raced).

    Run after each commit, this keeps a table that grows a small file a commit at about
    `fanin - 1` files per magnitude (tens, where a run makes thousands) while each row is
    rewritten only once per magnitude it climbs; files of `target_bytes(name)` and more stay.
    """
    removed = added = raced = 0
    target = target_bytes(name)
    while True:
        tiers: dict[int, list[tuple[str, int]]] = {}
        for path, size in _sizes(lake, name):
            if size < target:
                tiers.setdefault(int(math.log(max(size, 1), fanin)), []).append((path, size))
        full = [files for _, files in sorted(tiers.items()) if len(files) >= fanin]
        bins = _bins(full[0], target) if full else []
        if not bins:
            return removed, added, raced
        r, a, x = _merge_bins(lake, name, bins)
        removed, added, raced = removed + r, added + a, raced + x
        if x:  # another writer is rewriting this table: it, or the next commit, merges the rest
            return removed, added, raced


def relayout(lake: Lake, name: str) -> tuple[int, int, int]:
    """Rewrite, one at a time, the files of `name` whose token lists are BYTE_STREAM_SPLIT while the
    lake writes `portable` ones (files of a lake written before that was the default: Spark's
    vectorized reader rejects them); return (files removed, files added, files raced)."""
    from trajlake.store.files import numeric_lists
    from trajlake.store.tables import SCHEMAS

    if lake.config.token_layout != "portable" or not numeric_lists(SCHEMAS[name]):
        return 0, 0, 0
    fs, _ = lake.filesystem()
    split = [(path, size) for path, size in _sizes(lake, name) if _splits_bytes(fs, path)]
    return _merge_bins(lake, name, [[file] for file in split])


def _splits_bytes(fs: Any, path: str) -> bool:
    """Whether the Parquet file at `path` has a column chunk encoded BYTE_STREAM_SPLIT (read from its footer)."""
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    return any(
        "BYTE_STREAM_SPLIT" in meta.row_group(g).column(c).encodings
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    )


def _sizes(lake: Lake, name: str) -> list[tuple[str, int]]:
    """(path, bytes) of the table's current files, in the order they were written."""
    files = lake.file_stats(name)
    if not files.num_rows:
        return []
    root = lake.filesystem()[1]
    paths = [f"{root}/{name}/{p.rsplit('/', 1)[-1]}" for p in files.column("path").to_pylist()]
    return sorted(zip(paths, files.column("size_bytes").to_pylist(), strict=True))


def _merge_bins(lake: Lake, name: str, bins: list[list[tuple[str, int]]]) -> tuple[int, int, int]:
    """Rewrite each bin of files as one; return (files removed, files added, files raced).

    A bin whose files another writer replaced while it was merged (`CommitConflict`) is left
    as the other writer made it: committing it would bring back rows already rewritten.
    """
    from trajlake.store.tables import SCHEMAS

    fs, root = lake.filesystem()
    removed = added = raced = 0
    for group in bins:
        # streamed a batch at a time, with the table's full schema (a file older than a column
        # gets it, as null): reading a whole bin of events held 8.4 GB on a 1.8 GB lake
        paths = [path for path, _ in group]
        source = ds.dataset(paths, schema=SCHEMAS[name], filesystem=fs, format="parquet")
        batches = source.to_batches(batch_size=16_384, batch_readahead=0, fragment_readahead=0)
        written = lake.write_batches(name, batches)
        add = AddAction(written.path, written.size, {}, written.modification_time, False, written.stats)
        now = int(time.time() * 1000)
        removes = [RemoveAction(path.rsplit("/", 1)[1], False, now, size) for path, size in group]
        try:
            lake.replace_files(name, [add], removes)
        except CommitConflict:
            fs.delete_file(f"{root}/{name}/{written.path}")  # never committed: no reader knows it
            raced += len(group)
            continue
        removed += len(group)
        added += 1
    return removed, added, raced


def compact(
    lake: Lake,
    tables: list[str] | None = None,
    retention_hours: int = MIN_RETENTION_HOURS,
    allow_short_retention: bool = False,
    vacuum: bool = True,
) -> CompactionReport:
    """Optimize, then vacuum, each existing table."""
    from trajlake.store.tables import TABLES

    check_retention(retention_hours, allow_short_retention)
    report = CompactionReport()
    for name in tables or TABLES:
        if not lake.exists(name):
            continue
        merged, relaid = optimize(lake, name), relayout(lake, name)
        report.files_removed[name], report.files_added[name], report.files_raced[name] = (
            a + b for a, b in zip(merged, relaid, strict=True)
        )
        if vacuum:
            deleted = lake.delta(name).vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=not allow_short_retention,
            )
            report.vacuumed[name] = len(deleted)
        if report.files_removed[name]:
            # a reader opens the table from its last checkpoint, then replays every commit after
            # it, this one with its removes too: a table of 95 appends, compacted, opened in
            # 43.5 ms without a checkpoint at its head and in 5.8 ms with one
            lake.delta(name).create_checkpoint()
    return report
