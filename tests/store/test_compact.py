"""`trajlake compact`: fewer files, the same rows, no lost bytes-per-token, a checkpoint, and a retention guard."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from deltalake.transaction import RemoveAction

from tests.helpers import started_event, trajlake, turn_event
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store import projections
from trajlake.store.compact import optimize
from trajlake.store.config import LakeConfig, ProjectorConfig
from trajlake.store.errors import CommitConflict
from trajlake.store.lake import Lake


@pytest.mark.integration  # runs the trajlake CLI in processes
def test_compact_merges_files_and_keeps_every_row(tmp_path) -> None:
    root = str(tmp_path / "lake")
    for seed in range(3):
        trajlake("loadgen", "--lake", root, "--trajectories", "30", "--seed", str(seed), "--run", f"r{seed}")
    lake = Lake(root)
    before = {
        t: lake.sql(f"select count(*) from {t}").column(0)[0].as_py()
        for t in ("events", "trajectories", "turns")
    }
    tokens = lake.sql("select sum(len(token_ids)) from trajectories").column(0)[0].as_py()
    files_before = len(lake.files("events"))
    size_before = sum(
        (tmp_path / "lake" / "events" / f.rsplit("/", 1)[1]).stat().st_size for f in lake.files("events")
    )
    lake.close()
    out = trajlake("compact", "--lake", root, "--retention-hours", "0", "--allow-short-retention")
    assert f"events: {files_before} files merged into 1" in out.stdout
    lake = Lake(root)
    assert len(lake.files("events")) == 1 < files_before
    after = {t: lake.sql(f"select count(*) from {t}").column(0)[0].as_py() for t in before}
    assert after == before
    assert lake.sql("select sum(len(token_ids)) from trajectories").column(0)[0].as_py() == tokens
    size_after = (tmp_path / "lake" / "events" / lake.files("events")[0].rsplit("/", 1)[1]).stat().st_size
    assert size_after <= size_before * 1.05  # compaction keeps the compact layout of token payloads
    for table in before:  # readers open the compacted table from a checkpoint, replaying no commit
        log = tmp_path / "lake" / table / "_delta_log"
        assert json.loads((log / "_last_checkpoint").read_text())["version"] == lake.version(table)


@pytest.mark.integration  # runs the trajlake CLI in processes
def test_a_short_retention_is_refused_without_the_override(tmp_path) -> None:
    root = str(tmp_path / "lake")
    trajlake("loadgen", "--lake", root, "--trajectories", "5")
    out = trajlake("compact", "--lake", root, "--retention-hours", "1", check=False)
    assert out.returncode == 2
    assert "below the 168h guard" in out.stderr and "--allow-short-retention" in out.stderr


@pytest.mark.parametrize("rows_per_batch", [7, 1000])
def test_a_streamed_file_holds_every_row_in_row_groups_with_the_stats_of_one_write(
    tmp_path, rows_per_batch: int
) -> None:
    """`write_batches` (how compaction merges) writes what `write_file` would, a row group at a time."""
    lake = Lake(tmp_path / "lake", LakeConfig(row_group_rows=1024))
    bus = InProcessBus()
    generate(bus, LoadgenConfig(trajectories=160, seed=2))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0)
    events = lake.read("events")
    assert events.num_rows > 2048
    streamed = lake.write_batches("events", events.to_batches(max_chunksize=rows_per_batch))
    whole = lake.write_file("events", events)
    assert json.loads(streamed.stats) == json.loads(whole.stats)
    stored = pq.ParquetFile(tmp_path / "lake" / "events" / streamed.path)
    assert stored.metadata.num_row_groups == -(-events.num_rows // 1024)
    assert stored.read().equals(pq.read_table(tmp_path / "lake" / "events" / whole.path))


def test_two_compactions_of_the_same_files_conflict_instead_of_duplicating_rows(tmp_path) -> None:
    """A second compactor that merged the same files on an older snapshot must not commit them again."""
    root = tmp_path / "lake"
    first = Lake(root)
    bus = InProcessBus()
    for seed in range(3):
        generate(bus, LoadgenConfig(trajectories=10, seed=seed, run_id=f"r{seed}"))
        DeltaSink(first, bus, SinkConfig()).run(until_idle_s=0)
    rows = first.read("events").num_rows
    originals = [uri.rsplit("/", 1)[1] for uri in first.files("events")]
    assert len(originals) == 3
    second = Lake(root)
    write_batches = second.write_batches

    def race(name, batches):  # while the second merges its bin, the first compacts the same files
        written = write_batches(name, batches)
        assert optimize(first, name) == (3, 1, 0)
        return written

    second.write_batches = race  # type: ignore[method-assign]
    assert optimize(second, "events") == (0, 0, 3)
    with pytest.raises(CommitConflict, match="replaced by another writer first"):
        second.replace_files("events", [], [RemoveAction(originals[0], False, 0)])
    reader = Lake(root)
    assert len(reader.files("events")) == 1
    assert len(list((root / "events").glob("*.parquet"))) == 3 + 1  # the loser's merged file is gone
    assert reader.read("events").num_rows == rows
    assert reader.sql("select count(*) from trajectories").column(0)[0].as_py() == 30


def test_the_projector_merges_projection_files_as_they_pile_up_and_keeps_every_row(tmp_path) -> None:
    """Many small commits leave a few projection files per order of magnitude, not one per commit."""
    lake = Lake(tmp_path / "lake")
    bus = InProcessBus()
    sink = DeltaSink(lake, bus, projector=ProjectorConfig(merge_fanin=2))
    for i in range(16):  # a commit each, which goes on with the trajectory the one before began
        tid = f"t{i:02d}"
        events = [started_event(trajectory_id=tid), turn_event(trajectory_id=tid, seq=1)]
        if i:
            events.append(turn_event(trajectory_id=f"t{i - 1:02d}", seq=2, turn_index=1))
        bus.publish(events)
        sink.run(until_idle_s=0)
    assert sink.stats.commits == 16
    keys = {"trajectories": "trajectory_id", "turns": "trajectory_id, seq"}
    merged = {}
    for table, order in keys.items():
        assert len(lake.files(table)) <= 6
        merged[table] = lake.sql(f"select * from {table} order by {order}").to_pylist()
    assert [row["n_turns"] for row in merged["trajectories"]] == [2] * 15 + [1]
    projections.rebuild(lake)  # the projections, recomputed from the events
    for table, order in keys.items():
        assert lake.sql(f"select * from {table} order by {order}").to_pylist() == merged[table]
