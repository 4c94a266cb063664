"""The run's tokenizer: found from its recorded model or `--tokenizer`, token text, chat messages, SQL's detokenize()."""

from __future__ import annotations

import sys

import pytest

from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake
from trajlake.store.tokenizer import TokenizerNotFound, find_decoder, load_decoder

PROMPT = "<|im_start|>user\nWhat is 2+3? Answer in Français.<|im_end|>\n<|im_start|>assistant\n"
ANSWER = "Cinq — ça fait 5.<|im_end|>"


@pytest.fixture(scope="module")
def lake(tmp_path_factory, model_dir, tokenizer):
    """Run `local` recorded the tiny model's directory; run `remote` a model name not on this machine."""
    lake = Lake(tmp_path_factory.mktemp("tok") / "lake")
    bus = InProcessBus()
    for run_id, model in (("local", str(model_dir)), ("remote", "some-org/remote-model")):
        traj = Recorder(bus, run_id).start("task", trajectory_id=f"{run_id}-1", model=model)
        out = tokenizer.encode(ANSWER)
        traj.turn(out, [-0.5] * len(out), 0, input_token_ids=tokenizer.encode(PROMPT))
        traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def test_each_tokens_text_joins_into_the_decoded_text(model_dir, tokenizer) -> None:
    ids = tokenizer.encode(PROMPT + ANSWER)
    pieces = find_decoder(str(model_dir)).pieces(ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)  # a character split over tokens goes to its last token


def test_a_prompt_rendered_by_the_chat_template_becomes_role_content_pairs(model_dir, tokenizer) -> None:
    decoder = find_decoder(str(model_dir))
    assert decoder.messages(tokenizer.encode(PROMPT), "user") == [
        {"role": "user", "content": "What is 2+3? Answer in Français."}
    ]
    assert decoder.reply(tokenizer.encode(ANSWER)) == "Cinq — ça fait 5."


def test_a_tokenizer_json_file_decodes_too(tmp_path) -> None:
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(8)}, unk_token="w0")).save(str(path))
    decoder = find_decoder("anything", override=str(path))
    assert decoder.pieces([3, 5]) == ["w3", " w5"]
    assert decoder.messages([3, 5], "tool") == [{"role": "tool", "content": "w3 w5"}]  # no template


@pytest.mark.parametrize(
    "model, override, says",
    [
        ("some-org/remote-model", None, "no tokenizer for the run's model 'some-org/remote-model'"),
        (None, None, "the run recorded no model"),
        ("x", "/no/such/dir", "--tokenizer /no/such/dir does not load"),
    ],
    ids=["model-not-here", "no-model", "bad-override"],
)
def test_a_tokenizer_that_cannot_be_found_names_the_fix(model, override, says) -> None:
    with pytest.raises(TokenizerNotFound) as err:
        find_decoder(model, override)
    assert says in str(err.value) and "--tokenizer" in str(err.value)


def test_a_model_neither_here_nor_cached_is_ruled_out_before_transformers_loads(monkeypatch) -> None:
    # loading transformers (and torch) takes seconds: the Health page of a run whose model is a
    # remote name paid them on every cold render, only to learn that nothing could load
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now fails
    load_decoder.cache_clear()
    with pytest.raises(
        TokenizerNotFound, match="neither a directory here nor a model in the Hugging Face cache"
    ):
        find_decoder("synthetic-7b")
    load_decoder.cache_clear()


def sql(lake: Lake, query: str, *options: str) -> int:
    return main(["sql", "--lake", lake.root, "--format", "json", *options, query])


DETOKENIZE = """select trajectory_id, detokenize(input_token_ids, model) as prompt,
  detokenize(output_token_ids, model) as answer, input_token_ids, output_token_ids
from turns join trajectories using (run_id, trajectory_id) where run_id = ?"""


def test_sql_detokenize_is_the_runs_tokenizers_decode(lake, tokenizer, capsys) -> None:
    import json

    assert sql(lake, DETOKENIZE.replace("?", "'local'")) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["prompt"] == tokenizer.decode(row["input_token_ids"]) == PROMPT
    assert row["answer"] == tokenizer.decode(row["output_token_ids"]) == ANSWER


def test_sql_detokenize_without_a_local_tokenizer_says_to_pass_one(lake, model_dir, capsys) -> None:
    import json

    assert sql(lake, DETOKENIZE.replace("?", "'remote'")) == 2
    err = capsys.readouterr().err
    assert "some-org/remote-model" in err and "--tokenizer DIR" in err and "Traceback" not in err
    assert sql(lake, DETOKENIZE.replace("?", "'remote'"), "--tokenizer", str(model_dir)) == 0
    assert json.loads(capsys.readouterr().out)[0]["answer"] == ANSWER


