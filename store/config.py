"""Settings of the lake: its Parquet layout, `compact` and `export`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from trajlake.schemas.settings import Settings, cli

MISMATCH_THRESHOLD = 0.03
"""Healthy train/inference logprob mismatch (`trainer_steps.mismatch`, the mean absolute
difference of trainer and rollout logprobs): below this."""


class LakeConfig(BaseModel):
    """How the lake writes Parquet files (tokens dominate its bytes, so this matters)."""

    model_config = ConfigDict(extra="forbid")

    compression: str = Field("zstd", description="Parquet codec for every column.")
    compression_level: int = Field(
        1, ge=1, le=22, description="zstd level; 1 is as small as 3 here and twice as fast."
    )
    row_group_rows: int = Field(
        8 * 1024,
        ge=1024,
        description="Rows per Parquet row group: a point lookup in a compacted events file decodes the "
        "groups around its trajectory (8k: 20 ms warm against 26 ms at 16k; cold lookups, scans and size "
        "unchanged; 4k: 18.5 ms, with a footer twice the size).",
    )
    byte_stream_split: bool = Field(
        True,
        description="BYTE_STREAM_SPLIT for token lists (ids, logprobs): each about 20% smaller with zstd, and faster.",
    )
    log_retention_hours: int = Field(
        2,
        ge=1,
        description="Hours of Delta log a new table keeps (`delta.logRetentionDuration`; Delta's default "
        "is 30 days). A commit lists the whole log on a local disk: 4.5 ms at 1,400 entries, 169 ms at "
        "100,000, a day of commits every second. A projector further behind than this rebuilds.",
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


class HealthSettings(Settings):
    """When a run's learning signals raise an alert (`trajlake doctor`, the Health page).

    Every signal is judged per window of `window` trainer steps (rollout figures: policy
    versions), against the run's own start, so the thresholds do not depend on the model's scale.
    Env TRAJLAKE_HEALTH_<FIELD>.
    """

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_HEALTH_")

    window: int = Field(5, ge=2, description="trainer steps (or policy versions) per window")
    min_samples: int = Field(
        20, ge=1, description="a window with fewer trajectories, tool calls or turns than this is not judged"
    )
    entropy_drop_per_step: float = Field(
        0.10,
        gt=0,
        description="entropy collapse: a window's entropy falls faster than this share of the start per step",
    )
    entropy_floor: float = Field(
        0.10,
        gt=0,
        lt=1,
        description="entropy collapse: a window's mean entropy is below this share of the start",
    )
    mismatch_floor: float = Field(
        MISMATCH_THRESHOLD,
        ge=0,
        description="mismatch below this (mean |trainer - sampler logprob|) is healthy, however it grows",
    )
    mismatch_growth: float = Field(
        2.0,
        gt=1,
        description="mismatch acceleration: a window's mean is this many times the previous window's",
    )
    reward_length_corr: float = Field(
        0.5,
        gt=0,
        le=1,
        description="reward-length: correlation of reward with output tokens (or turns) in a window",
    )
    length_growth: float = Field(
        0.5,
        gt=0,
        description="reward-length: output tokens (or turns) per trajectory grew by this share since the start",
    )
    advantage_mean_ratio: float = Field(
        0.5, gt=0, le=1, description="advantage drift: |mean| / mean |advantage| of a window above this"
    )
    advantage_std_floor: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="advantage drift: a window's advantage std below this share of the start's",
    )
    tool_error_increase: float = Field(
        0.15,
        gt=0,
        le=1,
        description="tool-error spike: a window's error rate above the earlier rate by this much",
    )
    tool_error_z: float = Field(
        4.0, gt=0, description="tool-error spike: ... and by this many binomial standard errors"
    )
    max_repetition: float = Field(
        0.5, gt=0, le=1, description="garbled output: a turn repeating more than this share of its 4-grams"
    )
    max_nonprintable: float = Field(
        0.05,
        gt=0,
        le=1,
        description="garbled output: a decoded turn with more than this share of unprintable characters",
    )
    garbled_share: float = Field(
        0.2,
        gt=0,
        le=1,
        description="garbled output: alert when more than this share of a window's turns is garbled",
    )
    garbled_min_tokens: int = Field(
        16, ge=2, description="garbled output: judge turns of at least this many output tokens"
    )
    garbled_sample: int = Field(
        200,
        ge=1,
        description="garbled output: about this many of each window's latest turns are read and decoded for "
        "unprintable text, when the run has a local tokenizer (token lists are large: a read per window)",
    )
