"""Settings of the lake: its Parquet layout, `compact`, `export`, `label` and `search`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trajlake.common.settings import Settings, cli

TokenLayout = Literal["portable", "compact"]
"""How token lists are laid out in Parquet (`LakeConfig.token_layout`)."""

MISMATCH_THRESHOLD = 0.03
"""Healthy train/inference logprob mismatch (`trainer_steps.mismatch`, the mean absolute
difference of trainer and rollout logprobs on tokens the trainer's own weights generated): below this."""


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
    token_layout: TokenLayout = Field(
        "portable",
        description="How token lists (ids, logprobs) are laid out in the files this lake writes. `portable`: "
        "zstd over plain values, read by every Parquet reader (Spark's vectorized reader included). "
        "`compact`: BYTE_STREAM_SPLIT, 13% fewer bytes per token (3.70 against 4.24 on loadgen's events), "
        "which Spark 4.0's vectorized reader rejects (docs/readers.md lists the readers of each); "
        "`compact` keeps files of either layout, `portable` rewrites compact ones (`trajlake compact`).",
    )
    log_retention_hours: int = Field(
        2,
        ge=1,
        description="Hours of Delta log a new table keeps (`delta.logRetentionDuration`; Delta's default "
        "is 30 days). A commit lists the whole log on a local disk: 4.5 ms at 1,400 entries, 169 ms at "
        "100,000, a day of commits every second. A projector further behind than this rebuilds.",
    )


class DuckDBSettings(Settings):
    """DuckDB, the lake's SQL engine in each process (`trajlake sql`, projections, the sampler, dashboards)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_DUCKDB_")

    threads: int | None = Field(
        None, ge=1, description="threads of each DuckDB database (default: the cores this process may run on)"
    )
    memory_limit: str | None = Field(
        None,
        description="memory a DuckDB database may use before it spills to disk, e.g. 8GB, 512MiB or 50% "
        "(default: DuckDB's, 80% of the machine's memory)",
    )

    @field_validator("memory_limit")
    @classmethod
    def _check_memory_limit(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"\d+(\.\d+)?\s*([KMGT]i?B|B|%)", value.strip()):
            raise ValueError("memory_limit must be a size such as 8GB, 512MiB or 50%")
        return value if value is None else value.strip()


class ProjectorConfig(Settings):
    """The projector: the one writer of a lake's projections (`trajlake project`, or a thread beside the sinks)."""

    poll_interval_s: float = Field(
        0.5, gt=0, description="How often a following projector looks for new events commits, in seconds."
    )
    takeover_after_s: float = Field(
        30.0,
        gt=0,
        description="An embedded projector takes over a lake whose projector committed nothing this long "
        "while events waited (it was killed); one that let go is taken over at once.",
    )
    merge_fanin: int = Field(
        10,
        ge=0,
        description="After each catch-up, merge a projection's files once this many of one order of magnitude "
        "(in bytes) pile up: readers open tens of files, not one per commit (0: never; bench/scale.py).",
    )

    @field_validator("merge_fanin")
    @classmethod
    def _check_fanin(cls, value: int) -> int:
        if value == 1:
            raise ValueError("merge_fanin must be 0 (never merge) or at least 2 (TRAJLAKE_MERGE_FANIN)")
        return value


class ProjectSettings(Settings):
    """`trajlake project`: catch up once, or follow."""

    follow: bool = Field(
        False, description="keep following events, projecting each commit, until SIGTERM or SIGINT"
    )


class CompactSettings(Settings):
    """`trajlake compact`: how much history to keep."""

    retention_hours: int = Field(168, ge=0, description="keep unreferenced files younger than this")
    allow_short_retention: bool = Field(False, description="allow a retention below the 168h guard")
    vacuum: bool = Field(
        True,
        description="delete unreferenced files after merging",
        json_schema_extra=cli("--no-vacuum", off="only merge small files; keep the unreferenced ones"),
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
    with_labels: Annotated[list[str], NoDecode] = Field(
        [],
        description="keep only trajectories carrying one of these labels (on themselves or a turn): KEY or "
        "KEY=VALUE, comma-separated, e.g. review=ok",
        json_schema_extra=cli(metavar="KEY[=VALUE],..."),
    )
    without_labels: Annotated[list[str], NoDecode] = Field(
        [],
        description="leave out trajectories carrying one of these labels: KEY or KEY=VALUE, comma-separated, "
        "e.g. env_bug,reward_hack",
        json_schema_extra=cli(metavar="KEY[=VALUE],..."),
    )

    @field_validator("with_labels", "without_labels", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("with_labels", "without_labels")
    @classmethod
    def _label_specs(cls, value: list[str]) -> list[str]:
        return _label_specs(value)


def _comma_list(value: Any) -> Any:
    """A comma-separated option as its list of items."""
    return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value


LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
"""What a label key may be: a word of letters, digits and `_ . : -` (e.g. `env_bug`, `review:ok`)."""


def parse_label_specs(specs: Sequence[str]) -> list[tuple[str, str | None]]:
    """`KEY` or `KEY=VALUE` specs as (key, value or None for any value); a bad key is a ValueError."""
    out = []
    for spec in specs:
        key, eq, value = spec.partition("=")
        if not LABEL_KEY.fullmatch(key.strip()):
            raise ValueError(
                f"label key {key.strip()!r} is not a word: use letters, digits and _ . : - (at most 64), e.g. env_bug"
            )
        out.append((key.strip(), value if eq else None))
    return out


def _label_specs(specs: list[str]) -> list[str]:
    parse_label_specs(specs)
    return specs


class LabelSettings(Settings):
    """`trajlake label`: which trajectories (or turn), which label, by whom (env TRAJLAKE_LABEL_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_LABEL_")

    key: str = Field(..., min_length=1, description="the label, e.g. env_bug or reward_hack")
    value: str = Field("true", min_length=1, description="its value")
    clear: bool = Field(False, description="clear the label instead (the rows before it stay in the table)")
    trajectory: Annotated[list[str], NoDecode] = Field(
        [],
        description="the trajectory ids to label, comma-separated",
        json_schema_extra=cli(metavar="ID,..."),
    )
    sql: str | None = Field(
        None,
        min_length=1,
        description="label the trajectories this SELECT returns (it must return trajectory_id), e.g. "
        "\"select trajectory_id from trajectories where task_id = 'count-3'\"",
    )
    turn: int | None = Field(
        None, ge=0, description="label this turn (turn_index) of each, not the whole trajectory"
    )
    author: str | None = Field(None, min_length=1, description="who labels (default: user@host)")

    @field_validator("trajectory", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: str) -> str:
        return _label_specs([value])[0]

    @model_validator(mode="after")
    def _one_selection(self) -> LabelSettings:
        if bool(self.trajectory) == bool(self.sql):
            raise ValueError(
                "name the trajectories with --trajectory ID,... or select them with --sql (one of them)"
            )
        return self


class SearchSettings(Settings):
    """`trajlake search`: what to look for in a run's turns (env TRAJLAKE_SEARCH_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_SEARCH_")

    regex: str | None = Field(
        None,
        min_length=1,
        description="a regular expression over the turns' decoded text, e.g. 'import pdfplumber'",
    )
    tokens: Annotated[list[int], NoDecode] = Field(
        [],
        description="a run of token ids, comma-separated, e.g. 4,5",
        json_schema_extra=cli(metavar="ID,..."),
    )
    scope: Literal["output", "input", "all"] = Field(
        "output",
        description="search what the model wrote (output), the prompt and tool results (input), or both",
    )
    limit: int = Field(20, ge=0, description="turns hit to list (the counts cover them all)")

    @field_validator("tokens", mode="before")
    @classmethod
    def _split_ids(cls, value: Any) -> Any:
        items = _comma_list(value)
        if isinstance(items, list) and not all(isinstance(v, int) or str(v).strip().isdigit() for v in items):
            raise ValueError("token ids are non-negative integers, comma-separated, e.g. 4,5")
        return items


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
        description="engine mismatch below this (mean |trainer - engine logprob| on tokens of the same weights) "
        "is healthy, however it grows",
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
        description="reward-length: correlation of reward with tokens per turn among samples of one prompt with "
        "as many turns, in a window",
    )
    length_growth: float = Field(
        0.5,
        gt=0,
        description="reward-length: tokens per turn grew by this share since the start",
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
