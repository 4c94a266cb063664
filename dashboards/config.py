"""Settings of the dashboards: the Streamlit app and `trajlake metrics`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from trajlake.common.settings import Settings, cli
from trajlake.dashboards.passk import MIN_TASKS
from trajlake.schemas.settings import DEFAULT_SUCCESS_THRESHOLD as DEFAULT_SUCCESS_THRESHOLD
from trajlake.schemas.settings import LakeSettings, PassSettings
from trajlake.store.config import TokenizerSettings

MAX_LIVE_INTERVAL_S = 3600


class ThresholdSettings(PassSettings):
    """When a sample counts as passed, and how many tasks a pass@k must stand on to be shown."""

    min_tasks: int = Field(
        MIN_TASKS,
        ge=1,
        description="show pass@k (overall and per policy version) only where at least this many tasks "
        "have k or more scored samples; fewer: the value is hidden and the count shown",
    )


class CompareSettings(Settings):
    """Which runs `trajlake metrics --runs` puts side by side, and which of its tables it prints."""

    run_ids: Annotated[list[str], NoDecode] = Field(
        [],
        validation_alias="TRAJLAKE_RUNS",
        description="runs to compare, comma-separated: overlaid by policy version and by trainer step",
        json_schema_extra=cli("--runs", metavar="RUN,RUN,..."),
    )
    by: Literal["version", "step"] = Field(
        "version",
        description="with --runs, the table to print: by policy version or by trainer step; json holds both",
    )

    @field_validator("run_ids", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",")]
        return list(dict.fromkeys(v for v in value if v)) if isinstance(value, list) else value


class AppSettings(LakeSettings, ThresholdSettings, TokenizerSettings):
    """What the Streamlit app shows; `trajlake dashboard` passes them to it as env vars."""

    live_interval_s: int = Field(
        10,
        ge=1,
        le=MAX_LIVE_INTERVAL_S,
        description="seconds between rereads of the lake when the sidebar's Live toggle is on",
    )


class ServeSettings(Settings):
    """Where `trajlake dashboard` serves the app."""

    host: str = Field("127.0.0.1", description="address to bind (default: this machine only)")
    port: int = Field(8501, ge=0, le=65535, description="port to serve on")
