"""Settings of `trajlake demo` (`DemoConfig`), read from arguments or TRAJLAKE_DEMO_* env vars."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from trajlake.common.settings import cli
from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.warm_start import WarmStartConfig
from trajlake.schemas.settings import KafkaSwitch, LakeSettings

DEFAULT_STEPS = 40
VLLM_STEPS = 60
"""The chat model's RL run: its warm start leaves a smaller, slower rise than the GRU's from scratch."""
CHAT_ENV = {"context_budget_tokens": 120, "max_new_tokens": 48}
"""A chat model's limits where the vocabulary policy's do not fit: a ~15-token prompt, ~25-token calls,
~15-token tool results (cut to the output budget) and ~25-token malformed-call errors. The right call
and the answer take ~57 tokens, a wrong call and the answer ~61; a wrong call, then the right one
takes ~100, past 80% of the budget (96), so the nudge fires before the answer, which still fits; a
malformed call and its retry (~112 before the result) or a turn of 48 babbled tokens and a call run
out of context."""

RAY_MIN_CORES = 4
"""The demo runs its episodes on Ray by default from this many CPU cores. On two, the same 10 steps on
the vLLM engine took 69 s on eight Ray workers and 53 s on eight threads: the engine, which every turn
waits for, needs one core to itself."""


class DemoConfig(LakeSettings, KafkaSwitch):
    """Settings of `trajlake demo` (env TRAJLAKE_DEMO_<FIELD>); the defaults finish in a few minutes on two CPU cores."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_DEMO_")

    stack: Path | None = Field(
        None,
        description="run against the stack `trajlake stack up --dir DIR` started: its Kafka, S3 lake and "
        "PostgreSQL catalog (instead of --lake and --kafka)",
        json_schema_extra=cli(metavar="DIR"),
    )
    engine: Literal["tiny", "vllm"] = Field(
        "vllm",
        description="vllm: a Qwen2 chat model served by vLLM, trained in place; tiny: a GRU policy in each worker.",
    )
    model_dir: str | None = Field(
        None,
        description="vllm: the model directory to serve and train; default <lake>/model (made if missing).",
        json_schema_extra=cli("--model", metavar="DIR"),
    )
    vllm_url: str | None = Field(
        None,
        description="vllm: base URL of a running server (started with weight reload); default: start one.",
    )
    run_id: str | None = Field(
        None, description="Run id; default `demo`, or demo-<UTC time> if the lake has a `demo` run."
    )
    steps: int = Field(
        DEFAULT_STEPS,
        ge=5,
        description=f"Trainer steps (= policy versions) of the main run ({VLLM_STEPS} on vllm).",
    )
    seed: int = Field(0, description="Seed of weights, tasks, sampling and fault injection.")
    groups_per_step: int = Field(8, ge=1, description="Prompt groups per trainer batch.")
    samples_per_group: int = Field(4, ge=2, description="Samples per prompt group (GRPO group size).")
    workers: int | None = Field(
        None,
        ge=1,
        description="Rollout workers (episodes in flight); default 2 on tiny, 8 on vllm (it batches).",
    )
    ray: bool | None = Field(
        None,
        description=f"Run episodes as local Ray tasks, or (--no-ray) on threads in this process; default: Ray "
        f"with at least {RAY_MIN_CORES} CPU cores: on fewer, the Ray workers' share of the CPU slows the engine "
        "that every turn waits for.",
    )
    topic: str | None = Field(None, description="Kafka topic; default trajlake-demo-<run id>.")
    max_staleness: int = Field(
        2, ge=0, description="Trainer version − policy_version_min allowed in a batch."
    )
    lr: float | None = Field(
        None,
        gt=0,
        description="Adam learning rate; default 1e-2 on tiny (a GRU), 1e-4 on vllm (a warm-started transformer: "
        "3e-4 breaks its argument copying, 1e-3 collapses it).",
    )
    overfit_tasks: int = Field(
        32, ge=0, description="Tasks with non-zero reward variance in the overfit check (0: skip)."
    )
    overfit_samples: int = Field(8, ge=2, description="Samples per task in the overfit check.")
    overfit_steps: int = Field(8, ge=1, description="Training steps on the overfit set.")
    overfit_loss: Literal["ppo", "glm5"] | None = Field(
        None,
        description="Policy loss of the overfit check's repeated steps on one batch; default glm5 on tiny (every "
        "token keeps its gradient, so the GRU overfits), ppo on vllm (its clip keeps the warm-started model's "
        "tool-call format, which glm5's unbounded push on the wrong samples broke).",
    )
    bad_messages: int = Field(
        3, ge=0, description="Malformed messages a simulated legacy producer sends (dead letters)."
    )
    fault_rate: float = Field(
        1.0, ge=0, le=20, description="Multiplier of every injected fault rate (0: no faults)."
    )
    env: EnvConfig = Field(
        default_factory=EnvConfig, description="Environment limits and injected fault rates."
    )
    warm_start: WarmStartConfig = Field(
        default_factory=WarmStartConfig,
        description="vllm: the supervised warm start that teaches the model to write tool calls before RL.",
    )

    @model_validator(mode="after")
    def _defaults(self) -> DemoConfig:
        if self.ray is None:
            self.ray = (os.cpu_count() or 1) >= RAY_MIN_CORES
        if self.workers is None:
            self.workers = 8 if self.engine == "vllm" else 2
        if self.lr is None:
            self.lr = 1e-4 if self.engine == "vllm" else 1e-2
        if self.overfit_loss is None:
            self.overfit_loss = "ppo" if self.engine == "vllm" else "glm5"
        if self.engine == "vllm" and "steps" not in self.model_fields_set:
            self.steps = VLLM_STEPS
        if self.engine == "vllm":  # limits the user left unset take the chat model's defaults
            unset = {name: value for name, value in CHAT_ENV.items() if name not in self.env.model_fields_set}
            self.env = EnvConfig.model_validate({**self.env.model_dump(exclude_unset=True), **unset})
        if self.fault_rate != 1.0:
            self.env = self.env.model_copy(update={"faults": self.env.faults.scaled(self.fault_rate)})
            self.fault_rate = 1.0  # applied: a saved config reloads to the same rates
        return self
