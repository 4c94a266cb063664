"""The demo's chat environment with the model writing its own calls: a scripted chat model (the warm
start's `Teacher`) plays episodes through the real harness; the lake shows what the harness did."""

from __future__ import annotations

import json
import random

import pytest

from trajlake.demo.envs import EnvConfig, FaultConfig, run_episode
from trajlake.demo.envs.chat_episode import NUDGE_TEXT
from trajlake.demo.envs.tasks import Task, solve
from trajlake.demo.warm_start import Teacher
from trajlake.ingest.recorder import Recorder
from trajlake.rollout.engine.chatml import tool_call_text

ANSWER = tool_call_text("answer")
CHAT_ENV = {"context_budget_tokens": 512, "max_new_tokens": 48}  # room for any tokenizer's error messages


def task_of(kind: str, *operands: str) -> Task:
    return Task(f"{kind}-chat", kind, operands, (), solve(kind, operands))


def calc(expression: str) -> str:
    return tool_call_text("calc", {"expression": expression})


def python(code: str) -> str:
    return tool_call_text("python", {"code": code})


def play(bus, tokenizer, task, turns, **env):
    """Play `task` with a chat model that writes `turns` (texts, in order), faults off unless given."""
    faults = env.pop("faults", FaultConfig.none())
    config = EnvConfig(**{**CHAT_ENV, **env, "faults": faults})
    teacher = Teacher(tokenizer, [(text, True) for text in turns])
    recorder = Recorder(bus, "chat-env", vocab_size=len(tokenizer), flush_each_turn=False)
    return run_episode(recorder, task, teacher, config, random.Random(0), model="tiny"), teacher


def stored(lake, trajectory_id):
    return lake.sql(
        "select * from trajectories where trajectory_id = $id", {"id": trajectory_id}
    ).to_pylist()[0]


def calls(lake, trajectory_id):
    return lake.sql(
        "select tool_name, arguments, ok, error_type, retries, truncated from tool_calls "
        "where trajectory_id = $id order by call_seq",
        {"id": trajectory_id},
    ).to_pylist()


def test_the_harness_runs_the_arguments_the_model_wrote(lake, bus, drain, tokenizer):
    right, _ = play(bus, tokenizer, task_of("calc", "7", "*", "8"), [calc("7 * 8"), ANSWER])
    miscopied, _ = play(bus, tokenizer, task_of("calc", "7", "*", "8"), [calc("7 * 9"), ANSWER])
    drain()
    rewards = [stored(lake, r.trajectory_id)["reward"] for r in (right, miscopied)]
    assert rewards == [1.0, 0.1]  # a miscopied argument: the right tool's credit, no answer
    assert [json.loads(c["arguments"]) for c in calls(lake, miscopied.trajectory_id)] == [
        {"expression": "7 * 9"}
    ]
    turns = lake.sql(
        "select n_output_tokens from turns where trajectory_id = $id order by turn_index",
        {"id": right.trajectory_id},
    )
    assert turns.column(0).to_pylist()[0] > 15  # the call is written token by token; the answer call is one


def test_a_malformed_call_gets_the_runners_error_and_a_retry_turn(lake, bus, drain, tokenizer):
    broken = calc("7 * 8").replace('"expression"', "expression")
    result, teacher = play(bus, tokenizer, task_of("calc", "7", "*", "8"), [broken, calc("7 * 8"), ANSWER])
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["reward"], row["n_turns"]) == ("completed", 1.0, 3)
    assert [(c["tool_name"], c["error_type"], c["retries"]) for c in calls(lake, result.trajectory_id)] == [
        ("<unparsed>", "malformed_call", 0),
        ("calc", None, 1),  # the call that ran after one malformed attempt
    ]
    second_prompt = tokenizer.decode(result.token_ids[: teacher.spans[1][0]])
    assert "Malformed tool call: not valid JSON" in second_prompt  # what the model read before its retry


def test_malformed_calls_beyond_the_retry_budget_end_as_the_models_failure(lake, bus, drain, tokenizer):
    broken = calc("1 + 2")[:-20]  # cut off inside the JSON
    result, _ = play(bus, tokenizer, task_of("calc", "1", "+", "2"), [broken], max_turns=8)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["failure_origin"], row["failure_label"]) == ("error", "model", "tool_design")
    assert row["reward"] == 0.0 and row["n_tool_calls"] == 4  # three retries, then the fourth malformed call


def test_a_wrong_tool_gets_its_real_error_and_answering_anyway_scores_zero(lake, bus, drain, tokenizer):
    result, _ = play(bus, tokenizer, task_of("reverse", "a", "b", "c"), [calc("reverse a b c"), ANSWER])
    drain()
    row = stored(lake, result.trajectory_id)
    # the error was truncated to the budget, but it was the model's wrong call: a trainable 0, not a system fault
    assert (row["reward"], row["failure_origin"], row["failure_label"]) == (0.0, "model", "model_capability")
    (call,) = calls(lake, result.trajectory_id)
    assert (call["ok"], call["error_type"], call["truncated"]) == (False, "tool_error", True)


