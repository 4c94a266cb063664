"""The demo's two tools, a calculator and a code sandbox, run by the platform's `ToolRunner`.

`calc(expression)` evaluates `<digit> <op> <digit>`; `python(code)` runs a string program
(`reverse a b c`, `count a in a b a`). A chat model writes each call's arguments itself; the
vocabulary policy only picks a tool (`<call:calc>`, `<call:python>`) and the harness writes
its arguments from the task (`call_arguments`). Either way the wrong tool gets the task's text
and fails the way that tool really fails (a `ValueError`, a `SyntaxError`): the model's
mistake, which it may recover from. System faults are injected at the rates of `FaultConfig`:
the calculator service hangs past its timeout, the sandbox dies, or the sandbox image
lacks a module. Each surfaces the way the real fault would, through the runner's typed
`ToolResult`, so the episode classifies it with the platform's failure taxonomy.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

from trajlake.demo.envs import vocab
from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.tasks import Task, solve
from trajlake.rollout.config import ToolRunnerConfig
from trajlake.rollout.errors import SandboxError
from trajlake.rollout.tools import Tool, ToolRunner

TOOL_TIMEOUT_S = 0.2
"""Timeout of one tool call in the demo; an injected hang outlasts it."""

_HANG_S = 3 * TOOL_TIMEOUT_S


def encode_text(text: str) -> list[int]:
    """Ids of tool output text; text outside the vocabulary (an error message) becomes `<error>`."""
    words = text.split()
    if words and all(w in vocab.TOKEN_ID for w in words):
        return vocab.encode(words)
    known = [vocab.TOKEN_ID[w] for w in words if w == "<truncated>"]
    return [vocab.ERROR, *known]


def _calc(expression: str) -> str:
    parts = str(expression).split()
    if len(parts) != 3 or not (parts[0].isdigit() and parts[2].isdigit()) or parts[1] not in vocab.OPERATORS:
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return " ".join(solve("calc", tuple(parts)))


def _python(code: str) -> str:
    kind, *operands = str(code).split() or [""]
    if kind not in ("reverse", "count") or (kind == "count" and operands[1:2] != ["in"]):
        raise SyntaxError(f"invalid syntax: {code!r}")
    return " ".join(solve(kind, tuple(operands)))


def make_tools(config: EnvConfig, rng: random.Random, lock: threading.Lock | None = None) -> list[Tool]:
    """The calculator and the sandbox, with faults drawn from `rng` per call."""
    faults = config.faults
    lock = lock or threading.Lock()

    def draw(rate: float) -> bool:
        with lock:  # tools run on the runner's threads; the episode's rng is not thread-safe
            return rng.random() < rate

    def wait_for_io() -> None:
        with lock:
            delay = rng.uniform(0.5, 1.5) * config.tool_latency_s
        threading.Event().wait(delay)

    def calc(expression: str) -> str:
        wait_for_io()
        if draw(faults.tool_timeout_rate):
            threading.Event().wait(_HANG_S)  # the calculator service does not answer in time
        return _calc(expression)

    def python(code: str) -> str:
        wait_for_io()
        if draw(faults.sandbox_crash_rate):
            raise SandboxError("sandbox process was killed (exit 137)", stage="exec")
        if draw(faults.missing_dependency_rate):
            raise ModuleNotFoundError("No module named 'strtools' in the sandbox image")
        return _python(code)

    return [
        Tool("calc", calc, timeout_s=TOOL_TIMEOUT_S, description="evaluate an arithmetic expression"),
        Tool(
            "python",
            python,
            is_code_execution=True,
            timeout_s=TOOL_TIMEOUT_S,
            description="run a string program",
        ),
    ]


def make_runner(
    config: EnvConfig,
    rng: random.Random,
    traj: object,
    encode: Callable[[str], Sequence[int]] = encode_text,
    *,
    truncation_marker: str = " <truncated>",
    nudge_text: str = "<nudge>",
) -> ToolRunner:
    """A `ToolRunner` over the demo tools, recording into `traj`, with budgets from `config`;
    `encode` turns tool output into the policy's token ids (the demo vocabulary by default), and the
    marker and nudge are written in the policy's language."""
    runner_config = ToolRunnerConfig(
        timeout_s=TOOL_TIMEOUT_S,
        max_output_tokens=config.max_tool_output_tokens,
        truncation_marker=truncation_marker,
        nudge_threshold=config.nudge_threshold,
        nudge_text=nudge_text,
    )
    return ToolRunner(make_tools(config, rng), runner_config, encode=encode, traj=traj)


PARAMETER = {"calc": "expression", "python": "code"}
"""Each tool's one parameter."""


def task_argument(task: Task) -> str:
    """What a call for `task` passes: the arithmetic of a calc task, the whole program of a string task."""
    return " ".join(task.operands) if task.kind == "calc" else " ".join((task.kind, *task.operands))


def call_arguments(tool_name: str, task: Task) -> dict[str, object]:
    """The call of `tool_name` on `task` (`{"name", "arguments"}`), as the harness or a teacher writes it."""
    return {"name": tool_name, "arguments": {PARAMETER[tool_name]: task_argument(task)}}


def result_tokens(output_token_ids: Sequence[int], ok: bool) -> list[int]:
    """What the environment appends after a call: `<result> … </result>`, or the error tokens."""
    if not ok:
        return [vocab.ERROR]
    return [vocab.RESULT, *output_token_ids, vocab.END_RESULT]
