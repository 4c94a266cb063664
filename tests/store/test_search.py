"""`trajlake search`: a regex over the turns' decoded text, or a run of token ids, counted per policy version."""

from __future__ import annotations

import json

import pytest

from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake

RUN = "srch"
OUTPUTS = {  # policy version -> what the model wrote, one turn each
    0: ["import pdfplumber\nprint(1)", "print(2)"],
    1: ["import pdfplumber\nimport pdfplumber", "import os", "from x import pdfplumber"],
    2: ["print(3)"],
}


@pytest.fixture(scope="module")
def lake(tmp_path_factory, model_dir, tokenizer):
    """Run `srch`: a two-turn trajectory per output above, in the tiny model's tokens."""
    lake = Lake(tmp_path_factory.mktemp("search") / "lake")
    bus = InProcessBus()
    recorder = Recorder(bus, RUN)
    for version, texts in OUTPUTS.items():
        for text in texts:
            traj = recorder.start("task", model=str(model_dir))
            for out in (tokenizer.encode(text), tokenizer.encode("<|im_end|>")):
                traj.turn(out, [-0.5] * len(out), version, input_token_ids=tokenizer.encode("user: go"))
            traj.reward(1.0)
            traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def search(lake: Lake, capsys, *options: str) -> tuple[int, dict]:
    """Exit code and JSON result (its stderr when refused) of `trajlake search` on run `srch`."""
    capsys.readouterr()
    code = main(["search", "--lake", lake.root, "--run", RUN, "--format", "json", *options])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else {"err": out.err}


def by_version(result: dict) -> dict[int, tuple[int, int, int]]:
    return {r["policy_version"]: (r["turns"], r["turns_hit"], r["matches"]) for r in result["by_version"]}


def test_a_regex_is_counted_per_policy_version(lake, capsys) -> None:
    code, result = search(lake, capsys, "--regex", r"import pdfplumber")
    assert code == 0
    # turns read (two per trajectory), turns hit, matches
    assert by_version(result) == {0: (4, 1, 1), 1: (6, 2, 3), 2: (2, 0, 0)}
    assert (result["turns_hit"], result["trajectories_hit"], result["matches"]) == (3, 3, 4)
    assert all("import pdfplumber" in h["first"] for h in result["hits"])


def test_a_token_run_is_found_within_a_turn_only(lake, capsys, tokenizer) -> None:
    pattern = tokenizer.encode("import pdfplumber")[:2]
    rows = lake.sql("select policy_version, output_token_ids from turns where run_id = $run", {"run": RUN})
    expected: dict[int, int] = {}
    for version, ids in zip(*(rows.column(i).to_pylist() for i in range(2)), strict=True):
        found = sum(ids[i : i + len(pattern)] == pattern for i in range(len(ids)))
        expected[version] = expected.get(version, 0) + found
    code, result = search(lake, capsys, "--tokens", ",".join(map(str, pattern)))
    assert code == 0
    assert {v: c[2] for v, c in by_version(result).items()} == expected
    assert expected[1] >= 2  # the brute-force count found what the search counts
    # the last id of one turn and the first of the next never make a match
    last, first = tokenizer.encode("print(3)")[-1], tokenizer.encode("<|im_end|>")[0]
    _, across = search(lake, capsys, "--tokens", f"{last},{first}")
    assert across["matches"] == 0


def test_the_table_output_says_what_it_read(lake, capsys) -> None:
    capsys.readouterr()
    assert (
        main(["search", "--lake", lake.root, "--run", RUN, "--regex", "pdfplumber", "--max-width", "0"]) == 0
    )
    out = capsys.readouterr()
    assert "per policy version:" in out.out and "4 matches in 3 turns of 3 trajectories" in out.out
    assert f"tokens of run '{RUN}'" in out.err  # the plan: how much, about how long


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ([], "search for --regex PATTERN or --tokens"),
        (["--regex", "import (pdf"], "--regex 'import (pdf' is not a regular expression"),
        (["--tokens", "4,x"], "token ids are non-negative integers, comma-separated"),
        (["--regex", "x", "--run", "nope"], "run 'nope' has no turns to search; check --run"),
    ],
    ids=["nothing to find", "bad regex", "bad ids", "unknown run"],
)
def test_a_bad_search_says_the_fix(lake, capsys, options, says) -> None:
    code, refused = search(lake, capsys, *options)
    assert code == 2
    assert says in refused["err"]
