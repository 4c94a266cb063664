"""Settings of the sampler, the trainer and its commands (`train`, `ablate`, `select-overfit`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from trajlake.common.settings import Settings, cli
from trajlake.schemas.settings import LakeSettings, RunSettings
from trajlake.store.config import MISMATCH_THRESHOLD, CatalogSettings, parse_label_specs

AGGREGATION_MODES = ("token_mean", "sequence_mean", "prompt_mean")
POLICY_LOSSES = ("ppo", "dppo", "dppo_kl", "glm5", "tis")
ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo")
"""Names the loss library (`trajlake.trainer.losses`) implements; kept here so configs import no torch."""


class SamplerConfig(BaseModel):
    """What the sampler hands out and how it packs it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field("demo", min_length=1, description="Run whose trajectories to sample (TRAJLAKE_RUN).")
    max_staleness: int = Field(
        4, ge=0, description="Hand out only trajectories with v − policy_version_min <= this."
    )
    group_size: int | None = Field(
        None,
        ge=1,
        description="Samples per prompt group; None: a group is complete when all its started samples finished.",
    )
    groups_per_batch: int = Field(4, ge=1, description="Prompt groups per batch.")
    group_wait_s: float = Field(
        30.0, ge=0, description="How long to wait for an incomplete group (since its first sample finished)."
    )
    incomplete_groups: Literal["use", "drop"] = Field(
        "use", description="After group_wait_s: train on the samples that finished, or leave the group out."
    )
    drop_zero_variance: bool = Field(
        True, description="Leave out groups whose rewards are all equal (no signal)."
    )
    overlong: Literal["keep", "mask", "drop"] = Field(
        "keep",
        description="Truncated samples (context_exhausted, max_turns, > max_sequence_tokens): keep, zero their loss mask, or drop.",
    )
    max_sequence_tokens: int | None = Field(
        None, ge=1, description="Sequences longer than this count as overlong."
    )
    micro_batch_tokens: int = Field(
        8192, ge=1, description="Token budget of a micro-batch: rows × longest row of its padded tensor."
    )
    lease_ttl_s: float = Field(
        300.0, gt=0, description="Lease lifetime; a crashed rank's trajectories come back after it."
    )
    poll_interval_s: float = Field(
        0.5, gt=0, description="Wait between looks at the lake while no batch is ready."
    )
    token_reader: Literal["events", "view"] = Field(
        "events",
        description="Read token payloads from `events` turns directly (fast) or the `trajectories` view.",
    )
    verifier_version: str = Field(
        "latest",
        min_length=1,
        description="Whose rewards to train on: latest (each trajectory's last reward), original (the one "
        "recorded with the episode) or a verifier version `trajlake rescore` stored; a trajectory that "
        "version did not score counts as without a reward.",
    )
    exclude_labels: list[str] = Field(
        [],
        description="Leave out trajectories carrying one of these labels (on themselves or a turn): KEY or "
        "KEY=VALUE, e.g. env_bug, reward_hack.",
    )

    @field_validator("exclude_labels")
    @classmethod
    def _label_specs(cls, value: list[str]) -> list[str]:
        parse_label_specs(value)  # a ValueError: the settings' own message names the option
        return value