def test_tool_output_beyond_the_budget_is_cut_in_the_models_tokens(lake, bus, drain, tokenizer):
    task = task_of("reverse", "a", "b", "c", "d", "e", "a", "b")
    result, _ = play(
        bus, tokenizer, task, [python("reverse a b c d e a b"), ANSWER], max_tool_output_tokens=6
    )
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["failure_origin"], row["failure_label"], row["n_tool_truncated"]) == (
        "system",
        "tool_design",
        1,
    )
    assert "[truncated]" in tokenizer.decode(result.token_ids)


def test_the_nudge_fires_when_the_models_own_words_fill_the_context(lake, bus, drain, tokenizer):
    babble = "the quick brown fox jumps over the lazy dog " * 4
    result, _ = play(bus, tokenizer, task_of("calc", "1", "+", "2"), [babble], max_turns=32)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["failure_origin"], row["nudged"]) == ("context_exhausted", "model", True)
    nudged = lake.sql(
        "select turn_index, context_used_fraction from turns where trajectory_id = $id and nudged",
        {"id": result.trajectory_id},
    ).to_pylist()
    assert len(nudged) == 1 and nudged[0]["turn_index"] > 0
    assert NUDGE_TEXT in tokenizer.decode(result.token_ids)


@pytest.mark.parametrize(
    ("fault", "status", "label"),
    [("tool_timeout_rate", "timeout", "env_dependency"), ("verifier_error_rate", "error", "verifier_error")],
    ids=["tool-timeout", "verifier-crash"],
)
def test_system_faults_stay_system_failures(lake, bus, drain, tokenizer, fault, status, label):
    faults = FaultConfig.none().model_copy(update={fault: 1.0})
    result, _ = play(bus, tokenizer, task_of("calc", "1", "+", "2"), [calc("1 + 2"), ANSWER], faults=faults)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["failure_origin"], row["failure_label"]) == (status, "system", label)
    assert row["reward"] is None  # never trained as a reward of 0


def test_re_encoding_a_call_the_model_wrote_changes_its_ids_and_a_naive_client_is_flagged(
    lake, bus, drain, tokenizer
):
    """encode(decode(z)) != z for tool calls written token by token with the demo's tokenizer: the answer
    call spelled in ordinary tokens decodes to the text of its one added token, and a call split off its
    BPE merges decodes to text that encodes merged. The engine's ids are kept; a client that decodes
    and re-encodes the conversation breaks the prefix invariant, and the recorder flags the drift."""
    result, teacher = play(bus, tokenizer, task_of("calc", "7", "*", "8"), [calc("7 * 8"), ANSWER])

    def spelled(text: str) -> list[int]:  # token by token, as a model may sample it: a split BPE never merged
        return [
            i
            for k in range(0, len(text), 3)
            for i in tokenizer.encode(text[k : k + 3], add_special_tokens=False)
        ]

    def reencoded(ids: list[int]) -> list[int]:
        return tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)

    for text in (ANSWER, calc("7 * 8")):
        z = spelled(text)
        assert tokenizer.decode(z) == text and reencoded(z) != z
    assert reencoded(spelled(ANSWER)) == tokenizer.encode(ANSWER, add_special_tokens=False)  # one added token

    # the same conversation, its call written split: engine ids kept (tito) vs decoded and re-encoded (naive)
    (call_start, call_len, _), (answer_start, _, _) = teacher.spans
    prompt, tool = result.token_ids[:call_start], result.token_ids[call_start + call_len : answer_start]
    call = (
        spelled(calc("7 * 8")) + result.token_ids[call_start + call_len - 1 : call_start + call_len]
    )  # <|im_end|>
    recorder = Recorder(bus, "tito-replay", vocab_size=len(tokenizer))
    for client in ("tito", "naive"):
        with recorder.start(client) as traj:
            traj.turn(call, [0.0] * len(call), 0, full_input_token_ids=prompt)
            history = prompt + call + tool
            seen = reencoded(history) if client == "naive" else history
            traj.turn(spelled(ANSWER), [0.0] * len(spelled(ANSWER)), 0, full_input_token_ids=seen)
            traj.finish("completed")
    drain()
    flagged = lake.sql(
        "select task_id, tito_drift from trajectories where run_id = 'tito-replay' order by task_id"
    )
    assert flagged.to_pylist() == [
        {"task_id": "naive", "tito_drift": True},
        {"task_id": "tito", "tito_drift": False},
    ]
