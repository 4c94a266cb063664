"""The projector: the one writer of the projections, fenced in the Delta log, resumed by a successor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import wait_until
from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.schemas.tables import PROJECTION_TABLES
from trajlake.store import projections
from trajlake.store.config import ProjectorConfig
from trajlake.store.lake import Lake
from trajlake.store.projector import EPOCH_APP_ID, RELEASED_APP_ID, Projector


def ingest_only(lake: Lake, trajectories: int, seed: int) -> None:
    """What a scale-out sink does: events and offsets, no projection."""
    bus = InProcessBus()
    generate(bus, LoadgenConfig(trajectories=trajectories, seed=seed, first_group=1000 * seed))
    DeltaSink(lake, bus, SinkConfig(update_projections=False)).run(until_idle_s=0)


def rows(lake: Lake) -> dict[str, list[dict]]:
    keys = {
        "trajectories": "trajectory_id",
        "turns": "trajectory_id, seq",
        "tool_calls": "trajectory_id, call_id",
    }
    return {
        name: lake.sql(f"select * from {name} order by {order}").to_pylist() for name, order in keys.items()
    }


def test_sinks_that_only_ingest_leave_the_projections_to_trajlake_project(tmp_path: Path, capsys) -> None:
    lake = Lake(tmp_path / "lake")
    ingest_only(lake, 12, seed=1)
    ingest_only(lake, 8, seed=2)
    assert lake.read("trajectories").num_rows == 0  # the sinks wrote events, nothing else
    assert main(["project", "--lake", str(tmp_path / "lake")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["position"] == report["events_version"] == lake.version("events")
    projected = rows(lake)
    assert len(projected["trajectories"]) == 20
    projections.rebuild(lake)  # a pure function of events: the same rows from scratch
    assert rows(lake) == projected


def test_a_projector_taken_over_is_fenced_off_and_commits_nothing(tmp_path: Path) -> None:
    lake = Lake(tmp_path / "lake")
    ingest_only(lake, 6, seed=1)
    first, second = Projector(lake), Projector(lake)
    first.take_over()
    assert first.step()
    ingest_only(lake, 6, seed=2)
    second.take_over()  # e.g. a new `trajlake project` while the old one still runs
    versions = {name: lake.version(name) for name in PROJECTION_TABLES}
    assert not first.step()  # its first commit meets the new epoch
    assert first.epoch is None and first.stats.fenced == 1
    assert {name: lake.version(name) for name in PROJECTION_TABLES} == versions  # nothing landed
    assert second.step() and second.position() == lake.version("events")
    assert {lake.txn_version(name, EPOCH_APP_ID) for name in PROJECTION_TABLES} == {second.epoch}


def test_an_embedded_projector_lets_go_at_its_stop_and_a_killed_ones_lake_is_taken_over(
    tmp_path: Path,
) -> None:
    lake = Lake(tmp_path / "lake")
    bus = InProcessBus()
    generate(bus, LoadgenConfig(trajectories=5, seed=1))
    DeltaSink(lake, bus).run(until_idle_s=0)  # the embedded default: its projector on a thread
    assert lake.read("trajectories").num_rows == 5  # visible when the run returns, as before
    epoch = lake.txn_version("trajectories", EPOCH_APP_ID)
    assert lake.txn_version("trajectories", RELEASED_APP_ID) == epoch  # let go at its clean stop

    killed = Projector(lake)
    killed.take_over()  # holds the lake, then dies without letting go
    ingest_only(lake, 3, seed=2)
    standby = Projector(lake, ProjectorConfig(takeover_after_s=1.0))
    assert not standby.step()  # a holder that committed just now may be alive: stand by
    wait_until(standby.may_take_over, 30, "the standby to see the holder gone quiet")
    assert standby.step() and standby.position() == lake.version("events")
    assert lake.read("trajectories").num_rows == 8


def test_a_standby_answers_when_the_holder_commits_just_after_it_looked(tmp_path: Path, monkeypatch) -> None:
    lake = Lake(tmp_path / "lake")
    ingest_only(lake, 4, seed=1)
    holder = Projector(lake)
    holder.take_over()
    assert holder.step()
    standby_lake = Lake(tmp_path / "lake")
    standby = Projector(standby_lake, ProjectorConfig(takeover_after_s=600))
    standby_lake.log.table("trajectories")  # the standby's look at the log, then the holder commits
    ingest_only(lake, 3, seed=2)
    assert holder.step()
    monkeypatch.setattr(standby_lake.log, "catch_up", lambda name, table: None)  # passed by then
    assert not standby.may_take_over()  # the holder is alive; asking does not fail


@pytest.mark.parametrize("fenced_table", ["turns", "trajectories"])
def test_catch_up_fenced_on_an_epoch_is_not_retried(tmp_path: Path, fenced_table: str) -> None:
    lake = Lake(tmp_path / "lake")
    ingest_only(lake, 4, seed=1)
    holder = Projector(lake)
    holder.take_over()
    lake.commit(fenced_table, [], {EPOCH_APP_ID: 99})  # another projector's epoch lands on one table
    assert not holder.step() and holder.stats.fenced == 1 and holder.stats.position_retries == 0
    assert lake.txn_version(fenced_table, projections.APP_ID) is None  # no projection landed on it


def test_a_following_projector_waits_out_a_store_that_does_not_answer(tmp_path: Path, monkeypatch) -> None:
    import threading

    from trajlake.store import storage

    lake = Lake(tmp_path / "lake")
    ingest_only(lake, 6, seed=1)
    projector = Projector(lake, ProjectorConfig(poll_interval_s=0.01))
    projector.take_over()
    assert projector.step()
    ingest_only(lake, 6, seed=2)
    refused, catch_up = [], projections.catch_up

    def restarting(*args, **kwargs):  # the S3 server restarting: two refused connections, then it answers
        if len(refused) < 2:
            refused.append(1)
            raise OSError("Generic S3 error: tcp connect error: Connection refused (os error 111)")
        return catch_up(*args, **kwargs)

    monkeypatch.setattr(projections, "catch_up", restarting)
    monkeypatch.setattr(storage, "STORE_OUTAGE_S", 30.0)
    stop = threading.Event()
    following = threading.Thread(target=projector.run, kwargs={"follow": True, "stop": stop})
    following.start()
    try:
        wait_until(lambda: lake.read("trajectories").num_rows == 12 or not following.is_alive(), 30,
                   "the projector to project after the outage")  # fmt: skip
    finally:
        stop.set()
        following.join(30)
    assert len(refused) == 2 and lake.read("trajectories").num_rows == 12
