"""What other Delta engines rely on: every table at the minimal protocol with no table features,
the properties the docs name, statistics of the columns readers prune on, and checkpoints at the
table's interval on S3 as on a local disk."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake
from trajlake.store.tables import CHECKPOINT_INTERVAL, STATS_COLUMNS, TABLES


@pytest.fixture(scope="module")
def lake_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("hygiene") / "lake"
    bus, lake = InProcessBus(), Lake(root)
    generate(bus, LoadgenConfig(trajectories=30, seed=1, run_id="hygiene"))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()
    return str(root)


def test_every_table_is_at_the_minimal_protocol_with_its_documented_properties(lake_dir: str) -> None:
    lake = Lake(lake_dir)
    written = [name for name in TABLES if lake.exists(name)]
    assert {"events", "trajectories", "turns", "tool_calls"} <= set(written)
    for name in written:
        table = DeltaTable(lake.uri(name))
        protocol = table.protocol()
        assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2), name
        assert not protocol.reader_features and not protocol.writer_features, name
        properties = table.metadata().configuration
        assert properties["delta.checkpointInterval"] == str(CHECKPOINT_INTERVAL), name
        assert properties["delta.logRetentionDuration"].startswith("interval "), name
        stats = properties["delta.dataSkippingStatsColumns"].split(",")
        assert stats == [c for c in STATS_COLUMNS if c in stats], name


def test_each_events_file_carries_min_max_of_the_columns_readers_prune_on(lake_dir: str) -> None:
    adds = pa.table(DeltaTable(Lake(lake_dir).uri("events")).get_add_actions(flatten=True))
    for column in ("run_id", "trajectory_id", "seq", "event_time"):
        for bound in ("min", "max"):
            values = adds.column(f"{bound}.{column}")
            assert values.null_count == 0, f"{bound}.{column}"


@pytest.mark.integration
def test_a_lake_on_s3_is_checkpointed_at_the_tables_interval(s3_lake_root: str) -> None:
    lake = Lake(s3_lake_root)
    commits = 2 * CHECKPOINT_INTERVAL + 3
    for i in range(commits):
        lake.append(
            "trainer_steps", pa.table({"run_id": ["r"], "step": [i], "trainer_version": [i], "rank": [0]})
        )
    fs, root = lake.filesystem()
    names = [
        info.base_name for info in fs.get_file_info(pafs.FileSelector(f"{root}/trainer_steps/_delta_log"))
    ]
    checkpoints = sorted(int(n.split(".")[0]) for n in names if n.endswith(".checkpoint.parquet"))
    assert len(checkpoints) == 2 and "_last_checkpoint" in names
    assert lake.version("trainer_steps") - checkpoints[-1] <= CHECKPOINT_INTERVAL
    assert Lake(s3_lake_root).read("trainer_steps").num_rows == commits
