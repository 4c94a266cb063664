"""Projection rows of a fixed set of events, written out literally: the SQL must keep producing them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from trajlake.schemas import events_to_table
from trajlake.schemas.events import TOKEN_FIELDS
from trajlake.schemas.tables import TABLE_SCHEMAS
from trajlake.store import files as files_module
from trajlake.store import projections as pj
from trajlake.store import summaries
from trajlake.store.summaries import SUMMARY_COLUMNS

T0 = dt.datetime(2026, 1, 31, 12, 0, tzinfo=dt.UTC)


def at(second: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=second)


def event(i: int, event_type: str, **fields: Any) -> dict[str, Any]:
    envelope = {"event_id": f"e{i:02d}", "event_type": event_type, "schema_version": 1, "run_id": "r"}
    return {**envelope, "event_time": at(i), "producer_id": "p", **fields}


EVENTS = [
    event(0, "policy_updated", policy_version=3, step=3, checkpoint="ckpt/3", metrics={"loss": 0.5}),
    event(1, "trajectory_started", trajectory_id="t", seq=0, task_id="task", group_id="g", sample_index=1,
          environment="math", harness="h", model="m", context_budget_tokens=100, vocab_size=50,
          sampling_params={"temperature": 1.0}),
    event(2, "turn", trajectory_id="t", seq=1, turn_index=0, policy_version=3, input_token_ids=[1, 2, 3],
          output_token_ids=[4, 5], output_logprobs=[-0.5, -0.25], loss_mask=[True, False],
          finish_reason="tool_calls", context_used_fraction=0.05, latency_s=0.5, advantage=0.25),
    event(3, "tool_call", trajectory_id="t", seq=2, call_id="c1", tool_name="python", arguments={"code": "1+1"},
          is_code_execution=True),
    event(4, "tool_result", trajectory_id="t", seq=3, call_id="c1", tool_name="python", ok=False,
          error_type="timeout", timed_out=True, output_tokens=2, latency_s=1.5, retries=2),
    event(5, "tool_result", trajectory_id="t", seq=4, call_id="c2", tool_name="bash", ok=True),
    event(6, "turn", trajectory_id="t", seq=5, turn_index=1, policy_version=4, input_token_ids=[6, 7],
          input_is_full=True, tito_drift=True, nudged=True, output_token_ids=[8], output_logprobs=[-1.0]),
    event(7, "reward", trajectory_id="t", seq=6, reward=1.0, verifier="exact", reward_components={"a": 1.0}),
    event(8, "trajectory_finished", trajectory_id="t", seq=7, status="completed", failure_origin="model",
          failure_label="model_capability", message="done"),
    event(9, "batch_consumed", step=4, trainer_version=4, consumed_trajectory_ids=["t", "u"],
          consumed_staleness=[1, 2], consumed_advantages=[0.5, -0.5]),
    event(10, "trajectory_started", trajectory_id="u", seq=0, task_id="task2", group_id="g", sample_index=0),
]  # fmt: skip

F05 = 0.05000000074505806  # 0.05 as float32


def version(policy_version: int, n_turns: int, n_output_tokens: int, sum_logprob: float) -> dict:
    """One item of `trajectories.turns_by_version`."""
    return {"policy_version": policy_version, "n_turns": n_turns, "n_output_tokens": n_output_tokens,
            "sum_logprob": sum_logprob}  # fmt: skip


EXPECTED: dict[str, list[tuple]] = {
    "turns": [
        ("r", "t", "e02", 1, 0, 3, 3, 2, 1, False, "tool_calls", F05, False, False, 0.5, -0.75, None, at(2), 0.25),
        ("r", "t", "e06", 5, 1, 4, 2, 1, 1, True, None, None, True, True, None, -1.0, None, at(6), None),
    ],
    "tool_calls": [
        ("r", "t", "c1", "python", '{"code":"1+1"}', True, True, False, "timeout", True, False, 2, 2, 1.5,
         2, 3, at(3), at(4)),
        ("r", "t", "c2", "bash", None, False, True, True, None, False, False, None, 0, None,
         None, 4, None, at(5)),
    ],
    "trajectories": [
        ("r", "t", "task", "g", 1, "math", "h", "m", 100, 3, 4, 1.0, None, "completed", "model",
         "model_capability", "done", True, 2, 2, 1, 1, 0, 2, 1, 3, 2, 8, -1.75, F05, True, 1, True, 1,
         at(1), at(8), [version(3, 1, 2, -0.75), version(4, 1, 1, -1.0)], 0.5, 0.5, 1, None),
        ("r", "u", "task2", "g", 0, None, None, None, None, None, None, None, None, None, None,
         None, None, False, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, None, False, 0, False, 0,
         at(10), None, None, None, None, 0, None),
    ],
    "policy_versions": [("r", 3, 3, "ckpt/3", '{"loss":0.5}', at(0))],
    "batch_consumption": [("r", 4, 4, "t", 1, at(9), 0.5), ("r", 4, 4, "u", 2, at(9), -0.5)],
    "rewards": [("r", "t", 6, "exact", None, 1.0, None, '{"a":1.0}', at(7))],
}  # fmt: skip

SCALAR_COLUMNS = (
    "event_id", "event_type", "run_id", "trajectory_id", "seq", "event_time", "task_id", "group_id",
    "sample_index", "environment", "harness", "model", "context_budget_tokens", "turn_index",
    "policy_version", "input_is_full", "finish_reason", "context_used_fraction", "nudged", "tito_drift",
    "latency_s", "call_id", "tool_name", "arguments", "is_code_execution", "ok", "error_type", "timed_out",
    "truncated", "output_tokens", "retries", "reward", "reward_components", "verifier", "verifier_error",
    "status", "failure_origin", "failure_label", "message", "step", "checkpoint", "metrics", "trainer_version",
    "consumed_trajectory_ids", "consumed_staleness", "advantage", "consumed_advantages", "verifier_version",
)  # fmt: skip


@pytest.fixture(scope="module")
def projected() -> dict:
    return pj.compute(pj.scalarize(events_to_table(EVENTS)))


@pytest.mark.parametrize("name", sorted(EXPECTED), ids=sorted(EXPECTED))
def test_projection_rows_of_known_events(projected: dict, name: str) -> None:
    table = projected[name]
    assert table.schema.equals(TABLE_SCHEMAS[name])
    rows = [tuple(row.values()) for row in table.to_pylist()]
    assert rows == EXPECTED[name]


def test_projections_read_these_event_columns() -> None:
    assert pj.SCALAR_COLUMNS == SCALAR_COLUMNS
    assert pj.STORED_COLUMNS == SCALAR_COLUMNS + SUMMARY_COLUMNS  # no token payload
    assert pj.EVENT_COLUMNS == SCALAR_COLUMNS + TOKEN_FIELDS  # of a file older than the summary


@pytest.mark.parametrize(
    ("rescored", "reward"), [(0.0, 0.0), (None, None)], ids=["a re-score", "a re-score that could not score"]
)
def test_the_latest_reward_wins_and_every_reward_is_kept(
    rescored: float | None, reward: float | None
) -> None:
    """A re-score appends a reward event with its verifier version: `trajectories` takes the latest (its
    verifier error too: never the previous verifier's reward), `rewards` keeps both."""
    again = event(11, "reward", trajectory_id="t", seq=8, reward=rescored, verifier="exact2",
                  verifier_version="v2", verifier_error=None if rescored is not None else "crashed")  # fmt: skip
    out = pj.compute(pj.scalarize(events_to_table([*EVENTS, again])))
    row = (
        out["trajectories"].filter(pc.equal(out["trajectories"].column("trajectory_id"), "t")).to_pylist()[0]
    )
    assert (row["reward"], row["verifier_version"]) == (reward, "v2")
    assert row["verifier_error"] == (None if rescored is not None else "crashed")
    kept = out["rewards"].select(["seq", "verifier_version", "reward"]).to_pylist()
    assert kept == [{"seq": 6, "verifier_version": None, "reward": 1.0},
                    {"seq": 8, "verifier_version": "v2", "reward": rescored}]  # fmt: skip


def test_a_turns_advantage_reaches_the_turns_table_and_is_null_when_not_sent(projected: dict) -> None:
    assert projected["turns"].column("advantage").to_pylist() == [0.25, None]


def test_per_turn_sums_skip_null_and_empty_lists_wherever_they_fall():
    """`_list_sums` (logprob sums, loss-mask counts) matches a plain sum per row, with null and
    empty lists first, between and last, over a column of several chunks."""
    rows = [None, [], [0.5, -1.25], None, [2.0], [], [-0.5, -0.5, 1.0], []]
    column = pa.chunked_array(
        [pa.array(rows[:3], pa.list_(pa.float32())), pa.array(rows[3:], pa.list_(pa.float32()))]
    )
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0), dtype=np.int64)
    assert summaries._list_sums(column, lengths, np.float64).tolist() == [sum(r or []) for r in rows]
    masks = pa.array([[True, False, True], None, [], [False], [True]], pa.list_(pa.bool_()))
    lengths = np.asarray(pc.fill_null(pc.list_value_length(masks), 0), dtype=np.int64)
    assert summaries._list_sums(masks, lengths, np.int64).tolist() == [2, 0, 0, 0, 1]
    assert summaries._list_sums(
        pa.array([None, []], pa.list_(pa.bool_())), np.zeros(2, np.int64), np.int64
    ).tolist() == [0, 0]


