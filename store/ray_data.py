"""Ray Data over the lake: a distributed engine reads a table's Parquet files in place, no copy.

The file list comes from the table's current Delta snapshot, so a reader sees exactly the
committed rows (never a file a crashed writer left behind) and never re-reads the log itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trajlake.store.errors import LakeError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake


def snapshot_paths(lake: Lake, table: str) -> tuple[list[str], Any]:
    """The Parquet paths of `table`'s current snapshot and the pyarrow filesystem they live on."""
    files = lake.files(table)
    fs, _ = lake.filesystem()
    if lake.is_local:
        return [f.removeprefix("file://") for f in files], fs
    return [f.split("://", 1)[1] for f in files], fs


def read_ray_dataset(
    lake: Lake, table: str, columns: Sequence[str] | None = None, **read_options: Any
) -> Any:
    """A `ray.data.Dataset` over the stored rows of `table` (the stored columns; views are DuckDB's).

    Args:
        lake: the lake to read.
        table: a stored table name (events, trajectories, turns, …).
        columns: read only these columns.
        read_options: passed to `ray.data.read_parquet` (e.g. `override_num_blocks`).
    """
    import ray.data

    paths, fs = snapshot_paths(lake, table)
    if not paths:
        raise LakeError(
            f"table {table} has no committed rows yet; ingest events first", table_uri=lake.uri(table)
        )
    return ray.data.read_parquet(
        paths, filesystem=fs, columns=list(columns) if columns else None, **read_options
    )
