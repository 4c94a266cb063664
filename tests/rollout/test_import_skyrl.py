"""SkyRL importer on GeneratorOutput dumps built here (skyrl_train/generators/base.py field names)."""

from __future__ import annotations

import json
import pickle
import re
import signal
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import wait_until
from trajlake.rollout.importers.skyrl import import_skyrl, split_response

PROMPT_A = [151644, 872, 198, 3838, 374]
PROMPT_B = [151644, 872, 198, 9707, 0]
# a multi-turn response: model tokens (mask 1), tool output (mask 0), model tokens again
RESP = [40, 1184, 13, 151645, 7, 8, 9, 785, 4226, 151645]
MASK = [1, 1, 1, 1, 0, 0, 0, 1, 1, 1]
LPS = [-0.1, -0.2, -0.3, -0.01, 0.0, 0.0, 0.0, -0.4, -0.5, -0.02]


def generator_output(with_ids=True):
    out = {
        "prompt_token_ids": [PROMPT_A, PROMPT_A, PROMPT_B],
        "response_ids": [RESP, [11, 12, 151645], [21, 22, 23, 24]],
        "rewards": [1.0, 0.0, [0.0, 0.0, 0.0, 0.5]],  # scalar or per-token
        "loss_masks": [MASK, [1, 1, 1], [1, 1, 1, 1]],
        "stop_reasons": ["stop", "stop", "length"],
        "rollout_metrics": {"generate/avg_num_tokens": 5.6},
        "rollout_logprobs": [LPS, [-0.1, -0.1, -0.1], [-0.2, -0.2, -0.2, -0.2]],
    }
    if with_ids:
        out["trajectory_ids"] = [
            {"instance_id": "gsm8k-17", "repetition_id": 0},
            {"instance_id": "gsm8k-17", "repetition_id": 1},
            {"instance_id": "gsm8k-42", "repetition_id": 0},
        ]
    return out


def rows(lake, run):
    return lake.sql(
        "select task_id, group_id, sample_index, token_ids, logprobs, loss_mask, n_turns, assistant_tokens, env_tokens, "
        "reward, status, failure_origin from trajectories where run_id = $run order by task_id, sample_index",
        {"run": run},
    ).to_pylist()


def test_split_response_separates_model_turns_from_environment_tokens():
    assert split_response(RESP, MASK, LPS) == [
        ([], RESP[:4], LPS[:4]),
        ([7, 8, 9], RESP[7:], LPS[7:]),
    ]


def test_a_json_dump_is_imported_token_for_token(lake, tmp_path):
    path = tmp_path / "generator_output.json"
    path.write_text(json.dumps(generator_output()))
    report = import_skyrl(lake, [path], "sky")
    assert report.trajectories == 3 and report.dead_letters == 0
    got = rows(lake, "sky")
    assert [(r["group_id"], r["sample_index"]) for r in got] == [
        ("gsm8k-17", 0),
        ("gsm8k-17", 1),
        ("gsm8k-42", 0),
    ]
    a0 = got[0]
    assert a0["token_ids"] == PROMPT_A + RESP
    assert a0["loss_mask"] == [False] * len(PROMPT_A) + [bool(m) for m in MASK]
    assert a0["logprobs"] == pytest.approx([0.0] * len(PROMPT_A) + LPS, abs=1e-6)
    assert (a0["n_turns"], a0["assistant_tokens"], a0["env_tokens"]) == (2, 7, 3)
    assert a0["reward"] == 1.0 and a0["status"] == "completed"
    b0 = got[2]
    assert b0["reward"] == pytest.approx(0.5)  # per-token rewards summed
    assert (b0["status"], b0["failure_origin"]) == ("context_exhausted", "model")  # stop_reason length


