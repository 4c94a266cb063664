"""Settings of the lake's Parquet layout."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


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