def test_sql_help_documents_detokenize(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["sql", "--help"])
    assert "detokenize(token_ids, model)" in " ".join(capsys.readouterr().out.split())


@pytest.fixture(scope="module")
def wide_lake(tmp_path_factory, model_dir, tokenizer) -> str:
    """40 trajectories of 3 turns each: run `local` recorded the tiny model, run `remote` a name
    not on this machine (decoded with a tokenizer override only)."""
    lake = Lake(tmp_path_factory.mktemp("tok") / "wide")
    bus = InProcessBus()
    for run_id, model in (("local", str(model_dir)), ("remote", "some-org/remote-model")):
        for i in range(20):
            traj = Recorder(bus, run_id).start(
                f"task-{i % 4}", trajectory_id=f"{run_id}-{i:02d}", model=model
            )
            for turn in range(3):
                out = tokenizer.encode(f"Réponse {i}.{turn} — ça fait {i + turn}.<|im_end|>")
                prompt = tokenizer.encode(PROMPT if turn == 0 else f"<|im_start|>user\n{i}<|im_end|>\n")
                traj.turn(out, [-0.5] * len(out), 0, input_token_ids=prompt)
            traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()
    return lake.root


PLAN_SHAPES = {
    "limit": "select output_token_ids as ids, detokenize(output_token_ids, model) as text "
    "from turns join trajectories using (run_id, trajectory_id) where run_id = 'local' limit 3",
    "where": "select output_token_ids as ids, detokenize(output_token_ids, model) as text "
    "from turns join trajectories using (run_id, trajectory_id) where trajectory_id = 'local-07'",
    "order-by": "select output_token_ids as ids, detokenize(output_token_ids, model) as text "
    "from turns join trajectories using (run_id, trajectory_id) where run_id = 'local' "
    "order by trajectory_id desc, seq",
    "big-limit": "select token_ids as ids, detokenize(token_ids, model) as text from trajectories "
    "where run_id = 'local' limit 10000",
    "group-by": "select any_value(input_token_ids) as ids, detokenize(any_value(input_token_ids), "
    "any_value(model)) as text from turns join trajectories using (run_id, trajectory_id) "
    "where run_id = 'local' group by trajectory_id",
    "override": "select output_token_ids as ids, detokenize(output_token_ids, model) as text "
    "from turns join trajectories using (run_id, trajectory_id) where run_id = 'remote'",
}

RACE = """
import json, sys, threading
assert "transformers" not in sys.modules
from trajlake.store.lake import Lake
root, model_dir, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
lake, override = Lake(root), Lake(root)
override.query_engine().tokenizer = model_dir
start, out = threading.Barrier(2 * len(shapes)), {}
def query(name, sql):
    start.wait()
    try:
        rows = (override if name == "override" else lake).sql(sql).to_pylist()
        out[name] = [[r["ids"], r["text"]] for r in rows]
    except Exception as err:
        out[name] = f"{type(err).__name__}: {err}"
threads = [threading.Thread(target=query, args=item) for item in [*shapes.items()] * 2]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def test_detokenize_loads_the_tokenizer_once_under_concurrent_queries_of_every_plan_shape(
    wide_lake, model_dir, tokenizer
) -> None:
    """In a fresh process (transformers not imported yet): each plan shape runs on two threads at
    once, each on DuckDB's own threads, and every row comes back decoded. A lazy import raced
    across them: `module 'transformers' has no attribute 'AutoTokenizer'`."""
    import json
    import subprocess

    args = [sys.executable, "-c", RACE, wide_lake, str(model_dir), json.dumps(PLAN_SHAPES)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    failed = {name: rows for name, rows in results.items() if isinstance(rows, str)}
    assert not failed
    for name, rows in results.items():
        assert rows, name
        assert all(text == tokenizer.decode(ids) for ids, text in rows), name


def test_trajlake_sql_decodes_in_a_fresh_process_with_the_tokenizer_env_var(
    wide_lake, model_dir, tokenizer
) -> None:
    """The report's own command: `trajlake sql … where trajectory_id = …` with TRAJLAKE_TOKENIZER."""
    import json
    import os
    import subprocess

    query = PLAN_SHAPES["override"] + " order by trajectory_id, seq"
    proc = subprocess.run(
        [sys.executable, "-c", "from trajlake.cli import run; run()", "sql", "--lake", wide_lake,
         "--format", "json", query],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TRAJLAKE_TOKENIZER": str(model_dir)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert len(rows) == 60 and all(r["text"] == tokenizer.decode(r["ids"]) for r in rows)
