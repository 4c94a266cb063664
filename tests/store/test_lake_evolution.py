"""A lake written before a field or column existed stays readable, and takes the column on its next write."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.schemas.events import EVENTS_SCHEMA
from trajlake.store import lake as lake_module
from trajlake.store.compact import compact
from trajlake.store.lake import Lake
from trajlake.store.projections import catch_up, rebuild
from trajlake.store.summaries import SUMMARY_COLUMNS


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


SUMMARIZED = (
    "select count(*) filter (where n_output_tokens is null) as unsummarized, count(*) as n from events"
)
PROJECTED = {
    "turns": "select * exclude (event_time) from turns order by trajectory_id, seq",
    "trajectories": "select * exclude (started_at, finished_at) from trajectories order by trajectory_id",
}


def projected(lake: Lake) -> dict[str, list[dict]]:
    return {name: lake.sql(query).to_pylist() for name, query in PROJECTED.items()}


def test_events_written_before_the_token_summary_project_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake whose first events files lack the token summary columns (written before they
    existed) projects, catches up, rebuilds and compacts to the rows of a lake that had them
    from the start; a trajectory that spans old and new files included."""
    bus = InProcessBus()
    recorder = Recorder(bus, "run")
    with recorder.start("task", trajectory_id="t-whole") as t:
        t.turn([4, 5, 4, 5, 4, 5, 4, 5], [-0.1] * 8, 0, input_token_ids=[1, 2])
        t.finish("completed")
    spanning = recorder.start("task", trajectory_id="t-spans")
    spanning.turn([7, 8, 9], [-0.5, -0.25, -1.0], 0, input_token_ids=[3], loss_mask=[True, False, True])
    first = bus.poll(max_messages=1000, timeout_s=0)
    spanning.turn([6, 6, 6, 6, 6, 6], [-0.2] * 6, 0, input_token_ids=[2, 2])
    spanning.finish("completed")
    second = bus.poll(max_messages=1000, timeout_s=0)

    def sink(root: Path, messages: list, update_projections: bool = True) -> Lake:
        replay = InProcessBus()
        for m in messages:
            replay.send(Message(key=m.key, value=m.value, headers=dict(m.headers)))
        lake = Lake(root)
        DeltaSink(lake, replay, SinkConfig(update_projections=update_projections)).run(until_idle_s=0.0)
        return lake

    expected = projected(sink(tmp_path / "new", first + second))
    assert expected["turns"][0]["n_loss_tokens"] == 2  # the masked turn, among them

    with monkeypatch.context() as m:  # the first events files, in the schema before the summary
        m.setitem(lake_module.SCHEMAS, "events", EVENTS_SCHEMA)
        old = sink(tmp_path / "old", first, update_projections=False)
    assert not set(SUMMARY_COLUMNS) & set(old.stored_columns("events"))
    catch_up(old)  # a lagging projector, on the old files alone
    old = sink(tmp_path / "old", second)  # continues `t-spans`, whose first events lack the summary
    assert old.sql(SUMMARIZED).to_pylist() == [{"unsummarized": 5, "n": 7}]
    assert projected(old) == expected
    rebuild(old)
    assert projected(Lake(tmp_path / "old")) == expected
    compact(old, retention_hours=0, allow_short_retention=True)  # merges old and new files
    merged = Lake(tmp_path / "old")
    assert merged.sql(SUMMARIZED).to_pylist() == [{"unsummarized": 0, "n": 7}]
    assert projected(merged) == expected
