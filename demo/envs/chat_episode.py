"""The demo environment played by a chat model that vLLM serves: same tasks, tools, faults, taxonomy.

The task is the conversation's only message ("calc 3 + 4"): no system prompt and no tool schemas
(`TOOLS`, what a harness would pass to the chat template), so the prompt is ~14 tokens. The tiny
model learns its tools in the warm start, and a long constant prefix slows that down: with a
20-token constant prefix a model of this size had not learned to copy from the task after 200
steps (loss 0.58 on a copy task), with 4 tokens it had (0.07).

The model writes its tool calls token by token from the full vocabulary, as Qwen-style text
(`<tool_call>{"name": "calc", "arguments": {"expression": "3 + 4"}}</tool_call>`): which tool,
the arguments it copies from the task, and when to answer are all its own. Each turn the
engine samples after the conversation's ids (a `ChatSession`: the template is rendered once,
outputs are appended exactly as returned, tool results are rendered on their own), the call is
parsed from the generated text and run by the platform's `ToolRunner`, and the result comes back
as a `tool` message: a malformed call gets the runner's error and the model a retry turn, long
output is cut to the tool output budget, and at 80% of the context budget the harness nudges
the model to answer. A randomly initialised model never writes a call, so `trajlake demo`
warm-starts it first (`trajlake.demo.warm_start`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.common.threads import importing
from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.episode import ANSWER, Action, Episode, EpisodeResult
from trajlake.demo.envs.tasks import Task
from trajlake.demo.envs.toolbox import make_runner
from trajlake.ingest.recorder import TrajectoryRecorder
from trajlake.rollout import taxonomy
from trajlake.rollout.engine.chat import ChatSession
from trajlake.rollout.errors import InferenceError
from trajlake.rollout.tito import ContextLengthExceeded
from trajlake.rollout.tools import ToolResult, ToolRunner

NO_ACTION_PROMPT = "Call one of the tools."
NUDGE_TEXT = "Answer now."
"""The 80% context nudge, a user message."""
TRUNCATION_MARKER = " [truncated]"
"""What a tool's output cut to the budget ends with."""
TOOLS = [
    {"type": "function", "function": {"name": "calc", "description": "Evaluate an arithmetic expression.",
                                      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                     "required": ["expression"]}}},
    {"type": "function", "function": {"name": "python", "description": "Run a string program.",
                                      "parameters": {"type": "object", "properties": {"code": {"type": "string"}},
                                                     "required": ["code"]}}},
    {"type": "function", "function": {"name": "answer", "description": "Submit the last tool result as the answer.",
                                      "parameters": {"type": "object", "properties": {}}}},
]  # fmt: skip


def harness_texts() -> list[str]:
    """What the harness writes into a conversation besides the task: prompts, the nudge, the marker and
    the errors of malformed and wrong calls, as the runner words them (the tokenizer learns their words)."""
    import json

    from trajlake.demo.envs.config import FaultConfig
    from trajlake.demo.envs.toolbox import make_tools

    env = EnvConfig(faults=FaultConfig.none(), tool_latency_s=0.0)
    runner = ToolRunner(make_tools(env, random.Random(0)))
    good = {"name": "calc", "arguments": {"expression": "3 + 4"}}
    bad = [json.dumps(good)[:-1], '{"name": "calc" "arguments": {}}', '{"name": "calcc", "arguments": {}}',
           '{"name": "calc", "arguments": {"code": "3 + 4"}}', '{"arguments": {}}',
           {"name": "calc", "arguments": {"expression": "reverse a b"}},
           {"name": "python", "arguments": {"code": "3 + 4"}}]  # fmt: skip
    errors = [runner.call(call).output for call in bad]
    return [NO_ACTION_PROMPT, NUDGE_TEXT, TRUNCATION_MARKER, *errors]


def task_text(task: Task) -> str:
    """The task as the user message: its kind and operands."""
    return " ".join((task.kind, *task.operands))


def opening_messages(task: Task) -> list[dict[str, str]]:
    """The task as the conversation's one message (no system prompt: see the module's docstring)."""
    return [{"role": "user", "content": task_text(task)}]


@dataclass
class ChatPolicy:
    """A chat model behind a TITO client: what a `ChatEpisode` samples from."""

    client: Any  # a TitoClient on the generate route (it reports the weight version of each output)
    tokenizer: Any
    temperature: float = 1.0
    fallback_version: int = 0  # the version recorded when the server reports none

    episode_type = property(lambda self: ChatEpisode)  # run_episode plays a ChatEpisode with this policy

    @classmethod
    def from_model_dir(cls, client: Any, model_dir: str | Path, temperature: float = 1.0) -> ChatPolicy:
        """The policy for a model directory (`trajlake model init`, warm-started): its tokenizer."""
        with importing():  # each rollout thread builds its policy: transformers imports on first use
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        return cls(client, tokenizer, temperature)

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Any:
        """One turn from the engine, sampled from the full vocabulary: a `Completion` (it ends at <|im_end|>)."""
        return self.client.complete(prompt_ids, max_tokens=max_new_tokens, temperature=self.temperature)


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
            self.config, self.rng, self.traj, encode=lambda t: tokenizer.encode(t, add_special_tokens=False),
            truncation_marker=TRUNCATION_MARKER, nudge_text=NUDGE_TEXT,
        )  # fmt: skip

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

    def _turn(self, max_new_tokens: int, nudged: bool) -> Action:
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
        call = turn.tool_calls[0]  # one call per turn: the model sees its result before the next
        if call.name == ANSWER and not call.malformed:
            return ANSWER
        return call.raw  # the runner parses it again: a malformed call is recorded and retried
