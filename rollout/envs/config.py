"""Settings of the demo environment: episode limits, tool output budget, injected faults."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FaultConfig(BaseModel):
    """Rates of injected system faults, each drawn independently per tool call or episode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_timeout_rate: float = Field(0.03, ge=0, le=1, description="A tool attempt hangs past its timeout (retried).")
    sandbox_crash_rate: float = Field(0.03, ge=0, le=1, description="The code sandbox dies during a python call.")
    missing_dependency_rate: float = Field(0.02, ge=0, le=1, description="The sandbox image lacks a module the tool imports.")
    harness_fault_rate: float = Field(0.02, ge=0, le=1, description="The harness mis-parses a well-formed tool call.")
    verifier_error_rate: float = Field(0.02, ge=0, le=1, description="The verifier crashes instead of scoring.")

    @classmethod
    def none(cls) -> FaultConfig:
        """No injected faults (the overfit check and unit tests use it)."""
        return cls(tool_timeout_rate=0, sandbox_crash_rate=0, missing_dependency_rate=0, harness_fault_rate=0, verifier_error_rate=0)


class EnvConfig(BaseModel):
    """Episode limits of the demo environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_budget_tokens: int = Field(26, ge=8, description="Prompt + outputs + tool results may not exceed this.")
    max_turns: int = Field(4, ge=1, le=64, description="Model turns per episode.")
    max_new_tokens: int = Field(4, ge=1, description="Tokens the model may sample per turn.")
    max_tool_output_tokens: int = Field(6, ge=1, description="Tool output beyond this many tokens is truncated.")
    tool_latency_s: float = Field(0.005, ge=0, le=10, description="Mean simulated I/O latency of one tool call.")
    max_tool_attempts: int = Field(2, ge=1, description="Attempts per tool call when it times out (the first included).")
    nudge_threshold: float = Field(0.8, gt=0, le=1, description="Context fraction at which the nudge is appended, once.")
    max_string_len: int = Field(7, ge=2, le=12, description="Longest string of reverse/count tasks.")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature of the policy.")
    faults: FaultConfig = Field(default_factory=FaultConfig, description="Injected system faults.")

    @model_validator(mode="after")
    def _prompt_fits(self) -> EnvConfig:
        longest_prompt = 1 + 3 + self.max_string_len
        if longest_prompt + self.max_new_tokens > self.context_budget_tokens:
            raise ValueError(
                f"context_budget_tokens={self.context_budget_tokens} cannot hold the longest prompt "
                f"({longest_prompt} tokens) plus one turn ({self.max_new_tokens}); raise it or lower max_string_len"
            )
        return self
