"""The demo environment: scripted policies play episodes; the lake shows how each one ended."""

from __future__ import annotations

import random
import time

import pytest

from trajlake.demo.envs import EnvConfig, FaultConfig, run_episode
from trajlake.demo.envs import vocab as v
from trajlake.demo.envs.tasks import Task, make_tasks, solve
from trajlake.ingest.recorder import Recorder


class ScriptedPolicy:
    """Plays fixed turns (lists of token words) and reports a fixed policy version per turn."""

    def __init__(self, turns: list[list[str]], versions: list[int] | None = None) -> None:
        self.turns, self.versions, self.calls = turns, versions, 0
        self.contexts: list[list[int]] = []

    def sample(self, context, max_new_tokens, stop_ids):
        self.contexts.append(list(context))
        words = self.turns[min(self.calls, len(self.turns) - 1)]
        version = self.versions[self.calls] if self.versions else 0
        self.calls += 1
        ids = v.encode(words)[:max_new_tokens]
        return ids, [-0.25] * len(ids), version


def task_of(kind: str, operands: tuple[str, ...]) -> Task:
    prompt = (v.BOS, *v.encode((kind, *operands)))
    return Task(f"{kind}-test", kind, operands, prompt, solve(kind, operands))


def play(bus, task, policy, **config) -> object:
    faults = config.pop("faults", FaultConfig.none())
    recorder = Recorder(bus, "env-test", vocab_size=v.VOCAB_SIZE, flush_each_turn=False)
    return run_episode(recorder, task, policy, EnvConfig(faults=faults, **config), random.Random(0))


def stored(lake, trajectory_id):
    return lake.sql(
        "select * from trajectories where trajectory_id = $id", {"id": trajectory_id}
    ).to_pylist()[0]


@pytest.mark.parametrize(
    ("task", "call"),
    [
        (task_of("calc", ("7", "*", "8")), "<call:calc>"),
        (task_of("reverse", ("a", "b", "c")), "<call:python>"),
        (task_of("count", ("a", "in", "a", "b", "a")), "<call:python>"),
    ],
    ids=["arithmetic-needs-calc", "reverse-needs-python", "count-needs-python"],
)
def test_the_right_tool_then_answer_earns_full_reward(lake, bus, drain, task, call):
    result = play(bus, task, ScriptedPolicy([[call], ["<answer>"]]))
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["reward"], row["failure_origin"]) == ("completed", 1.0, None)
    assert (row["n_turns"], row["n_tool_calls"], row["n_tool_errors"]) == (2, 1, 0)
    assert row["n_code_exec"] == (call == "<call:python>")
    # token-in, token-out: the lake holds exactly the ids the policy saw and sampled
    assert row["token_ids"] == result.token_ids
    assert [bool(m) for m in row["loss_mask"]] == result.loss_mask


def test_a_wrong_tool_is_a_model_mistake_it_can_recover_from(lake, bus, drain):
    task = task_of("reverse", ("a", "b", "c"))
    result = play(bus, task, ScriptedPolicy([["<call:calc>"], ["<call:python>"], ["<answer>"]]))
    drain()
    assert stored(lake, result.trajectory_id)["reward"] == 1.0
    calls = lake.sql(
        "select tool_name, ok, error_type from tool_calls where trajectory_id = $id order by call_seq",
        {"id": result.trajectory_id},
    ).to_pylist()
    assert calls == [
        {"tool_name": "calc", "ok": False, "error_type": "tool_error"},  # calc("reverse a b c") fails
        {"tool_name": "python", "ok": True, "error_type": None},
    ]


def test_answering_without_a_tool_is_a_model_failure_with_reward_zero(lake, bus, drain):
    result = play(bus, task_of("calc", ("1", "+", "2")), ScriptedPolicy([["<answer>"]]))
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["reward"], row["failure_origin"], row["failure_label"]) == (0.0, "model", "model_capability")


def test_a_babbling_policy_is_nudged_then_runs_out_of_context(lake, bus, drain):
    policy = ScriptedPolicy([["a", "b", "c", "d"]])
    result = play(bus, task_of("calc", ("1", "+", "2")), policy, max_turns=20)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["failure_origin"], row["reward"]) == ("context_exhausted", "model", 0.0)
    assert row["nudged"] and row["context_peak_fraction"] >= 0.8
    assert any(v.NUDGE in ctx for ctx in policy.contexts)  # the policy saw the nudge token


