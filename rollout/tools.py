"""The tool runner: timeouts, typed results, truncation, malformed-call retries, the context nudge.

One `ToolRunner` serves one agent loop. Every call returns a `ToolResult` (never None, never
an exception from the tool) and, when a trajectory recorder is attached, is recorded as a
`tool_call` + `tool_result` pair:

    runner = ToolRunner([Tool("python", run_python, is_code_execution=True)], encode=tok.encode, traj=traj)
    result = runner.call('{"name": "python", "arguments": {"code": "print(1)"}}')
    if runner.should_give_up: traj.finish(**runner.give_up_fields())
    nudge = runner.nudge(context_used_fraction)       # text to append once, at 80% of the budget
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

from trajlake.common.threads import run_in_thread
from trajlake.rollout import taxonomy
from trajlake.rollout.config import ToolRunnerConfig
from trajlake.rollout.errors import SandboxError, SandboxTimeout

ToolStatus = Literal["ok", "error", "timeout"]


@dataclass
class Tool:
    """A callable the model may invoke by name; its keyword arguments are its parameters."""

    name: str
    fn: Callable[..., Any]
    is_code_execution: bool = False
    timeout_s: float | None = None
    description: str = ""


@dataclass
class ToolResult:
    """The typed outcome of one tool call."""

    status: ToolStatus
    output: str
    output_token_ids: list[int] = field(default_factory=list)
    error_type: str | None = None
    truncated: bool = False
    retries: int = 0
    latency_s: float = 0.0
    tool_name: str = ""
    call_id: str | None = None
    is_code_execution: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failure(self) -> tuple[str, str] | None:
        """(origin, label) of a failed call in the taxonomy, None when it succeeded."""
        if self.ok:
            return None
        return taxonomy.classify_tool_error(
            self.error_type or "tool_error", is_code_execution=self.is_code_execution
        )


class MalformedCall(ValueError):
    """The model's tool call cannot be run as written; the message tells the model what to fix."""


def _encode_chars(text: str) -> list[int]:
    return [ord(c) for c in text]


