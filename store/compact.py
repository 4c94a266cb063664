"""Compaction: merge small files (optimize) and delete unreferenced ones (vacuum), guarded.

Compaction rewrites files with `dataChange=false`, so projections (which advance on the
files that commits add with `dataChange=true`) are not re-fed rows they already hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltalake import ColumnProperties, WriterProperties

from trajlake.store.errors import LakeError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

MIN_RETENTION_HOURS = 168
"""Files younger than this stay, so readers and sinks on an older snapshot keep working."""


@dataclass
class CompactionReport:
    """What `compact` did to each table."""

    files_removed: dict[str, int] = field(default_factory=dict)
    files_added: dict[str, int] = field(default_factory=dict)
    vacuumed: dict[str, int] = field(default_factory=dict)


def writer_properties(lake: Lake, name: str) -> WriterProperties:
    """delta-rs writer settings matching the lake's own Parquet layout (zstd, split floats)."""
    from trajlake.store.lake import SCHEMAS

    columns = {}
    if lake.config.byte_stream_split_floats:
        for f in SCHEMAS[name]:
            if str(f.type).startswith("list<") and "float" in str(f.type):
                columns[f"{f.name}.element"] = ColumnProperties(dictionary_enabled=False, encoding="BYTE_STREAM_SPLIT")
    return WriterProperties(
        compression="ZSTD",
        compression_level=lake.config.compression_level,
        max_row_group_size=lake.config.row_group_rows,
        column_properties=columns or None,
    )


def check_retention(retention_hours: int, allow_short: bool) -> None:
    """Raise unless the retention respects the guard (or the caller overrides it)."""
    if retention_hours < 0:
        raise LakeError(f"retention must be >= 0 hours (got {retention_hours})")
    if retention_hours < MIN_RETENTION_HOURS and not allow_short:
        raise LakeError(
            f"retention {retention_hours}h is below the {MIN_RETENTION_HOURS}h guard: readers or sinks "
            "on an older snapshot would lose files; pass --allow-short-retention to override"
        )


def compact(
    lake: Lake,
    tables: list[str] | None = None,
    retention_hours: int = MIN_RETENTION_HOURS,
    allow_short_retention: bool = False,
    vacuum: bool = True,
) -> CompactionReport:
    """Optimize, then vacuum, each existing table."""
    from trajlake.store.lake import TABLES

    check_retention(retention_hours, allow_short_retention)
    report = CompactionReport()
    for name in tables or TABLES:
        if not lake.exists(name):
            continue
        table = lake.delta(name)
        metrics = table.optimize.compact(writer_properties=writer_properties(lake, name))
        report.files_removed[name] = int(metrics.get("numFilesRemoved", 0))
        report.files_added[name] = int(metrics.get("numFilesAdded", 0))
        if vacuum:
            deleted = table.vacuum(
                retention_hours=retention_hours,
                dry_run=False,
                enforce_retention_duration=not allow_short_retention,
            )
            report.vacuumed[name] = len(deleted)
    return report
