"""`trajlake export`: selected trajectories with their tokens (and chat text) as Parquet, JSON Lines, or a dataset."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake

SELECT = (
    "select run_id, trajectory_id, reward from trajectories where run_id = 'exp' and status = 'completed'"
)


def record_chat(recorder: Recorder, tokenizer, trajectory_id: str, model: str) -> None:
    """A two-turn tool-using trajectory whose tokens are real text of the tiny model."""
    traj = recorder.start("task", trajectory_id=trajectory_id, model=model)
    turns = [
        ("<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n", "Let me compute.<|im_end|>\n"),
        (
            "<|im_start|>user\n<tool_response>5</tool_response><|im_end|>\n<|im_start|>assistant\n",
            "5<|im_end|>",
        ),
    ]
    for prompt, answer in turns:
        out = tokenizer.encode(answer)
        traj.turn(out, [-0.5] * len(out), 0, input_token_ids=tokenizer.encode(prompt))
    traj.reward(1.0)
    traj.finish("completed")


@pytest.fixture(scope="module")
def lake(tmp_path_factory, model_dir, tokenizer):
    """A loadgen run `exp`, and a chat trajectory in run `r1` (model: the tiny model's directory)
    and in run `r2` (model: a name with no local tokenizer)."""
    lake = Lake(tmp_path_factory.mktemp("export") / "lake")
    bus = InProcessBus()
    generate(bus, LoadgenConfig(run_id="exp", trajectories=40, turns=3, seed=11))
    record_chat(Recorder(bus, "r1"), tokenizer, "chat-1", str(model_dir))
    record_chat(Recorder(bus, "r2"), tokenizer, "chat-2", "some-org/remote-model")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def export(lake: Lake, out: Path, query: str, *options: str) -> int:
    return main(["export", "--lake", lake.root, "--sql", query, "--out", str(out), *options])


def expected(lake: Lake, query: str = SELECT) -> dict[str, tuple[list[int], list[bool]]]:
    rows = lake.sql(
        f"select trajectory_id, token_ids, loss_mask from trajectories where trajectory_id in (select trajectory_id from ({query}))"
    )
    return {r["trajectory_id"]: (r["token_ids"], r["loss_mask"]) for r in rows.to_pylist()}


def read_rows(out: Path, fmt: str) -> list[dict]:
    if fmt == "jsonl":
        return [
            json.loads(line) for path in sorted(out.glob("*.jsonl")) for line in path.read_text().splitlines()
        ]
    if fmt == "hf":
        import datasets

        return list(datasets.load_dataset(str(out), split="train", cache_dir=str(out.parent / "hf-cache")))
    return pq.read_table(out).to_pylist()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "hf"])
def test_each_format_holds_the_selected_rows_with_the_tokens_sql_returns(lake, tmp_path, fmt, capsys) -> None:
    out = tmp_path / "out"
    assert export(lake, out, SELECT, "--format", fmt) == 0
    rows = read_rows(out, fmt)
    want = expected(lake)
    assert len(rows) == len(want) > 0
    assert {r["trajectory_id"]: (r["token_ids"], r["loss_mask"]) for r in rows} == want
    assert {"run_id", "trajectory_id", "reward", "token_ids", "logprobs", "loss_mask"} <= set(rows[0])
    assert all(len(r["logprobs"]) == len(r["token_ids"]) for r in rows)
    err = capsys.readouterr().err
    assert f"export: {len(want)}/{len(want)} trajectories" in err  # the progress line
    assert err.count("token ids only") == 1


def test_hf_output_loads_with_datasets(lake, tmp_path) -> None:
    import datasets

    out = tmp_path / "hf"
    assert export(lake, out, SELECT, "--format", "hf") == 0
    data = datasets.load_dataset(
        "parquet", data_dir=str(out / "data"), split="train", cache_dir=str(tmp_path / "c")
    )
    assert data.num_rows == len(expected(lake))
    assert data.features["token_ids"].feature.dtype == "int32"


def test_a_new_export_loads_its_own_rows_where_datasets_cached_an_earlier_one(lake, tmp_path) -> None:
    """`datasets` caches what it loads under the directory's name; a later export of other rows,
    re-exported in place or under the same name elsewhere, must load its own rows, not the cache's."""
    import datasets

    cache = str(tmp_path / "hf-cache")  # one cache, as a user's ~/.cache/huggingface is

    def load(out: Path) -> set[str]:
        return set(datasets.load_dataset(str(out), split="train", cache_dir=cache)["trajectory_id"])

    first, other = tmp_path / "a" / "sft", tmp_path / "b" / "sft"
    assert export(lake, first, SELECT + " limit 3", "--format", "hf") == 0
    assert len(load(first)) == 3
    assert export(lake, other, SELECT, "--format", "hf") == 0
    assert load(other) == set(expected(lake))
    assert export(lake, first, SELECT + " limit 5", "--format", "hf", "--force") == 0
    assert len(load(first)) == 5


def test_batches_and_files_are_bounded_and_hold_every_row(lake, tmp_path) -> None:
    out = tmp_path / "out"
    assert export(lake, out, SELECT, "--batch-rows", "4", "--rows-per-file", "10") == 0
    files = sorted(out.glob("part-*.parquet"))
    assert [pq.read_metadata(f).num_rows for f in files[:-1]] == [10] * (len(files) - 1)
    assert {r["trajectory_id"] for r in pq.read_table(out).to_pylist()} == set(expected(lake))


def test_a_non_empty_directory_needs_force(lake, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert export(lake, out, SELECT, "--rows-per-file", "5") == 0
    (out / "notes.txt").write_text("mine")
    assert export(lake, out, SELECT + " limit 3") == 2
    assert "--force" in capsys.readouterr().err
    assert export(lake, out, SELECT + " limit 3", "--force") == 0
    assert [pq.read_metadata(f).num_rows for f in out.glob("part-*")] == [3]  # the earlier files are gone
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "query, says",
    [
        ("select trajectory_id, nope from trajectories", 'column "nope" not found'),
        ("selec trajectory_id from trajectories", "syntax error"),
        ("select run_id, reward from trajectories", "no trajectory_id column"),
        ("delete from trajectories", "DELETE statements are refused"),
    ],
    ids=["bad-column", "syntax", "no-trajectory-id", "write"],
)
def test_a_query_that_cannot_be_exported_exits_2_with_the_reason(lake, tmp_path, capsys, query, says) -> None:
    assert export(lake, tmp_path / "out", query) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_id_found_in_two_runs_needs_run_id_in_the_query(tmp_path, capsys) -> None:
    lake = Lake(tmp_path / "lake")
    bus = InProcessBus()
    generate(bus, LoadgenConfig(run_id="a", trajectories=3, seed=1))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    # ids are unique per lake when recorded; a lake assembled from two imports may repeat one
    row = lake.read("trajectories").slice(0, 1)
    lake.append("trajectories", row.set_column(row.schema.get_field_index("run_id"), "run_id", [["b"]]))
    query = "select trajectory_id from trajectories"
    assert export(lake, tmp_path / "out", query) == 2
    assert "add run_id" in capsys.readouterr().err
    assert export(lake, tmp_path / "out", "select run_id, trajectory_id from trajectories") == 0
    assert pq.read_table(tmp_path / "out").num_rows == 4
    lake.close()


CHAT = [
    {"role": "user", "content": "What is 2+3?"},
    {"role": "assistant", "content": "Let me compute."},
    {"role": "tool", "content": "5"},
    {"role": "assistant", "content": "5"},
]
"""`record_chat`'s trajectory as clean messages: no ChatML markup, the tool output its own message."""


def test_messages_are_each_turn_decoded_with_the_runs_tokenizer(lake, tokenizer, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    query = "select run_id, trajectory_id from trajectories where run_id in ('r1', 'r2')"
    assert export(lake, out, query, "--format", "jsonl") == 0
    by_run = {r["run_id"]: r for r in read_rows(out, "jsonl")}
    assert by_run["r1"]["messages"] == CHAT
    assert by_run["r2"]["messages"] is None  # its model is not on this machine
    assert "some-org/remote-model" in capsys.readouterr().err


def test_a_templated_prompt_is_split_into_its_messages(model_dir, tokenizer, tmp_path) -> None:
    """The demo's prompt (system + tools + user, rendered by the chat template) as its own messages."""
    from trajlake.rollout.engine.chat import ChatSession

    chat = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "calc 3 + 4"}]
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
    session = ChatSession(tokenizer, chat, tools=tools)
    prompt = session.take_pending()
    output = tokenizer.encode('<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call><|im_end|>')
    session.add_output(output)
    result = session.add_messages([{"role": "tool", "content": "7"}])
    lake = Lake(tmp_path / "lake")
    bus = InProcessBus()
    traj = Recorder(bus, "demo").start("task", trajectory_id="t", model=str(model_dir))
    traj.turn(output, [-0.1] * len(output), 0, input_token_ids=prompt)
    traj.turn(tokenizer.encode("7<|im_end|>"), [-0.1] * 2, 0, input_token_ids=result)
    traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    assert export(lake, tmp_path / "out", "select trajectory_id from trajectories") == 0
    (row,) = pq.read_table(tmp_path / "out").to_pylist()
    system, *rest = row["messages"]
    assert system["role"] == "system" and system["content"].startswith("Use the tools.\n\n# Tools")
    assert rest == [
        {"role": "user", "content": "calc 3 + 4"},
        {"role": "assistant", "content": '<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]
    lake.close()


def test_tokenizer_option_decodes_a_run_whose_model_is_elsewhere(lake, model_dir, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    query = "select run_id, trajectory_id from trajectories where run_id = 'r2'"
    assert export(lake, out, query, "--tokenizer", str(model_dir)) == 0
    (row,) = pq.read_table(out).to_pylist()
    assert row["messages"] == CHAT
    assert export(lake, tmp_path / "o2", query, "--tokenizer", str(tmp_path / "none")) == 2
    assert "--tokenizer" in capsys.readouterr().err
