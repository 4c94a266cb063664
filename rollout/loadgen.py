"""Synthetic agent-RL workload: realistic event streams written through the Recorder and a bus.

Token ids follow a Zipf law over the vocabulary (frequent tokens have small ids, as in BPE
vocabularies); logprobs are mostly near 0 with a heavy tail, as sampled tokens are. Tasks
have a difficulty, prompt groups hold several samples of one task, policy versions advance
over the run (some trajectories span two), tools fail, time out and truncate at
configurable rates, and a fraction of trajectories end in system failures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajlake.ingest.bus.base import Bus
from trajlake.rollout.recorder import Recorder

TOOLS = (("python", True), ("bash", True), ("search", False), ("calculator", False), ("file_edit", False))
ENVIRONMENTS = ("swe", "math", "web")
SYSTEM_LABELS = ("infra", "env_dependency", "verifier_error", "harness_behavior", "tool_design")


class LoadgenConfig(BaseModel):
    """Shape of the synthetic workload."""

    model_config = ConfigDict(extra="forbid")

    trajectories: int = Field(100, ge=1, description="Number of trajectories.")
    run_id: str = Field("loadgen", min_length=1, description="Run id of every event.")
    turns: int = Field(6, ge=1, description="Mean turns per trajectory.")
    max_turns: int = Field(32, ge=1, description="Turn limit (status max_turns when reached).")
    prompt_tokens: int = Field(512, ge=1, description="Mean prompt tokens.")
    output_tokens: int = Field(256, ge=1, description="Mean output tokens per turn.")
    env_tokens: int = Field(128, ge=0, description="Mean tool-output tokens appended per turn.")
    tool_call_rate: float = Field(0.8, ge=0, le=1, description="Probability that a non-final turn calls a tool.")
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

    @model_validator(mode="after")
    def _turns_within_limit(self) -> LoadgenConfig:
        if self.turns > self.max_turns:
            raise ValueError(f"turns ({self.turns}) must be <= max_turns ({self.max_turns}); raise --max-turns")
        return self


@dataclass
class LoadgenCounts:
    """What a run produced."""

    events: int = 0
    trajectories: int = 0
    turns: int = 0
    tokens: int = 0
    messages: int = 0


class TokenSampler:
    """Zipf-distributed token ids and realistic logprobs, drawn in bulk with numpy."""

    def __init__(self, vocab_size: int, zipf_a: float, rng: np.random.Generator) -> None:
        self.rng = rng
        ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
        weights = ranks**-zipf_a
        self.cdf = np.cumsum(weights / weights.sum())

    def ids(self, n: int) -> np.ndarray:
        ids = np.searchsorted(self.cdf, self.rng.random(n))
        return np.minimum(ids, len(self.cdf) - 1).astype(np.int32)

    def logprobs(self, n: int) -> np.ndarray:
        """Mostly confident tokens (near 0), some uncertain, a heavy tail of surprising ones."""
        kind = self.rng.random(n)
        lp = -self.rng.exponential(0.003, n)
        mid = kind > 0.75
        lp[mid] = -self.rng.exponential(0.6, int(mid.sum()))
        tail = kind > 0.96
        lp[tail] = -self.rng.exponential(4.0, int(tail.sum()))
        return np.maximum(lp, -60.0).astype(np.float32)


def _length(rng: np.random.Generator, mean: int) -> int:
    return max(1, int(rng.gamma(4.0, mean / 4.0)))


def generate(bus: Bus, config: LoadgenConfig, on_trajectory: Callable[[int], None] | None = None) -> LoadgenCounts:
    """Write `config.trajectories` synthetic trajectories to `bus`; return what was produced."""
    rng = np.random.default_rng(config.seed)
    tokens = TokenSampler(config.vocab_size, config.zipf_a, rng)
    recorder = Recorder(bus, config.run_id, producer_id="loadgen", vocab_size=config.vocab_size, flush_each_turn=False)
    counts = LoadgenCounts()
    n_groups = max(1, -(-config.trajectories // config.group_size))
    difficulty = rng.beta(1.5, 1.5, n_groups)
    per_version = max(1, config.trajectories // config.policy_versions)
    version = -1
    for i in range(config.trajectories):
        v = min(i // per_version, config.policy_versions - 1)
        if v != version:
            version = v
            recorder.policy_updated(version, step=version, checkpoint=f"ckpt/step-{version}")
            counts.events += 1
        group = i // config.group_size
        counts.events += _trajectory(recorder, config, rng, tokens, group, i % config.group_size, version, difficulty[group], counts)
        counts.trajectories += 1
        if on_trajectory:
            on_trajectory(i)
    bus.flush()
    return counts


def _trajectory(
    recorder: Recorder,
    config: LoadgenConfig,
    rng: np.random.Generator,
    tokens: TokenSampler,
    group: int,
    sample: int,
    version: int,
    difficulty: float,
    counts: LoadgenCounts,
) -> int:
    env = ENVIRONMENTS[group % len(ENVIRONMENTS)]
    traj = recorder.start(
        task_id=f"task-{group:06d}",
        group_id=f"group-{group:06d}",
        sample_index=sample,
        environment=env,
        harness="loadgen",
        model="synthetic-7b",
        sampling_params={"temperature": 1.0, "top_p": 1.0},
        context_budget_tokens=config.context_budget_tokens,
    )
    n_turns = min(config.max_turns, max(1, int(rng.poisson(config.turns - 1)) + 1))
    system_failure = rng.random() < config.system_failure_rate
    fail_at = int(rng.integers(0, n_turns)) if system_failure else -1
    used = 0
    nudged_once = False
    status, origin, label = "completed", None, None
    appended = tokens.ids(_length(rng, config.prompt_tokens))
    for turn in range(n_turns):
        n_out = _length(rng, config.output_tokens)
        if used + len(appended) + n_out > config.context_budget_tokens:
            status, origin, label = "context_exhausted", "model", "model_capability"
            break
        out = tokens.ids(n_out)
        used += len(appended) + n_out
        fraction = used / config.context_budget_tokens
        nudge = fraction >= 0.8 and not nudged_once
        nudged_once |= nudge
        turn_version = version + (1 if turn > 0 and rng.random() < 0.05 else 0)
        traj.turn(
            out,
            tokens.logprobs(n_out),
            min(turn_version, config.policy_versions - 1),
            input_token_ids=appended,
            finish_reason="stop",
            context_used_fraction=fraction,
            nudged=nudge,
            latency_s=float(rng.gamma(2.0, 0.5)),
        )
        counts.turns += 1
        counts.tokens += len(appended) + n_out
        if turn == fail_at:
            status, origin = rng.choice(["error", "timeout"]), "system"
            label = str(rng.choice(SYSTEM_LABELS))
            break
        appended = tokens.ids(0)
        if turn < n_turns - 1 and rng.random() < config.tool_call_rate:
            appended = _tool(traj, config, rng, tokens)
    if status == "completed" and n_turns == config.max_turns:
        status, origin, label = "max_turns", "model", "model_capability"
    if origin == "system" and label == "verifier_error":
        traj.reward(None, verifier="unit_tests", verifier_error="verifier timed out after 60s")
    elif origin != "system":
        solved = status == "completed" and rng.random() > difficulty
        traj.reward(float(solved), components={"tests_passed": float(solved)}, verifier="unit_tests")
        if not solved and status == "completed":
            origin, label = "model", "model_capability"
    traj.finish(str(status), failure_origin=origin, failure_label=label)
    return traj.seq


def _tool(traj: object, config: LoadgenConfig, rng: np.random.Generator, tokens: TokenSampler) -> np.ndarray:
    name, is_code = TOOLS[int(rng.integers(0, len(TOOLS)))]
    call = traj.tool_call(name, {"input": f"arg-{int(rng.integers(0, 1000))}"}, is_code_execution=is_code)  # type: ignore[attr-defined]
    timed_out = rng.random() < config.tool_timeout_rate
    failed = timed_out or rng.random() < config.tool_error_rate
    truncated = not failed and rng.random() < config.truncation_rate
    output = tokens.ids(_length(rng, config.env_tokens) if config.env_tokens else 0)
    traj.tool_result(  # type: ignore[attr-defined]
        call,
        name,
        ok=not failed,
        error_type=("timeout" if timed_out else "tool_error") if failed else None,
        timed_out=timed_out,
        truncated=truncated,
        output_tokens=len(output),
        latency_s=float(rng.gamma(2.0, 0.3)),
    )
    return output
