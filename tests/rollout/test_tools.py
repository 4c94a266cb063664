"""ToolRunner: timeouts, typed results, truncation, malformed-call retries, nudges, taxonomy."""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers import processes_mentioning, wait_until
from trajlake.rollout import taxonomy
from trajlake.rollout.config import SandboxConfig, ToolRunnerConfig
from trajlake.rollout.sandbox import sandbox_tool
from trajlake.rollout.sandbox.local import LocalSandbox
from trajlake.rollout.tools import Tool, ToolRunner


def add(a: int, b: int) -> str:
    return str(a + b)


def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "woke up"


def broken() -> str:
    raise KeyError("config.yaml")


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def encode_words(text: str) -> list[int]:
    return [hash(w) % 1000 for w in text.split()]


@pytest.fixture
def runner():
    r = ToolRunner(
        [
            Tool("add", add),
            Tool("sleepy", sleepy, timeout_s=0.2),
            Tool("broken", broken),
            Tool("words", words),
        ],
        ToolRunnerConfig(max_output_tokens=10, max_malformed_retries=2),
        encode=encode_words,
    )
    yield r
    r.close()


def test_a_good_call_returns_its_output(runner):
    result = runner.call({"name": "add", "arguments": {"a": 2, "b": 3}})
    assert (result.status, result.output, result.error_type, result.truncated) == ("ok", "5", None, False)
    assert result.output_token_ids == encode_words("5")


def test_a_hung_tool_times_out_with_a_typed_result(runner):
    result = runner.call(json.dumps({"name": "sleepy", "arguments": {"seconds": 5}}))
    assert result.status == "timeout" and result.error_type == "timeout"
    assert "timed out" in result.output
    assert result.failure == (taxonomy.SYSTEM, taxonomy.ENV_DEPENDENCY)


def test_a_tool_that_raises_returns_an_error_result(runner):
    result = runner.call({"name": "broken"})
    assert result.status == "error" and result.error_type == "tool_error"
    assert "KeyError" in result.output
    assert result.failure == (taxonomy.SYSTEM, taxonomy.TOOL_DESIGN)


def test_long_output_is_truncated_to_the_token_budget_and_marked(runner):
    result = runner.call({"name": "words", "arguments": {"n": 100}})
    assert result.truncated and result.ok
    assert len(result.output_token_ids) <= 10
    assert result.output.endswith("[... output truncated ...]")


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"name": "add", "arguments": {"a": 1,', "not valid JSON"),
        (
            {"name": "multiply", "arguments": {}},
            "unknown tool 'multiply'; available tools: add, broken, sleepy, words",
        ),
        ({"name": "add", "arguments": {"a": 1}}, "bad arguments for 'add'"),
        ({"arguments": {}}, 'string "name"'),
    ],
    ids=["bad-json", "unknown-tool", "missing-argument", "no-name"],
)
def test_malformed_calls_get_an_error_the_model_can_fix(runner, raw, says):
    result = runner.call(raw)
    assert result.status == "error" and result.error_type == "malformed_call"
    assert says in result.output
    assert result.failure == (taxonomy.MODEL, taxonomy.TOOL_DESIGN)


def test_retries_after_malformed_calls_are_counted_and_the_loop_goes_on(runner):
    runner.call("add(1, 2)")
    runner.call({"name": "add", "arguments": {"x": 1}})
    assert not runner.should_give_up
    result = runner.call({"name": "add", "arguments": {"a": 1, "b": 2}})
    assert result.ok and result.retries == 2
    assert runner.call({"name": "add", "arguments": {"a": 1, "b": 1}}).retries == 0


def test_too_many_malformed_calls_in_a_row_end_as_a_model_failure(runner):
    for _ in range(3):
        runner.call("nonsense")
    assert runner.should_give_up
    fields = runner.give_up_fields()
    assert (fields["status"], fields["failure_origin"], fields["failure_label"]) == (
        "error",
        "model",
        "tool_design",
    )


@pytest.mark.parametrize("threshold", [0.8, 0.5], ids=["default-80pct", "configured-50pct"])
def test_the_context_nudge_fires_once_at_the_threshold(threshold):
    runner = ToolRunner([], ToolRunnerConfig(nudge_threshold=threshold))
    fractions = [0.1, threshold - 0.01, threshold, 0.9, 0.95]
    nudges = [runner.nudge(f) for f in fractions]
    assert nudges == [None, None, runner.config.nudge_text, None, None]


def test_a_sandboxed_code_tool_is_flagged_and_its_timeout_kills_the_process(tmp_path):
    marker = tmp_path / "survived"
    with LocalSandbox(SandboxConfig(exec_timeout_s=5)) as box:
        tool = sandbox_tool(box, "bash", timeout_s=0.3)
        runner = ToolRunner([tool])
        ok = runner.call({"name": "bash", "arguments": {"command": "echo hi"}})
        slow = runner.call({"name": "bash", "arguments": {"command": f"sleep 2 && touch {marker}"}})
        runner.close()
    assert ok.ok and ok.output.strip() == "hi" and ok.is_code_execution
    assert slow.status == "timeout" and slow.is_code_execution
    assert slow.failure == (taxonomy.MODEL, taxonomy.MODEL_CAPABILITY)
    # the command was killed, not left running: no process is left that could touch the marker
    wait_until(lambda: not processes_mentioning(str(marker)), 10, "the timed-out command to end")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "message", "expected"),
    [
        ("ContextLengthExceededError", "", ("context_exhausted", "model", "model_capability", True)),
        ("RewardFileNotFoundError", "", ("error", "system", "verifier_error", False)),
        ("VerifierTimeoutError", "", ("error", "system", "verifier_error", False)),
        ("RateLimitError", "", ("error", "system", "infra", False)),
        ("AgentTimeoutError", "", ("timeout", "model", "model_capability", True)),
        (
            "BadRequestError",
            "This model's maximum context length is 8192",
            ("context_exhausted", "model", "model_capability", True),
        ),
        ("SomethingNew", "boom", ("error", "system", "harness_behavior", False)),
    ],
    ids=[
        "context",
        "reward-file",
        "verifier-timeout",
        "rate-limit",
        "agent-timeout",
        "context-by-message",
        "unknown",
    ],
)
def test_exceptions_map_onto_the_failure_taxonomy(name, message, expected):
    f = taxonomy.classify_exception_name(name, message)
    assert (f.status, f.origin, f.label, f.reward_valid) == expected


def test_hung_calls_do_not_starve_the_calls_after_them(runner):
    for _ in range(5):
        assert runner.call({"name": "sleepy", "arguments": {"seconds": 3}}).status == "timeout"
    assert runner.call({"name": "add", "arguments": {"a": 1, "b": 1}}).output == "2"
