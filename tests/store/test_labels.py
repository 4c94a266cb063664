"""Labels: `trajlake label` appends them, the latest per key wins, and doctor and export use them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake

RUN = "lab"


@pytest.fixture
def lake(tmp_path):
    """12 loadgen trajectories of run `lab`."""
    lake, bus = Lake(tmp_path / "lake"), InProcessBus()
    generate(bus, LoadgenConfig(trajectories=12, seed=3, run_id=RUN))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def ids(lake: Lake) -> list[str]:
    return lake.sql("select trajectory_id from trajectories order by trajectory_id").column(0).to_pylist()


def label(lake: Lake, *options: str) -> int:
    return main(["label", "--lake", lake.root, "--run", RUN, "--author", "ann", *options])


def in_force(lake: Lake) -> list[tuple]:
    rows = lake.sql("select trajectory_id, turn_index, key, value, author from current_labels order by all")
    return [tuple(r.values()) for r in rows.to_pylist()]


def test_a_label_is_in_force_the_latest_wins_and_clear_removes_it(lake, capsys) -> None:
    a, b = ids(lake)[:2]
    assert label(lake, "--trajectory", f"{a},{b}", "--key", "env_bug") == 0
    assert "label 'env_bug' set to 'true' on 2 trajectories of run 'lab'" in capsys.readouterr().out
    assert label(lake, "--trajectory", a, "--key", "env_bug", "--value", "flaky sandbox") == 0
    assert in_force(lake) == [
        (a, None, "env_bug", "flaky sandbox", "ann"),
        (b, None, "env_bug", "true", "ann"),
    ]
    assert label(lake, "--trajectory", b, "--key", "env_bug", "--clear") == 0
    assert in_force(lake) == [(a, None, "env_bug", "flaky sandbox", "ann")]
    assert lake.sql("select count(*) from labels").column(0)[0].as_py() == 4  # append-only: nothing lost


def test_sql_selects_what_to_label_and_a_turn_can_be_labelled(lake) -> None:
    first = ids(lake)[0]
    query = f"select trajectory_id from trajectories where trajectory_id = '{first}'"
    assert label(lake, "--sql", query, "--key", "reward_hack", "--turn", "0") == 0
    assert in_force(lake) == [(first, 0, "reward_hack", "true", "ann")]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--trajectory", "T", "--key", "env bug"], "label key 'env bug' is not a word"),
        (["--key", "env_bug"], "name the trajectories with --trajectory ID,... or select them with --sql"),
        (
            ["--trajectory", "nope", "--key", "env_bug"],
            "1 of 1 trajectories are not in run 'lab' (e.g. nope); check --run",
        ),
        (
            ["--sql", "select 1 as x", "--key", "env_bug"],
            "--sql returns no trajectory_id column (it returns x)",
        ),
        (["--trajectory", "FIRST", "--key", "env_bug", "--turn", "99"], "turn 99 is not one of them"),
    ],
    ids=["bad key", "nothing selected", "unknown trajectory", "sql without ids", "no such turn"],
)
def test_a_bad_label_is_refused_with_the_fix_and_writes_nothing(lake, capsys, options, says) -> None:
    options = [ids(lake)[0] if o == "FIRST" else o for o in options]
    assert label(lake, *options) == 2
    assert says in capsys.readouterr().err
    assert not lake.exists("labels")


def test_doctor_counts_the_labels_in_force(lake, capsys) -> None:
    a, b, c = ids(lake)[:3]
    label(lake, "--trajectory", f"{a},{b}", "--key", "env_bug")
    label(lake, "--trajectory", c, "--key", "reward_hack", "--turn", "0")
    capsys.readouterr()
    main(["doctor", "--lake", lake.root, "--run", RUN, "--format", "json"])
    counts = json.loads(capsys.readouterr().out)["labels"]
    assert counts == [{"key": "env_bug", "trajectories": 2, "turns": 0},
                      {"key": "reward_hack", "trajectories": 1, "turns": 1}]  # fmt: skip
    main(["doctor", "--lake", lake.root, "--run", RUN])
    assert (
        "labels           env_bug 2 trajectories, reward_hack 1 trajectories (1 turns)"
        in capsys.readouterr().out
    )


def test_export_keeps_or_leaves_out_labelled_trajectories(lake, tmp_path) -> None:
    a, b = ids(lake)[:2]
    label(lake, "--trajectory", a, "--key", "env_bug")
    label(lake, "--trajectory", b, "--key", "review", "--value", "ok")
    query = "select run_id, trajectory_id from trajectories"

    def exported(name: str, *options: str) -> set[str]:
        out = tmp_path / name
        assert main(["export", "--lake", lake.root, "--sql", query, "--out", str(out), *options]) == 0
        return set(pq.read_table(out).column("trajectory_id").to_pylist())

    assert exported("without", "--without-labels", "env_bug") == set(ids(lake)) - {a}
    assert exported("with", "--with-labels", "review=ok") == {b}
    assert exported("with-other-value", "--with-labels", "review=bad,env_bug") == {a}


def test_export_names_the_fix_for_a_bad_label_spec(lake, tmp_path, capsys) -> None:
    code = main(["export", "--lake", lake.root, "--sql", "select trajectory_id from trajectories",
                 "--out", str(tmp_path / "x"), "--without-labels", "=ok"])  # fmt: skip
    assert code == 2
    assert "label key '' is not a word" in capsys.readouterr().err
