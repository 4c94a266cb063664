"""Settings of `trajlake demo` (`DemoConfig`), read from arguments or TRAJLAKE_DEMO_* env vars."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from trajlake.demo.envs.config import EnvConfig
from trajlake.schemas.settings import KafkaSwitch, LakeSettings, cli

DEFAULT_STEPS = 40
CHAT_BUDGET_FROM = EnvConfig().context_budget_tokens
CHAT_CONTEXT_BUDGET = 112


class DemoConfig(LakeSettings, KafkaSwitch):
    """Settings of `trajlake demo` (env TRAJLAKE_DEMO_<FIELD>); the defaults finish in a few minutes on two CPU cores."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_DEMO_")

    engine: Literal["tiny", "vllm"] = Field(
        "vllm",
        description="vllm: a Qwen2 chat model served by vLLM, trained in place; tiny: a GRU policy in each worker.",
    )
    model_dir: str | None = Field(
        None,
        description="vllm: the model directory to serve and train; default <lake>/model (made if missing).",
    )
    vllm_url: str | None = Field(
        None,
        description="vllm: base URL of a running server (started with weight reload); default: start one.",
    )
    run_id: str | None = Field(
        None, description="Run id; default `demo`, or demo-<UTC time> if the lake has a `demo` run."
    )
    steps: int = Field(DEFAULT_STEPS, ge=5, description="Trainer steps (= policy versions) of the main run.")
    seed: int = Field(0, description="Seed of weights, tasks, sampling and fault injection.")
    groups_per_step: int = Field(8, ge=1, description="Prompt groups per trainer batch.")
    samples_per_group: int = Field(4, ge=2, description="Samples per prompt group (GRPO group size).")
    workers: int | None = Field(
        None,
        ge=1,
        description="Rollout workers (episodes in flight); default 2 on tiny, 8 on vllm (it batches).",
    )
    ray: bool = Field(
        True,
        description="Run episodes as local Ray tasks (--no-ray: threads in this process).",
        json_schema_extra=cli("--no-ray"),
    )
    topic: str | None = Field(None, description="Kafka topic; default trajlake-demo-<run id>.")
    max_staleness: int = Field(
        2, ge=0, description="Trainer version − policy_version_min allowed in a batch."
    )
    lr: float | None = Field(
        None,
        gt=0,
        description="Adam learning rate; default 1e-2 on tiny (a GRU), 1e-3 on vllm (a transformer).",
    )
    overfit_tasks: int = Field(
        32, ge=0, description="Tasks with non-zero reward variance in the overfit check (0: skip)."
    )
    overfit_samples: int = Field(8, ge=2, description="Samples per task in the overfit check.")
    overfit_steps: int = Field(8, ge=1, description="Training steps on the overfit set.")
    bad_messages: int = Field(
        3, ge=0, description="Malformed messages a simulated legacy producer sends (dead letters)."
    )
    fault_rate: float = Field(
        1.0, ge=0, le=20, description="Multiplier of every injected fault rate (0: no faults)."
    )
    env: EnvConfig = Field(
        default_factory=EnvConfig, description="Environment limits and injected fault rates."
    )

    @model_validator(mode="after")
    def _defaults(self) -> DemoConfig:
        if self.workers is None:
            self.workers = 8 if self.engine == "vllm" else 2
        if self.lr is None:
            self.lr = 1e-3 if self.engine == "vllm" else 1e-2
        if self.engine == "vllm" and self.env.context_budget_tokens == CHAT_BUDGET_FROM:
            # a chat prompt holds the system prompt and the tool list: ~250 tokens before the task
            self.env = self.env.model_copy(update={"context_budget_tokens": CHAT_CONTEXT_BUDGET})
        if self.fault_rate != 1.0:
            self.env = self.env.model_copy(update={"faults": self.env.faults.scaled(self.fault_rate)})
            self.fault_rate = 1.0  # applied: a saved config reloads to the same rates
        return self
