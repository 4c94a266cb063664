"""Projections are a pure function of `events`: incremental updates and `trajlake rebuild` agree."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from tests.helpers import age_log, trajlake
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.schemas.tables import PROJECTION_TABLES
from trajlake.store import projections
from trajlake.store.config import LakeConfig
from trajlake.store.lake import Lake
from trajlake.store.projector import Projector

SORT = {
    "trajectories": ["run_id", "trajectory_id"],
    "turns": ["run_id", "trajectory_id", "seq"],
    "tool_calls": ["run_id", "trajectory_id", "call_id"],
    "policy_versions": ["run_id", "policy_version"],
    "batch_consumption": ["run_id", "step", "trajectory_id"],
    "rewards": ["run_id", "trajectory_id", "seq"],
}


def snapshot(lake: Lake) -> dict[str, pa.Table]:
    return {
        name: lake.read(name).sort_by([(k, "ascending") for k in SORT[name]]) for name in PROJECTION_TABLES
    }


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_rebuild_after_deleting_projections_gives_identical_rows(tmp_path) -> None:
    root = tmp_path / "lake"
    trajlake("loadgen", "--lake", str(root), "--trajectories", "500", "--json")
    lake = Lake(root)
    before = snapshot(lake)
    assert before["trajectories"].num_rows == 500
    assert before["turns"].num_rows > 500 and before["tool_calls"].num_rows > 0
    for name in PROJECTION_TABLES:
        shutil.rmtree(root / name)
    lake.close()
    out = trajlake("rebuild", "--lake", str(root))
    assert "trajectories: 500 rows" in out.stdout
    after = snapshot(Lake(root))
    for name in PROJECTION_TABLES:
        assert after[name].equals(before[name]), name


def test_trajectories_spread_over_many_commits_project_like_a_rebuild(lake) -> None:
    """Turns arrive one flush at a time, so projections merge; the result equals a rebuild (a turn
    of unknown policy version included: null, never 0, in `turns` and in the trajectory's range)."""
    bus = InProcessBus()
    sink = DeltaSink(lake, bus, SinkConfig(max_rows=1))
    recorder = Recorder(bus, "r", vocab_size=100)
    trajs = [recorder.start(f"task{i}", "g", i) for i in range(3)]
    for step in range(3):
        for i, t in enumerate(trajs):
            t.turn([i, step], [-0.1, -0.2], None if (i, step) == (1, 1) else step, input_token_ids=[7])
            sink.run(until_idle_s=0)
    recorder.policy_updated(1, step=1)
    recorder.batch_consumed(1, 1, [t.trajectory_id for t in trajs], [0, 1, 1])
    for t in trajs:
        t.reward(1.0)
        t.finish("completed")
    sink.run(until_idle_s=0)
    incremental = snapshot(lake)
    assert incremental["trajectories"].column("n_turns").to_pylist() == [3, 3, 3]
    assert incremental["batch_consumption"].num_rows == 3
    versions = {
        r["trajectory_id"]: (r["policy_version_min"], r["policy_version_max"])
        for r in incremental["trajectories"].to_pylist()
    }
    assert [versions[t.trajectory_id] for t in trajs] == [(0, 2), (None, None), (0, 2)]
    unknown = [r for r in incremental["turns"].to_pylist() if r["policy_version"] is None]
    assert [r["trajectory_id"] for r in unknown] == [trajs[1].trajectory_id]
    projections.rebuild(lake)
    rebuilt = snapshot(lake)
    for name in PROJECTION_TABLES:
        assert rebuilt[name].equals(incremental[name]), name


def test_a_rebuild_in_many_buckets_gives_the_rows_of_one(lake, monkeypatch) -> None:
    """A big lake is rebuilt a bucket of trajectories at a time (bounded memory); same rows."""
    bus = InProcessBus()
    generate(bus, LoadgenConfig(trajectories=60, seed=4))
    Recorder(bus, "loadgen", vocab_size=100).policy_updated(1, step=1)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0)
    incremental = snapshot(lake)
    n_events = lake.sql("select count(*) from _t_events").column(0)[0].as_py()
    monkeypatch.setattr(projections, "REBUILD_BUCKET_EVENTS", n_events // 8)
    counts = projections.rebuild(lake)
    assert counts["trajectories"] == 60
    assert len(lake.files("trajectories")) >= 8  # one bucket's rows at a time, each written on its own
    rebuilt = snapshot(lake)
    for name in PROJECTION_TABLES:
        assert rebuilt[name].equals(incremental[name]), name


def test_a_crash_between_events_and_projections_is_repaired_on_restart(lake) -> None:
    bus = InProcessBus()
    generate(bus, LoadgenConfig(trajectories=20, seed=3))
    crashed = DeltaSink(
        lake, bus, SinkConfig(update_projections=False)
    )  # commits events, dies before projecting
    crashed.run(until_idle_s=0)
    assert lake.read("trajectories").num_rows == 0
    Projector(lake).run()  # a restarted projector catches up from the position in the Delta log
    assert lake.read("trajectories").num_rows == 20
    assert lake.txn_version("trajectories", projections.APP_ID) == lake.version("events")


def test_a_projector_behind_a_log_clean_up_rebuilds_to_the_rows_of_one(lake, tmp_path) -> None:
    """Catch-up reads the `events` commits after its position; once a clean-up removed them (the
    log keeps `LakeConfig.log_retention_hours`), it recomputes its tables from the files."""
    first = InProcessBus()
    generate(first, LoadgenConfig(trajectories=24, seed=5))
    DeltaSink(lake, first, SinkConfig()).run(until_idle_s=0)
    position = lake.txn_version("trajectories", projections.APP_ID)
    for i in range(3):  # three commits of events that no projection has seen
        later = InProcessBus()
        generate(later, LoadgenConfig(trajectories=8, seed=6 + i, first_group=100 * (i + 1)))
        DeltaSink(lake, later, SinkConfig(update_projections=False)).run(until_idle_s=0)
    age_log(tmp_path / "lake" / "events" / "_delta_log", LakeConfig().log_retention_hours + 1)
    lake.delta("events").create_checkpoint()
    lake.delta("events").cleanup_metadata()
    assert projections.added_files(lake, position, lake.version("events")) is None  # the log is gone
    projections.catch_up(lake)
    caught_up = snapshot(lake)
    assert caught_up["trajectories"].num_rows == 48
    projections.rebuild(lake)
    rebuilt = snapshot(lake)
    for name in PROJECTION_TABLES:
        assert caught_up[name].equals(rebuilt[name]), name
