"""The lake's tables as stored: their names, Arrow schemas, statistics columns and Delta properties."""

from __future__ import annotations

import pyarrow as pa

from trajlake.schemas.tables import STORED_EVENTS_SCHEMA, TABLE_SCHEMAS
from trajlake.store.config import LakeConfig

TABLES = ("events", *TABLE_SCHEMAS)
SCHEMAS: dict[str, pa.Schema] = {"events": STORED_EVENTS_SCHEMA, **TABLE_SCHEMAS}
STATS_COLUMNS = ("run_id", "trajectory_id", "seq", "event_type", "step", "event_time", "group_id",
                 "policy_version_min", "finished", "started_at")  # fmt: skip
"""Columns whose min/max go into the Delta log, so readers can skip files (`files_within`; the
sampler's staleness window and groups) or answer from the log alone (the dashboards' run list)."""

CHECKPOINT_INTERVAL = 10
"""Commits between the Delta checkpoints delta-rs writes after a commit (its default: 100). A
reader opens a table from its last checkpoint and replays each commit after it: at 160 files,
0.08 s with 95 commits to replay and 0.007-0.02 s from a checkpoint at its head; writing one took
0.09 s. An engine opens six tables."""


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """`data` with `schema`'s columns in its order and types; a column it lacks reads as null."""
    if data.schema.equals(schema):
        return data
    missing = [f.name for f in schema if f.name not in data.column_names]
    for name in missing:
        data = data.append_column(name, pa.nulls(data.num_rows, schema.field(name).type))
    return data.select(schema.names).cast(schema)


def table_properties(name: str, config: LakeConfig) -> dict[str, str]:
    """The Delta properties a new table of `name` is created with: its checkpoint interval, how
    long its log keeps a commit, and which columns have statistics (`STATS_COLUMNS`: what our
    writer records, and what delta-rs reads back, where it would otherwise keep only the first 32
    columns' and drop e.g. `trajectories.started_at`; its MERGE writes the same)."""
    properties = {
        "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "delta.logRetentionDuration": f"interval {config.log_retention_hours} hours",
    }
    columns = [c for c in STATS_COLUMNS if c in SCHEMAS[name].names]
    if columns:
        properties["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return properties
