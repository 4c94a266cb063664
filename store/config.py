"""Settings of the lake: its Parquet layout, `compact` and `export`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from trajlake.schemas.settings import Settings, cli


class LakeConfig(BaseModel):
    """How the lake writes Parquet files (tokens dominate its bytes, so this matters)."""

    model_config = ConfigDict(extra="forbid")

    compression: str = Field("zstd", description="Parquet codec for every column.")
    compression_level: int = Field(
        1, ge=1, le=22, description="zstd level; 1 is as small as 3 here and twice as fast."
    )
    row_group_rows: int = Field(128 * 1024, ge=1024, description="Rows per Parquet row group.")
    byte_stream_split_floats: bool = Field(
        True, description="BYTE_STREAM_SPLIT for float lists (logprobs): about 20% smaller with zstd."
    )


class CompactSettings(Settings):
    """`trajlake compact`: how much history to keep."""

    retention_hours: int = Field(168, ge=0, description="keep unreferenced files younger than this")
    allow_short_retention: bool = Field(False, description="allow a retention below the 168h guard")
    vacuum: bool = Field(
        True,
        description="delete unreferenced files after merging (--no-vacuum: only merge small files)",
        json_schema_extra=cli("--no-vacuum"),
    )


class CatalogSettings(Settings):
    """Where the catalog (runs, leases, policy versions) lives."""

    catalog_url: str | None = Field(
        None,
        description="catalog URL, e.g. postgresql+psycopg://…; unset: SQLite in the lake",
        json_schema_extra=cli("--catalog"),
    )


class TokenizerSettings(Settings):
    """Which tokenizer turns token ids into text (`trajlake sql`'s detokenize(), the dashboard's browser)."""

    tokenizer: str | None = Field(
        None,
        description="local model or tokenizer directory (or tokenizer.json) that decodes token ids, "
        "whatever model a run recorded (default: each run's recorded model)",
        json_schema_extra=cli(metavar="DIR"),
    )


class ExportSettings(Settings):
    """`trajlake export`: which trajectories, in which format, where (env TRAJLAKE_EXPORT_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_EXPORT_")

    sql: str = Field(
        ...,
        min_length=1,
        description='SELECT over the lake returning trajectory_id (and run_id), e.g. "select run_id, '
        "trajectory_id, reward from trajectories where status = 'completed'\"",
    )
    format: Literal["parquet", "jsonl", "hf"] = Field(
        "parquet", description="parquet files, JSON Lines, or a Hugging Face dataset directory"
    )
    out: str = Field(..., min_length=1, description="output directory (created if missing)")
    force: bool = Field(False, description="write into a non-empty directory, replacing earlier exports")
    tokenizer: str | None = Field(
        None,
        description="local tokenizer directory for the `messages` text (default: the run's recorded model)",
    )
    batch_rows: int = Field(1024, ge=1, description="trajectories read and written per batch")
    rows_per_file: int = Field(100_000, ge=1, description="trajectories per output file")
