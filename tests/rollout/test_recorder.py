"""The Recorder, end to end through the embedded bus into the lake, checked as a user would: with SQL."""

from __future__ import annotations

import json

import pytest

from tests.helpers import trajlake
from trajlake.ingest.recorder import Recorder, RecorderError


def record_three(recorder: Recorder) -> None:
    """One success with reward 1, one system failure, one trajectory whose input broke TITO."""
    with recorder.start("add", "g0", 0, trajectory_id="t1-ok", context_budget_tokens=64) as t:
        t.turn([10, 11], [-0.1, -0.2], 0, full_input_token_ids=[1, 2, 3])
        call = t.tool_call("calculator", {"expr": "2+2"})
        t.tool_result(call, "calculator", ok=True, output_tokens=2)
        t.turn([12], [-0.3], 1, full_input_token_ids=[1, 2, 3, 10, 11, 20, 21])
        t.reward(1.0, verifier="exact")
        t.finish("completed")
    with recorder.start("add", "g0", 1, trajectory_id="t2-sys") as t:
        t.turn([10], [-0.5], 0, full_input_token_ids=[1, 2, 3])
        t.finish("error", failure_origin="system", failure_label="infra", message="sandbox lost")
    with recorder.start("add", "g0", 2, trajectory_id="t3-drift") as t:
        t.turn([10, 11], [-0.1, -0.1], 0, full_input_token_ids=[1, 2, 3])
        assert (
            t.turn([13], [-0.2], 0, full_input_token_ids=[1, 2, 3, 99, 20]) is True
        )  # 10, 11 re-tokenised as 99
        t.reward(0.0)
        t.finish("completed")


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_three_trajectories_show_up_exactly_in_sql(lake, bus, drain) -> None:
    record_three(Recorder(bus, "run-a", vocab_size=128))
    drain()
    out = trajlake(
        "sql", "--lake", lake.root, "--format", "json",
        "select status, failure_origin, tito_drift, reward, n_turns from trajectories order by trajectory_id",
    )  # fmt: skip
    assert json.loads(out.stdout) == [
        {"status": "completed", "failure_origin": None, "tito_drift": False, "reward": 1.0, "n_turns": 2},
        {"status": "error", "failure_origin": "system", "tito_drift": False, "reward": None, "n_turns": 1},
        {"status": "completed", "failure_origin": None, "tito_drift": True, "reward": 0.0, "n_turns": 2},
    ]


def test_tokens_are_stored_once_and_assembled_in_order(lake, bus, drain) -> None:
    record_three(Recorder(bus, "run-a", vocab_size=128))
    drain()
    row = lake.sql("select token_ids, logprobs, loss_mask, assistant_tokens, env_tokens from trajectories "
                   "where trajectory_id = 't1-ok'").to_pylist()[0]  # fmt: skip
    assert row["token_ids"] == [1, 2, 3, 10, 11, 20, 21, 12]
    assert row["loss_mask"] == [False, False, False, True, True, False, False, True]
    assert row["logprobs"] == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.3])
    assert (row["assistant_tokens"], row["env_tokens"]) == (3, 2)
    turns = lake.sql(
        "select n_input_tokens, input_token_ids from turns where trajectory_id = 't1-ok' order by seq"
    )
    assert turns.to_pylist() == [{"n_input_tokens": 3, "input_token_ids": [1, 2, 3]},
                                 {"n_input_tokens": 2, "input_token_ids": [20, 21]}]  # fmt: skip


def test_a_drift_turn_keeps_the_context_the_engine_saw(lake, bus, drain) -> None:
    record_three(Recorder(bus, "run-a", vocab_size=128))
    drain()
    row = lake.sql(
        "select token_ids, n_drift_turns from trajectories where trajectory_id = 't3-drift'"
    ).to_pylist()[0]
    assert row == {"token_ids": [1, 2, 3, 99, 20, 13], "n_drift_turns": 1}


def test_tool_calls_and_context_are_recorded(lake, bus, drain) -> None:
    record_three(Recorder(bus, "run-a", vocab_size=128))
    drain()
    calls = lake.sql("select tool_name, ok, has_result from tool_calls").to_pylist()
    assert calls == [{"tool_name": "calculator", "ok": True, "has_result": True}]
    peak = (
        lake.sql("select context_peak_fraction from trajectories where trajectory_id = 't1-ok'")
        .column(0)[0]
        .as_py()
    )
    assert peak == pytest.approx(8 / 64)


