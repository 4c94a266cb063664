"""Ray Data over the lake: a distributed engine reads a table's Parquet files in place, no copy.

The file list comes from the table's current Delta snapshot, so a reader sees exactly the
committed rows (never a file a crashed writer left behind) and never re-reads the log itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

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
    """A `ray.data.Dataset` over the stored rows of `table` (the stored columns; the trajectories'
    token lists: `read_trajectory_tokens`).

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


def read_trajectory_tokens(lake: Lake, **read_options: Any) -> Any:
    """A `ray.data.Dataset` of one row per trajectory: `run_id`, `trajectory_id` and its whole
    `token_ids`, `logprobs` and `loss_mask`, as the `trajectories` view gives them, assembled from
    the turns in `events` by Ray's workers (for distributed preprocessing: join `trajectories`'
    scalars on the two ids where needed). `read_options` go to `ray.data.read_parquet`."""
    turns = read_ray_dataset(lake, "events", TURN_COLUMNS, **read_options).filter(expr="event_type == 'turn'")
    return turns.groupby(["run_id", "trajectory_id"]).map_groups(assemble_tokens, batch_format="pyarrow")


TURN_COLUMNS = ("event_type", "run_id", "trajectory_id", "seq", "input_is_full", "input_token_ids",
                "output_token_ids", "output_logprobs", "loss_mask")  # fmt: skip


def assemble_tokens(turns: pa.Table) -> pa.Table:
    """The token sequence of one trajectory from its turn events, as `store/sql.py`'s
    TRAJECTORY_TOKENS_SQL makes it: turns in `seq` order, each its appended input (logprob 0,
    mask 0) then its output (its mask, or 1), restarting at the last turn whose input is full."""
    turns = turns.sort_by("seq")
    full = [i for i, f in enumerate(turns.column("input_is_full").to_pylist()) if f]
    if full:
        turns = turns.slice(full[-1])
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[bool] = []
    for row in turns.select(
        ["input_token_ids", "output_token_ids", "output_logprobs", "loss_mask"]
    ).to_pylist():
        appended, output = row["input_token_ids"] or [], row["output_token_ids"]
        ids += appended + output
        logprobs += [0.0] * len(appended) + row["output_logprobs"]
        mask += [False] * len(appended) + (row["loss_mask"] or [True] * len(output))
    return pa.table(
        {
            "run_id": turns.column("run_id").slice(0, 1),
            "trajectory_id": turns.column("trajectory_id").slice(0, 1),
            "token_ids": pa.array([ids], pa.list_(pa.int32())),
            "logprobs": pa.array([logprobs], pa.list_(pa.float32())),
            "loss_mask": pa.array([mask], pa.list_(pa.bool_())),
        }
    )
