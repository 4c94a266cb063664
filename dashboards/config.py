"""Settings of the dashboards: the Streamlit app and `trajlake metrics`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from trajlake.schemas.settings import LakeSettings, Settings, cli
from trajlake.store.config import TokenizerSettings

DEFAULT_SUCCESS_THRESHOLD = 1.0
MAX_LIVE_INTERVAL_S = 3600


class ThresholdSettings(Settings):
    """When a sample counts as passed."""

    success_threshold: float = Field(
        DEFAULT_SUCCESS_THRESHOLD, description="a sample passes when its reward is >= this"
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
        json_schema_extra=cli(option="--live-interval", metavar="SECONDS"),
    )


class ServeSettings(Settings):
    """Where `trajlake dashboard` serves the app."""

    host: str = Field("127.0.0.1", description="address to bind (default: this machine only)")
    port: int = Field(8501, ge=0, le=65535, description="port to serve on")