def test_a_turn_records_the_version_that_sampled_it(lake, bus, drain):
    policy = ScriptedPolicy([["<call:calc>"], ["<answer>"]], versions=[3, 4])
    result = play(bus, task_of("calc", ("2", "*", "3")), policy)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["policy_version_min"], row["policy_version_max"]) == (3, 4)


class TimedPolicy(ScriptedPolicy):
    """A scripted policy that notes how long each of its own `sample` calls took."""

    def __init__(self, turns: list[list[str]]) -> None:
        super().__init__(turns)
        self.took: list[float] = []

    def sample(self, context, max_new_tokens, stop_ids):
        started = time.perf_counter()
        out = super().sample(context, max_new_tokens, stop_ids)
        self.took.append(time.perf_counter() - started)
        return out


def test_every_turn_records_how_long_the_policy_took_to_sample_it(lake, bus, drain):
    policy = TimedPolicy([["<call:calc>"], ["<answer>"]])
    result = play(bus, task_of("calc", ("2", "*", "3")), policy)
    drain()
    stored = lake.sql(
        "select latency_s from turns where trajectory_id = $t order by turn_index",
        {"t": result.trajectory_id},
    )
    latencies = stored.column(0).to_pylist()
    assert len(latencies) == len(policy.took) == 2
    for latency, took in zip(latencies, policy.took, strict=True):
        assert took * (1 - 1e-6) <= latency < took + 1.0  # the call, timed from outside (float32 in the lake)


@pytest.mark.parametrize(
    ("fault", "task", "status", "label"),
    [
        ("tool_timeout_rate", task_of("calc", ("1", "+", "2")), "timeout", "env_dependency"),
        ("sandbox_crash_rate", task_of("reverse", ("a", "b")), "error", "infra"),
        ("missing_dependency_rate", task_of("reverse", ("a", "b")), "error", "env_dependency"),
        ("harness_fault_rate", task_of("calc", ("1", "+", "2")), "error", "harness_behavior"),
        ("verifier_error_rate", task_of("calc", ("1", "+", "2")), "error", "verifier_error"),
    ],
    ids=["tool-timeout", "sandbox-crash", "missing-dependency", "harness-bug", "verifier-crash"],
)
def test_an_injected_fault_is_a_system_failure_with_its_label(lake, bus, drain, fault, task, status, label):
    call = "<call:calc>" if task.kind == "calc" else "<call:python>"
    faults = FaultConfig.none().model_copy(update={fault: 1.0})
    result = play(bus, task, ScriptedPolicy([[call], ["<answer>"]]), faults=faults)
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["status"], row["failure_origin"], row["failure_label"]) == (status, "system", label)
    assert row["reward"] is None  # never trained as a reward of 0


def test_an_answer_cut_off_by_the_tool_output_budget_is_a_tool_design_failure(lake, bus, drain):
    task = task_of("reverse", ("a", "b", "c", "d", "e", "a", "b"))
    result = play(bus, task, ScriptedPolicy([["<call:python>"], ["<answer>"]]), max_tool_output_tokens=6)
    assert len(task.answer) == 7
    drain()
    row = stored(lake, result.trajectory_id)
    assert (row["failure_origin"], row["failure_label"], row["n_tool_truncated"]) == (
        "system",
        "tool_design",
        1,
    )


def test_tasks_are_reproducible_and_fit_the_context_budget():
    config = EnvConfig()
    tasks = make_tasks(300, seed=5, config=config)
    assert tasks == make_tasks(300, seed=5, config=config)
    assert {t.kind for t in tasks} == {"calc", "reverse", "count"}
    assert all(len(t.prompt_ids) <= config.longest_prompt and max(t.prompt_ids) < v.VOCAB_SIZE for t in tasks)
    too_long = [t for t in tasks if len(t.answer) > config.max_tool_output_tokens]
    assert too_long and all(t.kind == "reverse" for t in too_long)  # the injected tool-design fault
