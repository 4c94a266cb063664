"""Settings of the lake: its Parquet layout, and `compact`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

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