class ToolRunner:
    """Runs the tool calls of one agent loop and records each one."""

    def __init__(
        self,
        tools: Sequence[Tool],
        config: ToolRunnerConfig | None = None,
        *,
        encode: Callable[[str], Sequence[int]] | None = None,
        traj: Any | None = None,
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.config = config or ToolRunnerConfig()
        self.encode = encode or _encode_chars
        self.traj = traj
        self.malformed_in_a_row = 0
        self.nudged = False
        self.n_calls = 0

    # -- nudge ----------------------------------------------------------------------------
    def nudge(self, context_used_fraction: float | None) -> str | None:
        """The nudge text the first time the context reaches the threshold, else None.

        The harness appends it to the next input and records that turn with `nudged=True`.
        """
        if (
            self.nudged
            or context_used_fraction is None
            or context_used_fraction < self.config.nudge_threshold
        ):
            return None
        self.nudged = True
        return self.config.nudge_text

    # -- calls ----------------------------------------------------------------------------
    @property
    def should_give_up(self) -> bool:
        """True once the model has made more malformed calls in a row than it may retry."""
        return self.malformed_in_a_row > self.config.max_malformed_retries

    def give_up_fields(self) -> dict[str, Any]:
        """`finish` arguments for a trajectory ended by repeated malformed calls (a model failure)."""
        f = taxonomy.MALFORMED_TOOL_CALLS
        return {
            "status": f.status,
            "failure_origin": f.origin,
            "failure_label": f.label,
            "message": f"{self.malformed_in_a_row} malformed tool calls in a row",
        }

    def call(self, raw_call: str | Mapping[str, Any], *, traj: Any | None = None) -> ToolResult:
        """Parse, run and record one tool call; a malformed one gets an error the model can act on."""
        traj = traj if traj is not None else self.traj
        self.n_calls += 1
        try:
            tool, arguments = self.parse(raw_call)
        except MalformedCall as err:
            self.malformed_in_a_row += 1
            name = _name_of(raw_call)
            result = ToolResult(
                "error", f"Malformed tool call: {err}", error_type="malformed_call", tool_name=name
            )
            result.output_token_ids = list(self.encode(result.output))
            self._record(traj, name, raw_call, False, result)
            return result
        retries, self.malformed_in_a_row = self.malformed_in_a_row, 0
        result = self.run(tool, arguments)
        result.retries = retries
        self._record(traj, tool.name, arguments, tool.is_code_execution, result)
        return result

    def parse(self, raw_call: str | Mapping[str, Any]) -> tuple[Tool, dict[str, Any]]:
        """The tool and arguments of a call given as JSON text or a mapping; raise `MalformedCall`."""
        if isinstance(raw_call, str):
            try:
                raw_call = json.loads(raw_call)
            except json.JSONDecodeError as err:
                raise MalformedCall(
                    f"not valid JSON ({err.msg} at position {err.pos}); "
                    'write {"name": ..., "arguments": {...}}'
                ) from err
        if not isinstance(raw_call, Mapping) or not isinstance(raw_call.get("name"), str):
            raise MalformedCall('a tool call is an object with a string "name" and an "arguments" object')
        name = raw_call["name"]
        if name not in self.tools:
            raise MalformedCall(f"unknown tool {name!r}; available tools: {', '.join(sorted(self.tools))}")
        arguments = raw_call.get("arguments") or {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as err:
                raise MalformedCall(f"arguments of {name!r} are not valid JSON ({err.msg})") from err
        if not isinstance(arguments, Mapping):
            raise MalformedCall(f"arguments of {name!r} must be an object")
        tool = self.tools[name]
        try:
            inspect.signature(tool.fn).bind(**arguments)
        except TypeError as err:
            raise MalformedCall(f"bad arguments for {name!r}: {err}; parameters: {_params(tool.fn)}") from err
        return tool, dict(arguments)

    def run(self, tool: Tool, arguments: Mapping[str, Any]) -> ToolResult:
        """Run a parsed call under its timeout; errors and timeouts become typed results."""
        timeout = tool.timeout_s or self.config.timeout_s
        started = time.monotonic()
        future = _start_call(tool, arguments)
        status: ToolStatus = "ok"
        error_type = None
        try:
            output = future.result(timeout=timeout)
        except (FutureTimeout, SandboxTimeout):
            # A Python thread cannot be killed; it finishes in the background. Tools that must be
            # stopped (model-written code) run in a sandbox, whose exec timeout kills the process.
            status, error_type, output = (
                "timeout",
                "timeout",
                f"Tool {tool.name!r} timed out after {timeout:g}s",
            )
        except SandboxError as err:
            status, error_type, output = "error", "sandbox_crash", f"Sandbox failed: {err}"
        except Exception as err:  # any tool bug becomes a typed error result, never a dead agent loop
            status, error_type, output = "error", "tool_error", f"{type(err).__name__}: {err}"
        text = output if isinstance(output, str) else json.dumps(output, default=str)
        ids, text, truncated = self.truncate(text)
        return ToolResult(
            status=status,
            output=text,
            output_token_ids=ids,
            error_type=error_type,
            truncated=truncated,
            latency_s=time.monotonic() - started,
            tool_name=tool.name,
            is_code_execution=tool.is_code_execution,
        )

    def truncate(self, text: str) -> tuple[list[int], str, bool]:
        """Token ids and text of `text`, cut to the token budget with a marker when longer."""
        ids = list(self.encode(text))
        budget = self.config.max_output_tokens
        if len(ids) <= budget:
            return ids, text, False
        marker = self.config.truncation_marker
        marker_ids = list(self.encode(marker))
        keep = max(0, budget - len(marker_ids))
        kept_chars = int(len(text) * keep / len(ids))
        return ids[:keep] + marker_ids, text[:kept_chars] + marker, True

    def _record(self, traj: Any, name: str, arguments: Any, is_code: bool, result: ToolResult) -> None:
        if traj is None:
            return
        args = arguments if isinstance(arguments, (str, Mapping)) else json.dumps(arguments, default=str)
        result.call_id = traj.tool_call(name, args, is_code_execution=is_code)
        traj.tool_result(
            result.call_id,
            name,
            ok=result.ok,
            error_type=result.error_type,
            timed_out=result.status == "timeout",
            truncated=result.truncated,
            output_tokens=len(result.output_token_ids),
            latency_s=result.latency_s,
            retries=result.retries,
            is_code_execution=is_code,
        )

    def close(self) -> None:
        """Nothing to release: tool threads are daemons and a hung one is never waited for."""


def _start_call(tool: Tool, arguments: Mapping[str, Any]) -> Future[Any]:
    """Run the tool in its own daemon thread, so a hung call never blocks the calls after it."""
    return run_in_thread(lambda: tool.fn(**arguments), name=f"tool-{tool.name}")


def _name_of(raw_call: Any) -> str:
    if isinstance(raw_call, str):
        try:
            raw_call = json.loads(raw_call)
        except json.JSONDecodeError:
            return "<unparsed>"
    name = raw_call.get("name") if isinstance(raw_call, Mapping) else None
    return name if isinstance(name, str) and name else "<unparsed>"


def _params(fn: Callable[..., Any]) -> str:
    return ", ".join(str(p) for p in inspect.signature(fn).parameters.values())