def test_a_jsonl_dump_of_single_samples_without_trajectory_ids_groups_by_prompt(lake, tmp_path):
    out = generator_output(with_ids=False)
    path = tmp_path / "samples.jsonl"
    with path.open("w") as fh:
        for i in range(3):
            fh.write(json.dumps({k: v[i] for k, v in out.items() if isinstance(v, list)}) + "\n")
    import_skyrl(lake, [path], "sky-jsonl")
    got = rows(lake, "sky-jsonl")
    groups = {}
    for r in got:
        groups.setdefault(r["group_id"], []).append(r["sample_index"])
    assert sorted(len(v) for v in groups.values()) == [1, 2]
    assert sorted(r["token_ids"] for r in got) == sorted(
        [PROMPT_A + RESP, [*PROMPT_A, 11, 12, 151645], [*PROMPT_B, 21, 22, 23, 24]]
    )


def test_a_pickle_with_skyrl_trajectory_id_objects_loads_without_skyrl(lake, tmp_path, monkeypatch):
    module = types.ModuleType("skyrl_train.generators.base")

    @dataclass
    class TrajectoryID:
        instance_id: str
        repetition_id: int

    TrajectoryID.__module__ = module.__name__
    TrajectoryID.__qualname__ = "TrajectoryID"
    module.TrajectoryID = TrajectoryID
    for name in ("skyrl_train", "skyrl_train.generators", "skyrl_train.generators.base"):
        monkeypatch.setitem(sys.modules, name, module)
    out = generator_output(with_ids=False)
    out["trajectory_ids"] = [TrajectoryID("task-x", 0), TrajectoryID("task-x", 1), TrajectoryID("task-y", 3)]
    path = tmp_path / "dump.pkl"
    path.write_bytes(pickle.dumps(out))
    for name in ("skyrl_train", "skyrl_train.generators", "skyrl_train.generators.base"):
        monkeypatch.delitem(sys.modules, name)  # the importer must not need skyrl_train

    import_skyrl(lake, [path], "sky-pkl")
    assert [(r["group_id"], r["sample_index"]) for r in rows(lake, "sky-pkl")] == [
        ("task-x", 0),
        ("task-x", 1),
        ("task-y", 3),
    ]


def test_without_rollout_logprobs_tokens_are_kept_but_not_trained_on(lake, tmp_path):
    out = generator_output()
    out["rollout_logprobs"] = None
    path = tmp_path / "nolp.json"
    path.write_text(json.dumps(out))
    report = import_skyrl(lake, [path], "sky-nolp")
    got = rows(lake, "sky-nolp")
    assert got[0]["token_ids"] == PROMPT_A + RESP
    assert not any(any(r["loss_mask"]) for r in got)
    assert len(report.warnings) == 3


def test_an_invalid_sample_goes_to_dead_letters_and_the_rest_is_imported(lake, tmp_path):
    out = generator_output()
    out["rollout_logprobs"][1] = [0.5, -0.1, -0.1]  # a positive logprob breaks an ingest invariant
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(out))
    report = import_skyrl(lake, [path], "sky-bad")
    assert report.dead_letters >= 1
    reasons = lake.sql("select reason from dead_letters").column("reason").to_pylist()
    assert any("logprob" in r for r in reasons)
    assert {r["sample_index"] for r in rows(lake, "sky-bad") if r["group_id"] == "gsm8k-17"} >= {0}


def test_a_file_that_is_not_a_generator_output_is_refused(lake, tmp_path):
    from trajlake.rollout.errors import ImportFormatError

    path = tmp_path / "other.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ImportFormatError, match="not a SkyRL GeneratorOutput"):
        import_skyrl(lake, [path], "x")