def random_turns(count: int) -> list[dict[str, Any]]:
    """Turns of random lengths over a small vocabulary (n-grams repeat), some token lists null."""
    rng = np.random.default_rng(7)
    turns = []
    for i in range(count):
        n = int(rng.integers(0, 40))
        tokens = rng.integers(0, 6, n).tolist()
        turns.append(event(i, "turn", trajectory_id=f"t{i % 4}", seq=i, turn_index=i, policy_version=1,
                           input_token_ids=None if i % 5 == 0 else tokens[: n // 2], output_token_ids=tokens,
                           output_logprobs=[-0.5] * n, loss_mask=None if i % 7 == 0 else [True] * n))  # fmt: skip
    return turns


def test_scalarize_gives_the_same_rows_when_split_across_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of rows reduced on several threads add up to the rows of one pass over the table:
    lengths, sums and repetition of every turn, null token lists among them, stay in place."""
    turns = random_turns(31)
    table = events_to_table(turns)
    whole = summaries.summarize(table).select(list(pj.STORED_COLUMNS))
    monkeypatch.setattr(files_module, "cores", lambda: 3)
    monkeypatch.setattr(files_module, "SUMMARIZE_SLICE_ROWS", 4)
    split = pj.scalarize(table)
    assert split.to_pylist() == whole.to_pylist()
    assert split.column("n_output_tokens").to_pylist() == [len(t["output_token_ids"]) for t in turns]
    assert split.column("output_repetition").null_count < len(turns)  # some turns do repeat


@pytest.mark.parametrize(("min_rows_per_file", "files"), [(1_000, 1), (10, 2)])
def test_a_sink_batch_is_one_block_per_file_and_keeps_it_when_summarized(
    monkeypatch: pytest.MonkeyPatch, min_rows_per_file: int, files: int
) -> None:
    """Many small decoded tables combine into one contiguous block per file that `write_files`
    writes, and a summary computed on several threads leaves those blocks as they are: a batch
    split otherwise is copied whole again by its file's writer (bench/ingest.py: a tenth of the
    sink's CPU). The rows are those of one summary of the whole batch."""
    turns = random_turns(40)
    tables = [events_to_table(turns[i : i + 3]) for i in range(0, len(turns), 3)]
    monkeypatch.setattr(files_module, "cores", lambda: 2)
    monkeypatch.setattr(files_module, "SUMMARIZE_SLICE_ROWS", 4)
    monkeypatch.setattr(files_module, "MIN_ROWS_PER_FILE", min_rows_per_file)
    batch = files_module.summarized(files_module.combine_in_parts(tables))
    assert files_module.file_parts(batch.num_rows) == files
    assert {batch.column(name).num_chunks for name in ("event_id", "output_token_ids")} == {files}
    assert batch.to_pylist() == summaries.summarize(pa.concat_tables(tables)).to_pylist()
