"""A lake written before a field existed stays readable, and takes the field's column on its next write."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store import lake as lake_module
from trajlake.store.compact import compact
from trajlake.store.lake import Lake
from trajlake.store.projections import rebuild


def _without(schema: pa.Schema, name: str) -> pa.Schema:
    return schema.remove(schema.get_field_index(name))


def record(root: Path, trajectory_id: str, **turn_fields: object) -> None:
    bus = InProcessBus()
    with Recorder(bus, "run").start("task", trajectory_id=trajectory_id) as t:
        t.turn([4], [-0.1], 0, input_token_ids=[1], **turn_fields)
        t.finish("completed")
    lake = Lake(root)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()


@pytest.fixture
def old_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lake whose `events` and `turns` were written before `advantage` was declared."""
    root = tmp_path / "lake"
    with monkeypatch.context() as m:
        for name in ("events", "turns"):
            m.setitem(lake_module.SCHEMAS, name, _without(lake_module.SCHEMAS[name], "advantage"))
        record(root, "t-old")
    assert "advantage" not in Lake(root).stored_columns("turns")
    return root


def test_an_old_lake_reads_the_new_column_as_null(old_lake: Path) -> None:
    lake = Lake(old_lake)
    assert lake.sql("select trajectory_id, advantage from turns").to_pylist() == [
        {"trajectory_id": "t-old", "advantage": None}
    ]
    assert lake.sql("select count(advantage) as n from events").column("n")[0].as_py() == 0


def test_an_old_lake_takes_the_new_column_on_its_next_write(old_lake: Path) -> None:
    record(old_lake, "t-new", advantage=0.5)
    expected = [{"trajectory_id": "t-new", "advantage": 0.5}, {"trajectory_id": "t-old", "advantage": None}]
    lake = Lake(old_lake)
    assert "advantage" in lake.stored_columns("turns") and "advantage" in lake.stored_columns("events")
    query = "select trajectory_id, advantage from turns order by trajectory_id"
    assert lake.sql(query).to_pylist() == expected
    rebuild(lake)  # reads the old events files, which lack the column
    assert Lake(old_lake).sql(query).to_pylist() == expected
    compact(lake, retention_hours=0, allow_short_retention=True)  # merges old and new files
    assert Lake(old_lake).sql(query).to_pylist() == expected
