"""One episode of the demo environment: the multi-turn agent loop, recorded event by event.

Each turn the policy samples token ids (with their logprobs) after the whole context; a
tool call runs through the platform's `ToolRunner`, whose result tokens the environment
appends; `<answer>` submits the last tool result to the verifier. A malformed call gets the
runner's error as its result and the model another turn (a retry), until the runner's retry
budget is spent. Every way an episode can end maps to a status and, for failures, to an
origin (`model` or `system`) and a label of the platform's failure taxonomy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trajlake.demo.envs import vocab
from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.tasks import Task, reward_components
from trajlake.demo.envs.toolbox import call_arguments, make_runner, result_tokens
from trajlake.ingest.recorder import Recorder, TrajectoryRecorder
from trajlake.rollout import taxonomy
from trajlake.rollout.tools import ToolResult, ToolRunner

ENVIRONMENT = "trajlake-demo-tools"
HARNESS = "trajlake-demo-harness"
VERIFIER = "exact_match+right_tool_credit"
ANSWER = "answer"
"""The action that submits the last tool result to the verifier."""

Action = str | Mapping[str, Any] | None
"""What a model turn did: ANSWER, a tool call (`{"name", "arguments"}`, or the raw text of one the
runner will parse), or None (no action)."""

TRUNCATED_ANSWER = taxonomy.Failure("completed", taxonomy.SYSTEM, taxonomy.TOOL_DESIGN, reward_valid=False)
"""The answer was right but cut off by the tool's output budget: the tool's design, not the model."""
TOOL_TIMED_OUT = taxonomy.Failure("timeout", *taxonomy.classify_tool_error("timeout"), reward_valid=False)


class PolicyClient(Protocol):
    """What an episode needs from a policy: sampled ids, their logprobs, and the weights' version."""

    def sample(
        self, context: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]
    ) -> tuple[list[int], list[float], int]:
        """Sample after `context`; return (ids, logprobs, policy_version that sampled them)."""
        ...


class HarnessBug(RuntimeError):
    """An injected bug in the harness itself (the recorder files it as a system failure)."""


@dataclass
class EpisodeResult:
    """How an episode ended (mirrors its `reward` and `trajectory_finished` events)."""

    trajectory_id: str
    task_id: str
    group_id: str
    reward: float | None = None
    status: str = ""
    failure_origin: str | None = None
    failure_label: str | None = None
    policy_versions: list[int] = field(default_factory=list)
    n_turns: int = 0
    nudged: bool = False
    token_ids: list[int] = field(default_factory=list)  # as the lake's trajectories.token_ids
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[bool] = field(default_factory=list)

    @property
    def is_system_failure(self) -> bool:
        """True when the system, not the model, ended the episode (its reward must not be trained on)."""
        return self.failure_origin == taxonomy.SYSTEM


