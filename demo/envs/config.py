"""Settings of the demo environment: episode limits, tool output budget, injected faults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FaultConfig(BaseModel):
    """Rates of injected system faults, each drawn independently per tool call, answer or task."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_timeout_rate: float = Field(
        0.06, ge=0, le=1, description="A calculator attempt hangs past its timeout (retried)."
    )
    sandbox_crash_rate: float = Field(
        0.015, ge=0, le=1, description="The code sandbox dies during a python call."
    )
    missing_dependency_rate: float = Field(
        0.01, ge=0, le=1, description="The sandbox image lacks a module the tool imports."
    )
    harness_fault_rate: float = Field(
        0.01, ge=0, le=1, description="A harness bug loses a tool call's arguments."
    )
    verifier_error_rate: float = Field(
        0.01, ge=0, le=1, description="The verifier crashes instead of scoring."
    )
    long_output_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="A string task whose answer is one token over the tool output budget (tool design).",
    )

    @classmethod
    def none(cls) -> FaultConfig:
        """No injected faults (the overfit check and unit tests use it)."""
        return cls().scaled(0.0)

    def scaled(self, factor: float) -> FaultConfig:
        """Every rate multiplied by `factor` (capped at 1)."""
        if factor < 0:
            raise ValueError(f"a fault-rate factor must be >= 0 (got {factor})")
        return FaultConfig(**{name: min(1.0, value * factor) for name, value in self.model_dump().items()})


class EnvConfig(BaseModel):
    """Episode limits of the demo environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_budget_tokens: int = Field(
        26, ge=8, description="Prompt + outputs + tool results may not exceed this."
    )
    max_turns: int = Field(4, ge=1, le=64, description="Model turns per episode.")
    max_new_tokens: int = Field(4, ge=1, description="Tokens the model may sample per turn.")
    max_tool_output_tokens: int = Field(
        6,
        ge=1,
        le=12,
        description="Tool output beyond this is truncated; task strings are at most this long.",
    )
    tool_latency_s: float = Field(
        0.005, ge=0, le=10, description="Mean simulated I/O latency of one tool call."
    )
    max_tool_attempts: int = Field(
        2, ge=1, description="Attempts per tool call when it times out (the first included)."
    )
    nudge_threshold: float = Field(
        0.8, gt=0, le=1, description="Context fraction at which the nudge is appended, once."
    )
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the policy.")
    faults: FaultConfig = Field(default_factory=FaultConfig, description="Injected system faults.")

    @property
    def longest_prompt(self) -> int:
        """Tokens of the longest prompt: <bos> count X in + a string one over the output budget."""
        return 4 + self.max_tool_output_tokens + 1

    @model_validator(mode="after")
    def _prompt_fits(self) -> EnvConfig:
        if self.longest_prompt + self.max_new_tokens > self.context_budget_tokens:
            raise ValueError(
                f"context_budget_tokens={self.context_budget_tokens} cannot hold the longest prompt "
                f"({self.longest_prompt} tokens) plus one turn ({self.max_new_tokens}); raise it or lower "
                "max_tool_output_tokens"
            )
        return self
