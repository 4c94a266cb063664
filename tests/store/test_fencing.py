"""A projection merge built on a stale position never lands, even when it loses the race after its check."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trajlake.store.errors import TxnFenced
from trajlake.store.lake import Lake
from trajlake.store.projections import APP_ID, KEYS

TRAJ_KEYS = KEYS["trajectories"]


def row(task: str) -> pa.Table:
    return pa.table({"run_id": ["r"], "trajectory_id": ["t"], "task_id": [task]})


def test_a_merge_that_loses_the_race_after_its_check_is_fenced(tmp_path, monkeypatch) -> None:
    mine, theirs = Lake(tmp_path / "lake"), Lake(tmp_path / "lake")  # two sink processes
    mine.upsert("trajectories", row("v1"), TRAJ_KEYS, {APP_ID: 1}, expect_txns={APP_ID: None})
    check = theirs.commits.check_txns

    def check_then_lose_the_race(name, expect):
        table = check(name, expect)  # passes: the projection is still at 1
        monkeypatch.setattr(theirs.commits, "check_txns", check)
        mine.upsert("trajectories", row("v2"), TRAJ_KEYS, {APP_ID: 2}, expect_txns={APP_ID: 1})
        return table

    monkeypatch.setattr(theirs.commits, "check_txns", check_then_lose_the_race)
    with pytest.raises(TxnFenced, match="expected 1, found 2"):
        theirs.upsert("trajectories", row("stale"), TRAJ_KEYS, {APP_ID: 2}, expect_txns={APP_ID: 1})
    assert mine.read("trajectories", ["task_id"]).column("task_id").to_pylist() == ["v2"]
    assert mine.txn_version("trajectories", APP_ID) == 2
    mine.close()
    theirs.close()


def test_an_unfenced_merge_still_replaces_by_key(lake) -> None:
    lake.upsert("trajectories", row("v1"), TRAJ_KEYS)
    lake.upsert("trajectories", row("v2"), TRAJ_KEYS)
    assert lake.read("trajectories", ["task_id"]).column("task_id").to_pylist() == ["v2"]