class Episode:
    """Runs one task with one policy and records it through a `TrajectoryRecorder`."""

    def __init__(
        self,
        task: Task,
        policy: PolicyClient,
        traj: TrajectoryRecorder,
        config: EnvConfig,
        rng: random.Random,
        result: EpisodeResult,
    ) -> None:
        self.task, self.policy, self.traj, self.config, self.rng = task, policy, traj, config, rng
        self.runner: ToolRunner = self._make_runner()
        self.context: list[int] = list(task.prompt_ids)
        self.appended: list[int] = list(task.prompt_ids)
        self.last_tool: ToolResult | None = None
        self.used_right_tool = False
        self.result = result

    def run(self) -> EpisodeResult:
        """Play turns until an answer, a system fault, or a limit; return how it ended."""
        try:
            return self._play()
        finally:
            self.runner.close()

    def _play(self) -> EpisodeResult:
        budget = self.config.context_budget_tokens
        for _ in range(self.config.max_turns):
            nudge = self.runner.nudge(self.context_len / budget)
            if nudge:
                self._append_nudge(nudge)
                self.result.nudged = True
            remaining = budget - self.context_len
            if remaining <= 0:
                return self._finish(taxonomy.CONTEXT_EXHAUSTED, "the context budget is used up")
            action = self._turn(min(self.config.max_new_tokens, remaining), nudged=bool(nudge))
            if action == ANSWER:
                return self._answer()
            if action is not None:
                failure = self._call(action)
                if failure is taxonomy.MALFORMED_TOOL_CALLS:
                    return self._finish(failure, self.runner.give_up_fields()["message"])
                if failure is not None:
                    return self._finish(failure, self.last_tool.output if self.last_tool else None)
            if self.context_len >= budget:
                return self._finish(taxonomy.CONTEXT_EXHAUSTED, "the context budget is used up")
        return self._finish(taxonomy.MAX_TURNS, f"no answer in {self.config.max_turns} turns")

    # -- what depends on how the policy reads and writes: demo vocabulary ids here, chat in ChatEpisode
    def _make_runner(self) -> ToolRunner:
        return make_runner(self.config, self.rng, self.traj)

    @property
    def context_len(self) -> int:
        """Tokens in the context so far."""
        return len(self.context)

    def _append(self, ids: list[int]) -> None:
        self.appended.extend(ids)
        self.context.extend(ids)

    def _append_nudge(self, nudge: str) -> None:
        self._append(vocab.encode(nudge.split()))

    def _append_result(self, result: ToolResult) -> None:
        self._append(result_tokens(result.output_token_ids, result.ok))

    def _submitted(self, tool: ToolResult) -> tuple[str, ...]:
        """The answer a submitted tool result stands for (its tokens, without the truncation marker)."""
        return tuple(vocab.TOKENS[i] for i in tool.output_token_ids if i != vocab.TRUNCATED)

    def _turn(self, max_new_tokens: int, nudged: bool) -> Action:
        """Sample and record one model turn; return its action (a call token's call is the harness's)."""
        started = time.perf_counter()
        ids, logprobs, version = self.policy.sample(self.context, max_new_tokens, vocab.STOP_IDS)
        latency_s = time.perf_counter() - started
        finish = "stop" if ids[-1] in vocab.STOP_IDS else "length"
        self._record_turn(ids, logprobs, version, finish, nudged, latency_s)
        self.context.extend(ids)
        if ids[-1] == vocab.ANSWER:
            return ANSWER
        tool = vocab.TOOL_OF_CALL.get(ids[-1])
        return None if tool is None else call_arguments(tool, self.task)

    def _record_turn(
        self,
        ids: list[int],
        logprobs: list[float],
        version: int,
        finish_reason: str | None,
        nudged: bool,
        latency_s: float,
    ) -> None:
        self.traj.turn(
            ids,
            logprobs,
            version,
            input_token_ids=self.appended,
            finish_reason=finish_reason,
            context_used_fraction=(self.context_len + len(ids)) / self.config.context_budget_tokens,
            nudged=nudged,
            latency_s=latency_s,
        )
        record = self.result
        record.token_ids += [*self.appended, *ids]
        record.logprobs += [0.0] * len(self.appended) + list(logprobs)
        record.loss_mask += [False] * len(self.appended) + [True] * len(ids)
        record.n_turns += 1
        record.policy_versions.append(int(version))
        self.appended = []

    def _call(self, raw_call: str | Mapping[str, Any]) -> taxonomy.Failure | None:
        """Run the model's call (retrying a timeout); return the failure if it ends the episode: a system
        fault, or more malformed calls in a row than the runner retries."""
        if self.rng.random() < self.config.faults.harness_fault_rate:
            raise HarnessBug("harness bug: lost the arguments of the tool call")
        for _ in range(self.config.max_tool_attempts):
            result = self.runner.call(raw_call)
            if result.status != "timeout":
                break
        self.last_tool = result
        if result.error_type == "malformed_call":
            if self.runner.should_give_up:
                return taxonomy.MALFORMED_TOOL_CALLS
            self._append_result(result)  # the runner's error tells the model what to fix in its retry
            return None
        self.used_right_tool |= result.ok and result.tool_name == self.task.tool
        if result.status == "timeout":
            return TOOL_TIMED_OUT
        if result.error_type == "sandbox_crash":
            return taxonomy.INFRA_FAILED
        if result.error_type == "tool_error" and result.output.startswith("ModuleNotFoundError"):
            return taxonomy.classify_exception_name("ModuleNotFoundError")
        self._append_result(result)
        return None

    def _answer(self) -> EpisodeResult:
        if self.rng.random() < self.config.faults.verifier_error_rate:
            self.traj.reward(
                None, verifier=VERIFIER, verifier_error="KeyError: 'expected' (verifier crashed)"
            )
            return self._finish(taxonomy.VERIFIER_FAILED, "the verifier crashed; no valid reward")
        tool = self.last_tool
        submitted = None
        if tool is not None and tool.ok:
            submitted = self._submitted(tool)
        components = reward_components(self.task, submitted, self.used_right_tool)
        self._reward(components)
        if components["correct"] > 0:
            return self._finish(taxonomy.COMPLETED, None)
        # a cut-off answer is the tool's design; a cut-off error message is no answer at all
        if tool is not None and tool.ok and tool.truncated:
            return self._finish(TRUNCATED_ANSWER, "the answer was cut off by the tool output budget")
        return self._finish(
            taxonomy.Failure("completed", taxonomy.MODEL, taxonomy.MODEL_CAPABILITY), "wrong answer"
        )

    def _reward(self, components: dict[str, float]) -> None:
        self.result.reward = sum(components.values())
        self.traj.reward(self.result.reward, components=components, verifier=VERIFIER)

    def _finish(self, failure: taxonomy.Failure, message: str | None) -> EpisodeResult:
        if self.result.reward is None and failure.reward_valid:
            # a model failure is a valid, trainable reward (0, or the right-tool credit)
            self._reward(reward_components(self.task, None, self.used_right_tool))
        self.traj.finish(
            failure.status, failure_origin=failure.origin, failure_label=failure.label, message=message
        )
        self.result.status, self.result.failure_origin, self.result.failure_label = (
            failure.status,
            failure.origin,
            failure.label,
        )
        return self.result


def run_episode(
    recorder: Recorder,
    task: Task,
    policy: PolicyClient,
    config: EnvConfig,
    rng: random.Random,
    *,
    group_id: str | None = None,
    sample_index: int = 0,
    model: str = "tinypolicy",
) -> EpisodeResult:
    """Start a trajectory for `task`, play it with `policy`, and record every event."""
    group_id = group_id or task.task_id
    traj = recorder.start(
        task.task_id,
        group_id,
        sample_index,
        environment=ENVIRONMENT,
        harness=HARNESS,
        model=model,
        sampling_params={"temperature": config.temperature, "max_new_tokens": config.max_new_tokens},
        context_budget_tokens=config.context_budget_tokens,
        tags=[task.kind],
    )
    result = EpisodeResult(traj.trajectory_id, task.task_id, group_id)
    try:
        with traj:  # an exception in the harness is recorded as a system failure by the recorder
            # a chat policy (vLLM) plays a ChatEpisode; the vocabulary policies play Episode
            episode_type = getattr(policy, "episode_type", Episode)
            return episode_type(task, policy, traj, config, rng, result).run()
    except HarnessBug:
        failure = taxonomy.HARNESS_FAILED
        result.status, result.failure_origin, result.failure_label = (
            failure.status,
            failure.origin,
            failure.label,
        )
        return result