class TrainerConfig(Settings):
    """The reference trainer: model, optimiser, loss and where to write (env TRAJLAKE_TRAINER_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_TRAINER_")

    run_id: str = Field(
        "demo", min_length=1, description="Run to train on and to publish policy versions for."
    )
    steps: int = Field(10, ge=1, description="Optimiser steps to take.")
    seed: int = Field(0, description="Seed of the weights and of any sampling.")
    vocab_size: int | None = Field(None, ge=2, description="Policy vocabulary; None: from the run's events.")
    max_vocab_size: int = Field(
        4096,
        ge=2,
        description="Larger vocabularies are folded (id % max_vocab_size) so the CPU policy stays tiny.",
    )
    d_model: int = Field(64, ge=1, description="Width of the tiny policy.")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    advantage: str = Field("grpo", description=f"Advantage estimator: {', '.join(ADVANTAGE_ESTIMATORS)}.")
    policy_loss: str = Field("ppo", description=f"Policy loss: {', '.join(POLICY_LOSSES)}.")
    aggregation: str = Field("token_mean", description=f"Loss aggregation: {', '.join(AGGREGATION_MODES)}.")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO / GLM-5 lower clip ε.")
    clip_high: float = Field(0.28, ge=0, description="PPO / GLM-5 upper clip ε.")
    dppo_delta: float = Field(0.2, gt=0, description="DPPO trust-region threshold δ.")
    tis_cap: float = Field(2.0, gt=0, description="Token-level TIS cap C.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature the rollouts used.")
    mismatch_threshold: float = Field(
        MISMATCH_THRESHOLD, gt=0, description="Healthy mean |rollout − trainer| logprob difference."
    )
    checkpoint_dir: str | None = Field(
        None, description="Where checkpoints go; None: <lake>/checkpoints/<run>."
    )
    rank: int = Field(0, ge=0, description="This trainer's rank (leases and trainer_steps rows carry it).")
    token_values_every: int = Field(
        1,
        ge=0,
        description="Keep the per-token trainer values (`trainer_tokens`: logprob, entropy, ratio, clipped, "
        "masked) of every N-th step, from step 0; 0: none.",
    )
    sampler: SamplerConfig = Field(
        default_factory=lambda: SamplerConfig.model_validate({}), description="Sampler settings."
    )

    @model_validator(mode="after")
    def _known_names(self) -> TrainerConfig:
        problems = []
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            problems.append(f"advantage must be one of {ADVANTAGE_ESTIMATORS} (got {self.advantage!r})")
        if self.policy_loss not in POLICY_LOSSES:
            problems.append(f"policy_loss must be one of {POLICY_LOSSES} (got {self.policy_loss!r})")
        if self.aggregation not in AGGREGATION_MODES:
            problems.append(f"aggregation must be one of {AGGREGATION_MODES} (got {self.aggregation!r})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def loss_params(self) -> dict[str, float]:
        """Keyword arguments of `losses.policy_loss` for the configured loss."""
        if self.policy_loss in ("ppo", "glm5"):
            return {"clip_low": self.clip_low, "clip_high": self.clip_high}
        if self.policy_loss in ("dppo", "dppo_kl"):
            return {"delta": self.dppo_delta}
        return {"cap": self.tis_cap}


class AblationConfig(RunSettings):
    """Which configurations to compare, on how much data, with how many seeds (env TRAJLAKE_ABLATE_<FIELD>).

    A run whose trainer recorded its model is replayed through it, batch by batch as it consumed
    them; the settings marked "fresh GRU" apply to runs without one (e.g. loadgen, imports)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_ABLATE_")

    aggregations: Annotated[list[str], NoDecode] = Field(
        ["token_mean", "sequence_mean", "prompt_mean"],
        min_length=1,
        description=f"Aggregation modes, comma-separated: {', '.join(AGGREGATION_MODES)}.",
        json_schema_extra=cli("--aggregation"),
    )
    policy_losses: Annotated[list[str], NoDecode] = Field(
        ["ppo", "dppo", "glm5"],
        min_length=1,
        description=f"Policy losses, comma-separated: {', '.join(POLICY_LOSSES)}.",
        json_schema_extra=cli("--policy-loss"),
    )
    steps: int = Field(2, ge=1, description="Batches to replay (the run's first consumed ones).")
    seeds: int = Field(
        3, ge=1, description="Fresh GRU: seeds (initial weights) per configuration (the run's model: one)."
    )
    train: bool = Field(False, description="Take an optimiser step per batch (else evaluate only).")
    groups_per_batch: int = Field(4, ge=1, description="Fresh GRU: prompt groups per replayed batch.")
    micro_batch_tokens: int = Field(
        262_144,
        ge=1,
        description="Token budget per micro-batch where the run recorded none (large: the GRU costs per "
        "time step, not per row).",
    )
    advantage: str | None = Field(
        None, description="Advantage estimator; default the run's (as its trainer recorded it), else grpo."
    )
    lr: float | None = Field(
        None, gt=0, description="Learning rate when training; default the run's, else 1e-3."
    )
    max_vocab_size: int = Field(
        256, ge=2, description="Fresh GRU: fold larger vocabularies (id % this): the head dominates CPU time."
    )
    d_model: int = Field(
        32, ge=1, description="Fresh GRU: its width (small: ablations replay many configurations)."
    )
    verifier_version: str = Field(
        "latest",
        min_length=1,
        description="Whose rewards the replay trains on: latest, original, or a version `trajlake rescore` "
        "stored (a trajectory it did not score is left out of its batch).",
    )
    verify_step: int | None = Field(
        None,
        ge=0,
        description="Instead of ablating, check that the replay reproduces this trainer step: recompute its "
        "loss, grad norm, engine mismatch, drift and advantages from its checkpoint and batch, beside what "
        "the trainer recorded; exit 1 when one is out of tolerance.",
    )

    @field_validator("aggregations", "policy_losses", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    def trainer_config(self, aggregation: str, policy_loss: str, seed: int) -> TrainerConfig:
        """The TrainerConfig of one configuration and seed (validates the names)."""
        return TrainerConfig(
            run_id=self.run_id, seed=seed, aggregation=aggregation, policy_loss=policy_loss,
            advantage=self.advantage or "grpo", lr=self.lr or 1e-3, max_vocab_size=self.max_vocab_size, d_model=self.d_model,
        )  # fmt: skip


class AblateOutput(Settings):
    """`trajlake ablate`: where the report goes besides the terminal."""

    json_path: str | None = Field(
        None,
        validation_alias="TRAJLAKE_ABLATE_JSON",
        description="also write the report as JSON to PATH",
        json_schema_extra=cli("--json", metavar="PATH"),
    )


class OverfitSettings(Settings):
    """`trajlake select-overfit`: how many tasks, with how many samples each."""

    n: int = Field(32, ge=1, description="tasks wanted")
    min_samples: int = Field(2, ge=1, description="samples a task needs")


class TrainSettings(LakeSettings, RunSettings, CatalogSettings):
    """`trajlake train`: where the run's data and catalog are, and how long to wait for data."""

    wait_s: float = Field(0.0, ge=0, description="seconds to wait for a batch before stopping")
    trainer_config: str | None = Field(
        None, description="JSON object of TrainerConfig fields", json_schema_extra=cli("--config")
    )
