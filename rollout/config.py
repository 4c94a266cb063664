"""Settings of the rollout toolkit: TITO client, tool runner, judge, workers, sandboxes.

Defaults run on a laptop. `Config.from_env()` reads every field from the environment
(`TRAJLAKE_<PREFIX>_<FIELD>`, e.g. `TRAJLAKE_TITO_TIMEOUT_S=30`; nested fields with `__`, e.g.
`TRAJLAKE_TITO_RETRY__MAX_ATTEMPTS=8`); a config built in code reads none.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trajlake.common.settings import Settings, cli


class _Config(Settings):
    model_config = SettingsConfigDict(frozen=True)


class RetryConfig(_Config):
    """Exponential backoff with full jitter."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_RETRY_")

    max_attempts: int = Field(4, ge=1, le=100, description="Attempts in all, the first one included.")
    initial_backoff_s: float = Field(0.5, ge=0, description="Delay before the first retry.")
    max_backoff_s: float = Field(20.0, ge=0, description="Ceiling of any one delay.")
    multiplier: float = Field(2.0, ge=1, description="Growth of the delay per retry.")
    jitter: float = Field(
        1.0, ge=0, le=1, description="Fraction of each delay drawn at random (1 = full jitter)."
    )


class TitoConfig(_Config):
    """The token-in-token-out client of vLLM's `/v1/completions`."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_TITO_")

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

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_TOOLS_")

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

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_JUDGE_")

    base_url: str = Field("http://127.0.0.1:8001", description="Judge server root (without /v1).")
    model: str = Field("judge", description="Judge model name.")
    api_keys: Annotated[tuple[str, ...], NoDecode] = Field(
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

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_WORKERS_")

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

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_SANDBOX_")

    type: Literal["local", "modal"] = Field("local", description="Backend.")
    create_timeout_s: float = Field(120.0, gt=0, description="Limit on creating the sandbox.")
    exec_timeout_s: float = Field(60.0, gt=0, description="Default limit on one command.")
    terminate_timeout_s: float = Field(30.0, gt=0, description="Limit on tearing the sandbox down.")
    image: str = Field("python:3.11-slim", description="Container image (modal).")
    app_name: str = Field("trajlake-sandboxes", description="Modal app the sandboxes belong to.")
    workdir: str | None = Field(None, description="Working directory (local: a fresh temp dir when None).")


class LoadgenConfig(Settings):
    """Shape of the synthetic workload."""

    trajectories: int = Field(100, ge=1, description="Number of trajectories.")
    run_id: str = Field(
        "loadgen",
        min_length=1,
        description="Run id of every event.",
        json_schema_extra=cli(aliases=["--run-id"]),
    )
    turns: int = Field(6, ge=1, description="Mean turns per trajectory.")
    max_turns: int = Field(32, ge=1, description="Turn limit (status max_turns when reached).")
    prompt_tokens: int = Field(512, ge=1, description="Mean prompt tokens.")
    output_tokens: int = Field(256, ge=1, description="Mean output tokens per turn.")
    env_tokens: int = Field(128, ge=0, description="Mean tool-output tokens appended per turn.")
    tool_call_rate: float = Field(
        0.8, ge=0, le=1, description="Probability that a non-final turn calls a tool."
    )
    tool_error_rate: float = Field(0.1, ge=0, le=1, description="Probability that a tool call fails.")
    tool_timeout_rate: float = Field(0.02, ge=0, le=1, description="Probability that a tool call times out.")
    truncation_rate: float = Field(0.05, ge=0, le=1, description="Probability that tool output is truncated.")
    system_failure_rate: float = Field(0.05, ge=0, le=1, description="Probability of a system failure.")
    policy_versions: int = Field(8, ge=1, description="Policy versions spread over the run.")
    group_size: int = Field(8, ge=1, description="Samples per prompt group (GRPO n).")
    vocab_size: int = Field(151_936, ge=16, description="Vocabulary size (ids drawn below it).")
    context_budget_tokens: int = Field(32_768, ge=64, description="Context budget per trajectory.")
    zipf_a: float = Field(1.1, gt=1.0, description="Zipf exponent of token frequencies.")
    seed: int = Field(0, description="Random seed; the same seed gives the same tokens and outcomes.")
    first_group: int = Field(
        0,
        ge=0,
        description="Index of the first prompt group (a run grown by several calls keeps its groups apart).",
    )
    first_version: int = Field(0, ge=0, description="Policy version of the first trajectories.")

    @model_validator(mode="after")
    def _turns_within_limit(self) -> LoadgenConfig:
        if self.turns > self.max_turns:
            raise ValueError(
                f"turns ({self.turns}) must be <= max_turns ({self.max_turns}); raise --max-turns"
            )
        return self


class ImportSettings(Settings):
    """`trajlake import`: the run the imported trajectories go to, and the version that made them."""

    run_id: str = Field(
        ...,
        min_length=1,
        validation_alias="TRAJLAKE_IMPORT_RUN_ID",
        description="run id the trajectories are stored under",
        json_schema_extra=cli(aliases=["--run-id"]),
    )
    policy_version: int | None = Field(
        None,
        ge=0,
        validation_alias="TRAJLAKE_IMPORT_POLICY_VERSION",
        description="policy version of the imported turns whose source records none; unset: unknown "
        "(stored as null, and the sampler leaves those trajectories out)",
    )


class DoctorSettings(Settings):
    """`trajlake doctor`: when a run is unhealthy, and the tokenizer that reads its text."""

    max_system_error_rate: float = Field(
        0.05, ge=0, le=1, description="exit 1 when the share of system failures is above this"
    )
    tokenizer: str | None = Field(
        None,
        validation_alias="TRAJLAKE_DOCTOR_TOKENIZER",
        description="tokenizer for the unprintable-text check: a local model or tokenizer directory, or a "
        "tokenizer.json (default: the run's recorded model)",
    )


class RescoreSettings(Settings):
    """`trajlake rescore`: which verifier judges which stored trajectories again (env TRAJLAKE_RESCORE_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_RESCORE_")

    verifier: str = Field(
        ...,
        min_length=1,
        description="the verifier: MODULE:FUNC (an importable module, or a path to a .py file) of a function "
        "that takes a StoredTrajectory and returns a reward, a dict of its parts or a Score",
        json_schema_extra=cli(metavar="MODULE:FUNC"),
    )
    verifier_version: str | None = Field(
        None,
        min_length=1,
        description="the version its rewards are stored under (default: the function's `version` attribute, "
        "else its name and a hash of its module's source)",
    )
    sql: str | None = Field(
        None,
        min_length=1,
        description="only the trajectories this SELECT returns (it must return trajectory_id), e.g. "
        "\"select trajectory_id from trajectories where task_id like 'count%'\"; default: every finished one",
    )
    batch: int = Field(500, ge=1, description="trajectories read, and rewards committed, at a time")


class AgentLightningSettings(Settings):
    """`trajlake import agent-lightning`: the server to poll and how (env TRAJLAKE_AGL_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_AGL_")

    server: str = Field(
        ..., min_length=1, description="Agent Lightning server root, e.g. http://127.0.0.1:8080"
    )
    key: str | None = Field(None, description="the server's API key (its `key` setting), if it has one")
    follow: bool = Field(
        False,
        description="keep polling for newly finished rollouts until interrupted (default: stop when caught up)",
    )
    poll_interval_s: float = Field(
        1.0, gt=0, le=3600, description="wait between polls once caught up (--follow)"
    )
    page_size: int = Field(100, ge=1, le=1000, description="terminal rollouts read (and committed) per page")
    timeout_s: float = Field(30.0, gt=0, description="time for one request to the server")
    progress_interval_s: float = Field(
        30.0,
        gt=0,
        le=86400,
        description="with --follow, print a progress line this often (on a pipe too, and while idle)",
    )
