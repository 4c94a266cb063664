"""The demo environment played by a chat model that vLLM serves: same tasks, tools, faults, taxonomy.

The task reaches the model as a user message ("calc 3 + 4") under a one-line system prompt
naming the tools (`calc`, `python`, and `answer`, which submits the last tool result); their
JSON schemas (`TOOLS`, what a harness would pass to the chat template) stay out of the prompt,
which keeps it ~30 tokens instead of ~420, so training and prefill stay cheap on two cores. Each turn the
engine samples after the conversation's ids (a `ChatSession`: the template is rendered once,
outputs are appended exactly as returned, tool results are rendered on their own), the tool call
is parsed from the generated text, the harness writes its arguments from the task, and the
result comes back as a `tool` message.

Learnable in minutes from random weights on two CPU cores: sampling is limited to the action
tokens (`allowed_token_ids`: one token per argument-free tool call), so a turn is one choice
among three tools, as in the vocabulary demo. The server reports the logprob of each sampled
token under that restricted distribution (`--logprobs-mode processed_logprobs`), and the
trainer recomputes it with the same mask (`HFPolicy(allowed_token_ids=...)`): importance
ratios and the PPO trust region live in the action space that was sampled, and the
train/inference mismatch stays a true engine-vs-trainer difference.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.episode import ANSWER, Episode, EpisodeResult
from trajlake.demo.envs.tasks import Task
from trajlake.demo.envs.toolbox import make_runner
from trajlake.demo.model import DEMO_TOOLS, action_tokens
from trajlake.ingest.recorder import TrajectoryRecorder
from trajlake.rollout import taxonomy
from trajlake.rollout.engine.chat import ChatSession
from trajlake.rollout.errors import InferenceError
from trajlake.rollout.tito import ContextLengthExceeded
from trajlake.rollout.tools import ToolResult, ToolRunner

SYSTEM_PROMPT = "Tools: calc (arithmetic), python (string programs), answer (submits the last result)."
NO_ACTION_PROMPT = "Call one of the tools."
TOOLS = [
    {"type": "function", "function": {"name": "calc", "description": "Evaluate the arithmetic expression of the task.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "python", "description": "Run the string program of the task.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "answer", "description": "Submit the last tool result as the answer.",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip


def action_ids(tokenizer: Any) -> list[int]:
    """The ids of the one-token tool calls the demo samples from (`trajlake model init` adds them)."""
    ids = [tokenizer.convert_tokens_to_ids(t) for t in action_tokens(DEMO_TOOLS)]
    if tokenizer.unk_token_id in ids or None in ids:
        raise ValueError(
            f"the tokenizer has no one-token tool calls for {DEMO_TOOLS}; build the model with `trajlake model init`"
        )
    return ids


def task_text(task: Task) -> str:
    """The task as the user message: its kind and operands."""
    return " ".join((task.kind, *task.operands))


def opening_messages(task: Task) -> list[dict[str, str]]:
    """The system prompt and the task."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task_text(task)}]


@dataclass
class ChatPolicy:
    """A chat model behind a TITO client: what a `ChatEpisode` samples from."""

    client: Any  # a TitoClient on the generate route (it reports the weight version of each output)
    tokenizer: Any
    temperature: float = 1.0
    fallback_version: int = 0  # the version recorded when the server reports none
    action_ids: list[int] = field(default_factory=list)

    episode_type = property(lambda self: ChatEpisode)  # run_episode plays a ChatEpisode with this policy

    @classmethod
    def from_model_dir(cls, client: Any, model_dir: str | Path, temperature: float = 1.0) -> ChatPolicy:
        """The policy for a `trajlake model init` directory: its tokenizer and action tokens."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(client, tokenizer, temperature, action_ids=action_ids(tokenizer))

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Any:
        """One turn from the engine: a `Completion` whose last token is an action."""
        return self.client.complete(
            prompt_ids, max_tokens=max_new_tokens, temperature=self.temperature,
            allowed_token_ids=self.action_ids, stop_token_ids=self.action_ids,
        )  # fmt: skip


class ChatEpisode(Episode):
    """An `Episode` whose context is a chat conversation of real tokenizer ids."""

    def __init__(
        self, task: Task, policy: ChatPolicy, traj: TrajectoryRecorder, config: EnvConfig,
        rng: random.Random, result: EpisodeResult,
    ) -> None:  # fmt: skip
        self.chat_policy = policy
        super().__init__(task, policy, traj, config, rng, result)
        self.session = ChatSession(policy.tokenizer, opening_messages(task))
        self.appended = []  # the session's pending ids are the turn's input

    def _make_runner(self) -> ToolRunner:
        tokenizer = self.chat_policy.tokenizer  # tool output is counted and cut in the model's tokens
        return make_runner(
            self.config, self.rng, self.traj, encode=lambda t: tokenizer.encode(t, add_special_tokens=False)
        )

    @property
    def context_len(self) -> int:
        return len(self.session.ids)

    def _play(self) -> EpisodeResult:
        try:
            return super()._play()
        except ContextLengthExceeded as err:  # the conversation outgrew the model: the model's doing
            return self._finish(taxonomy.CONTEXT_EXHAUSTED, str(err))
        except InferenceError as err:  # the engine is gone or failing after retries: the system's fault
            return self._finish(taxonomy.INFRA_FAILED, str(err))

    def _append_nudge(self, nudge: str) -> None:
        self.session.add_messages([{"role": "user", "content": nudge}])

    def _append_result(self, result: ToolResult) -> None:
        self.session.add_messages([{"role": "tool", "content": result.output}])

    def _submitted(self, tool: ToolResult) -> tuple[str, ...]:
        marker = self.runner.config.truncation_marker.strip()
        return tuple(word for word in tool.output.split() if word != marker)

    def _turn(self, max_new_tokens: int, nudged: bool) -> str | None:
        done = self.chat_policy.sample(self.session.prompt_ids, max_new_tokens)
        self.appended = self.session.take_pending()
        version = (
            done.policy_version if done.policy_version is not None else self.chat_policy.fallback_version
        )
        self._record_turn(
            done.output_token_ids, done.output_logprobs, version, done.finish_reason, nudged, done.latency_s
        )  # the request's latency as the TITO client measured it (retries included)
        turn = self.session.add_output(done.output_token_ids)
        if not turn.tool_calls:
            self.session.add_messages([{"role": "user", "content": NO_ACTION_PROMPT}])
            return None
        call = turn.tool_calls[0]
        if call.malformed or call.name is None:
            self.runner.call(call.raw)  # recorded as a malformed call, counted toward the model's retries
            self.session.add_messages([{"role": "tool", "content": f"Malformed tool call: {call.error}"}])
            return None
        return ANSWER if call.name == ANSWER else call.name
