"""Values reach DuckDB as parameters: a run id with quotes and `:name`/`$name` text round-trips."""

from __future__ import annotations

import pytest

from trajlake.dashboards import metrics
from trajlake.dashboards.browse import find_trajectories, trajectory_summary, trajectory_turns
from trajlake.ingest.recorder import Recorder
from trajlake.rollout.importers.base import ImportSession
from trajlake.trainer.config import SamplerConfig
from trajlake.trainer.reference import run_vocab_size
from trajlake.trainer.sampler import Sampler
from trajlake.trainer.tokens import read_from_events, read_from_view

TRICKY = "o'brien :run $run ' or 1=1 --"
OTHER = "plain"


@pytest.fixture
def tricky_lake(lake, bus, drain):
    for run_id, vocab in ((TRICKY, 128), (OTHER, 64)):
        recorder = Recorder(bus, run_id, vocab_size=vocab)
        with recorder.start("task ':task'", "g0", 0, trajectory_id=f"{run_id}/t'1") as t:
            t.turn([10, 11], [-0.1, -0.2], 0, full_input_token_ids=[1, 2, 3])
            t.reward(1.0, verifier="exact")
            t.finish("completed")
    drain()
    return lake


def test_lake_read_and_sql_take_parameters(tricky_lake):
    rows = tricky_lake.read("trajectories", ["run_id"], where="run_id = $run", params={"run": TRICKY})
    assert rows.column("run_id").to_pylist() == [TRICKY]
    positional = tricky_lake.sql("select count(*) from trajectories where run_id = ?", [TRICKY])
    assert positional.column(0)[0].as_py() == 1


def test_the_trainer_reads_exactly_the_tricky_run(tricky_lake):
    tid = f"{TRICKY}/t'1"
    for read in (read_from_events, read_from_view):
        tokens = read(tricky_lake, TRICKY, [tid])
        assert list(tokens) == [tid]
        assert tokens[tid][0].tolist() == [1, 2, 3, 10, 11]
    assert run_vocab_size(tricky_lake, TRICKY) == 128
    _, stats = Sampler(tricky_lake, None, SamplerConfig(run_id=TRICKY, group_size=1)).select_groups(0)
    assert stats.finished == 1  # the tricky run's one trajectory, not the other run's


def test_the_dashboards_find_the_tricky_run_and_only_it(tricky_lake):
    tid = f"{TRICKY}/t'1"
    found = find_trajectories(tricky_lake, TRICKY, status=["completed"], task_contains="':task'")
    assert found.column("trajectory_id").to_pylist() == [tid]
    assert trajectory_summary(tricky_lake, TRICKY, tid)["task_id"] == "task ':task'"
    assert trajectory_turns(tricky_lake, TRICKY, tid).num_rows == 1
    assert metrics.policy_versions(tricky_lake, TRICKY) == [0]
    assert TRICKY in metrics.runs(tricky_lake)


def test_an_import_sees_what_the_tricky_run_already_holds(tricky_lake):
    assert ImportSession(tricky_lake, TRICKY, "test").already_imported(f"{TRICKY}/t'1")
    assert not ImportSession(tricky_lake, OTHER, "test").already_imported(f"{TRICKY}/t'1")