def test_the_cli_imports_several_files(lake, tmp_path, capsys):
    from trajlake.cli import main

    for i in range(2):
        out = generator_output()
        out["trajectory_ids"] = [
            {"instance_id": f"f{i}-{t['instance_id']}", "repetition_id": t["repetition_id"]}
            for t in out["trajectory_ids"]
        ]
        (tmp_path / f"step{i}.json").write_text(json.dumps(out))
    code = main(
        [
            "import",
            "skyrl",
            str(tmp_path / "step0.json"),
            str(tmp_path / "step1.json"),
            "--lake",
            lake.root,
            "--run",
            "sky-cli",
            "--json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["trajectories"] == 6
    assert len(rows(lake, "sky-cli")) == 6


def test_environment_tokens_after_the_last_model_turn_are_kept(lake, tmp_path):
    out = {
        "prompt_token_ids": [[1, 2]],
        "response_ids": [[3, 4, 5, 6]],
        "loss_masks": [[1, 1, 0, 0]],
        "rollout_logprobs": [[-0.1, -0.2, 0.0, 0.0]],
        "rewards": [0.0],
        "stop_reasons": ["stop"],
    }
    path = tmp_path / "tail.json"
    path.write_text(json.dumps(out))
    report = import_skyrl(lake, [path], "sky-tail")
    assert report.dead_letters == 0
    assert rows(lake, "sky-tail")[0]["token_ids"] == [1, 2, 3, 4, 5, 6]


def test_a_row_without_token_ids_is_stored_as_text_and_flagged(lake, tmp_path):
    out = generator_output()
    del out["response_ids"]
    out["responses"] = ["four", "five", "six"]  # the text a dump kept, without the engine's ids
    path = tmp_path / "text.json"
    path.write_text(json.dumps(out))
    report = import_skyrl(lake, [path], "sky-text")
    assert report.trajectories == 3 and report.dead_letters == 0
    assert sum("no token ids; stored as text" in w for w in report.warnings) == 3
    turns = lake.sql("select output_token_ids, attributes from events where event_type = 'turn'").to_pylist()
    assert sorted(json.loads(t["attributes"])["completion"] for t in turns) == ["five", "four", "six"]
    assert all(t["output_token_ids"] == [] and '"tokens_recorded":false' in t["attributes"] for t in turns)


def test_a_dump_without_versions_stores_them_as_unknown_unless_the_import_names_one(lake, tmp_path):
    path = tmp_path / "generator_output.json"
    path.write_text(json.dumps(generator_output()))
    import_skyrl(lake, [path], "sky-unknown")
    import_skyrl(lake, [path], "sky-v3", policy_version=3)
    got = lake.sql(
        "select run_id, policy_version_min as lo, policy_version_max as hi, count(*) as n from trajectories "
        "where run_id like 'sky-%' group by all order by run_id"
    ).to_pylist()
    assert got == [  # never version 0: a SkyRL dump records no version
        {"run_id": "sky-unknown", "lo": None, "hi": None, "n": 3},
        {"run_id": "sky-v3", "lo": 3, "hi": 3, "n": 3},
    ]
    versions = lake.sql("select distinct policy_version from turns where run_id = 'sky-unknown'").to_pylist()
    assert versions == [{"policy_version": None}]


@pytest.mark.integration  # the CLI in a process of its own, stopped with a real signal
def test_an_import_stopped_by_sigterm_commits_what_it_read_and_the_next_run_adds_the_rest(lake, tmp_path):
    out = generator_output()
    n = 1500  # copies of the dump's three trajectories: long enough to stop in the middle
    out = {k: (v * n if isinstance(v, list) else v) for k, v in out.items()}
    out["trajectory_ids"] = [{"instance_id": f"task-{i}", "repetition_id": 0} for i in range(3 * n)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(out))
    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", "import", "skyrl", str(path),
           "--lake", str(lake.root), "--run", "big"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first_commit = Path(lake.root) / "events" / "_delta_log" / f"{0:020d}.json"
    wait_until(lambda: first_commit.exists() or proc.poll() is not None, 120, "the import's first commit")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    said = re.search(r"skyrl import into run big: committed the [\d,]+ trajectories it held; the lake at \S+ has "
                     r"all ([\d,]+) it imported", err)  # fmt: skip
    assert said, err
    stored = int(said.group(1).replace(",", ""))
    assert 0 < stored < 3 * n
    assert len(rows(lake, "big")) == stored
    again = import_skyrl(lake, [path], "big")  # the rest; what is stored is skipped
    assert (again.skipped_existing, again.trajectories) == (stored, 3 * n - stored)
    count = lake.sql(
        "select count(*) as n, count(distinct trajectory_id) as d from trajectories where run_id = 'big'"
    )
    assert count.to_pylist() == [{"n": 3 * n, "d": 3 * n}]