def test_a_crashing_harness_is_recorded_as_a_system_failure(lake, bus, drain) -> None:
    recorder = Recorder(bus, "run-b")
    with pytest.raises(ZeroDivisionError), recorder.start("div", trajectory_id="crash") as t:
        t.turn([1], [-0.1], 0, input_token_ids=[5])
        _ = 1 / 0
    drain()
    row = lake.sql("select status, failure_origin, failure_label, message from trajectories").to_pylist()[0]
    assert row["status"] == "error" and row["failure_origin"] == "system"
    assert row["failure_label"] == "harness_behavior" and "ZeroDivisionError" in row["message"]


def test_recording_after_finish_is_refused(bus) -> None:
    t = Recorder(bus, "r").start("task")
    t.finish("completed")
    with pytest.raises(RecorderError, match="is finished"):
        t.turn([1], [-0.1], 0)


def test_fields_a_type_carries_pass_as_keywords_and_others_are_refused(lake, bus, drain) -> None:
    recorder = Recorder(bus, "run-k")
    with recorder.start("task", trajectory_id="t-k") as t:
        t.turn([4], [-0.1], 0, input_token_ids=[1], attributes={"note": "kept"})
        with pytest.raises(TypeError, match=r"\['call_id'\] for a turn event"):
            t.turn([5], [-0.1], 0, call_id="c1")  # a tool field, not a turn's
        with pytest.raises(TypeError, match=r"\['tito_drift'\]"):
            t.turn([5], [-0.1], 0, tito_drift=True)  # the Recorder decides drift itself
        t.finish("completed")
    drain()
    rows = lake.sql("select attributes from events where event_type = 'turn'").to_pylist()
    assert [json.loads(r["attributes"]) for r in rows] == [{"note": "kept"}]


def test_a_turns_advantage_is_queryable_and_null_when_not_recorded(lake, bus, drain) -> None:
    recorder = Recorder(bus, "run-adv")
    with recorder.start("task", trajectory_id="t-adv") as t:
        t.turn([4], [-0.1], 0, input_token_ids=[1], advantage=0.75)
        t.turn([5], [-0.2], 0, input_token_ids=[2])
        t.finish("completed")
    drain()
    rows = lake.sql("select advantage from turns order by turn_index").to_pylist()
    assert rows == [{"advantage": 0.75}, {"advantage": None}]


def test_a_consumed_batch_keeps_each_trajectorys_advantage(lake, bus, drain) -> None:
    recorder = Recorder(bus, "run-adv", producer_id="trainer")
    recorder.batch_consumed(3, 4, ["a", "b"], [0, 1], advantages=[0.5, -0.5])
    recorder.batch_consumed(4, 5, ["c"], [0])  # a trainer that computed none
    with pytest.raises(ValueError, match="1 advantages for 2 consumed trajectories"):
        recorder.batch_consumed(5, 6, ["d", "e"], [0, 0], advantages=[1.0])
    drain()
    rows = lake.sql("select step, trajectory_id, advantage from batch_consumption order by all").to_pylist()
    assert [tuple(r.values()) for r in rows] == [(3, "a", 0.5), (3, "b", -0.5), (4, "c", None)]


def test_a_trajectory_cut_short_by_a_stop_signal_ends_as_a_system_failure_not_a_harness_bug(lake, bus, drain):
    recorder = Recorder(bus, "run-stop", vocab_size=128)
    with pytest.raises(KeyboardInterrupt), recorder.start("add", trajectory_id="cut") as t:
        t.turn([10], [-0.5], None, full_input_token_ids=[1, 2])
        raise KeyboardInterrupt  # Ctrl-C (SIGTERM raises shutdown.StopRequested, a KeyboardInterrupt)
    drain()
    row = lake.sql(
        "select status, failure_origin, failure_label, message, policy_version_min from trajectories"
    ).to_pylist()
    assert row == [{"status": "error", "failure_origin": "system", "failure_label": "infra",
                    "message": "the producer stopped on SIGINT before the trajectory ended",
                    "policy_version_min": None}]  # fmt: skip
