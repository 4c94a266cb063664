"""Settings of the rollout toolkit: TITO client, tool runner, judge, workers, sandboxes.

Defaults run on a laptop. Every field can be set from the environment through `from_env`
(`TRAJLAKE_<PREFIX>_<FIELD>`, e.g. `TRAJLAKE_TITO_TIMEOUT_S=30`).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    env_prefix: ClassVar[str] = ""  # TRAJLAKE_<env_prefix>_<FIELD>

    @classmethod
    def from_env(cls, **overrides: Any) -> Self:
        """The config with every field found as `TRAJLAKE_<PREFIX>_<FIELD>` in the environment."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            key = f"TRAJLAKE_{cls.env_prefix}_{name.upper()}"
            if key in os.environ:
                values[name] = os.environ[key]
        values.update(overrides)
        return cls(**values)


class RetryConfig(_Config):
    """Exponential backoff with full jitter."""

    env_prefix: ClassVar[str] = "RETRY"
    max_attempts: int = Field(4, ge=1, le=100, description="Attempts in all, the first one included.")
    initial_backoff_s: float = Field(0.5, ge=0, description="Delay before the first retry.")
    max_backoff_s: float = Field(20.0, ge=0, description="Ceiling of any one delay.")
    multiplier: float = Field(2.0, ge=1, description="Growth of the delay per retry.")
    jitter: float = Field(
        1.0, ge=0, le=1, description="Fraction of each delay drawn at random (1 = full jitter)."
    )


class TitoConfig(_Config):
    """The token-in-token-out client of vLLM's `/v1/completions`."""

    env_prefix: ClassVar[str] = "TITO"
    base_url: str = Field("http://127.0.0.1:8000", description="vLLM server root (without /v1).")
    model: str = Field("default", description="Model name the server serves.")
    route: Literal["completions", "generate"] = Field(
        "completions",
        description="/v1/completions, or vLLM's /inference/v1/generate (--enable-scale-out; reports weight versions).",
    )
    max_connections: int = Field(64, ge=1, description="Pooled keep-alive connections to the server.")
    api_key: str | None = Field(None, description="Bearer token, if the server wants one.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Time to open a connection.")
    timeout_s: float = Field(600.0, gt=0, description="Time for one whole completion request.")
    retry: RetryConfig = Field(
        default_factory=RetryConfig, description="Retries on connect errors, 429 and 5xx."
    )


class ToolRunnerConfig(_Config):
    """Tool calls: timeouts, output budget, malformed-call retries, the context nudge."""

    env_prefix: ClassVar[str] = "TOOLS"
    timeout_s: float = Field(30.0, gt=0, description="Wall-clock limit of one tool call.")
    max_output_tokens: int = Field(
        2048, ge=1, description="Tool output beyond this many tokens is truncated."
    )
    truncation_marker: str = Field(
        "\n[... output truncated ...]", description="Appended to truncated output."
    )
    max_malformed_retries: int = Field(
        3, ge=0, description="Malformed calls the model may retry per turn before it is a model failure."
    )
    nudge_threshold: float = Field(
        0.8, gt=0, le=1, description="Fraction of the context budget at which the nudge fires, once."
    )
    nudge_text: str = Field(
        "You have used most of your context budget. Wrap up and give your final answer.",
        description="Message inserted as the context nudge.",
    )


class JudgeConfig(_Config):
    """LLM-judge calls over an OpenAI-compatible chat API, rotating across API keys."""

    env_prefix: ClassVar[str] = "JUDGE"
    base_url: str = Field("http://127.0.0.1:8001", description="Judge server root (without /v1).")
    model: str = Field("judge", description="Judge model name.")
    api_keys: tuple[str, ...] = Field(
        ("",), min_length=1, description="Keys to rotate across (comma-separated in the env var)."
    )
    timeout_s: float = Field(60.0, gt=0, description="Time for one judge request.")
    retry: RetryConfig = Field(
        default_factory=lambda: RetryConfig(max_attempts=8), description="Backoff on rate limits."
    )

    @model_validator(mode="before")
    @classmethod
    def _split_keys(cls, values: Any) -> Any:
        if isinstance(values, dict) and isinstance(values.get("api_keys"), str):
            values = {
                **values,
                "api_keys": tuple(k.strip() for k in values["api_keys"].split(",") if k.strip()),
            }
        return values


class WorkerConfig(_Config):
    """How agent loops run: each in its own Ray task (process isolation), or in threads."""

    env_prefix: ClassVar[str] = "WORKERS"
    type: Literal["ray", "threads"] = Field(
        "ray", description="Backend: ray (a crash kills one task only) or threads."
    )
    num_cpus: int = Field(2, ge=1, description="CPUs for a local Ray runtime started by the pool.")
    max_concurrency: int = Field(4, ge=1, description="Agent loops in flight at once (threads backend).")
    task_timeout_s: float | None = Field(
        None, gt=0, description="Wall-clock limit per agent loop (None = no limit)."
    )


class SandboxConfig(_Config):
    """Where tool commands run: a local subprocess or a Modal sandbox."""

    env_prefix: ClassVar[str] = "SANDBOX"
    type: Literal["local", "modal"] = Field("local", description="Backend.")
    create_timeout_s: float = Field(120.0, gt=0, description="Limit on creating the sandbox.")
    exec_timeout_s: float = Field(60.0, gt=0, description="Default limit on one command.")
    terminate_timeout_s: float = Field(30.0, gt=0, description="Limit on tearing the sandbox down.")
    image: str = Field("python:3.11-slim", description="Container image (modal).")
    app_name: str = Field("trajlake-sandboxes", description="Modal app the sandboxes belong to.")
    workdir: str | None = Field(None, description="Working directory (local: a fresh temp dir when None).")
