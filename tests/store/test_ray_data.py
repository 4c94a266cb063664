"""A Ray Dataset over the lake's Delta tables, read in place by a local Ray runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fixtures.spark import fill_every_table, lake_digests, token_digest
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.errors import LakeError
from trajlake.store.lake import TABLES, Lake
from trajlake.store.ray_data import read_ray_dataset, snapshot_paths

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def fill(lake: Lake, batches: int) -> int:
    total = 0
    for i in range(batches):  # several commits: several files
        bus = InProcessBus(topic=f"ray-{i}")
        total += generate(
            bus, LoadgenConfig(trajectories=20, run_id=f"r{i}", seed=i, prompt_tokens=16)
        ).events
        DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0)
    return total


def test_a_ray_dataset_reads_the_committed_files_in_place(lake: Lake, ray_runtime: None) -> None:
    produced = fill(lake, 3)
    paths, _ = snapshot_paths(lake, "events")
    assert len(paths) >= 3 and all(p.startswith(lake.root) for p in paths)  # the lake's own files
    ds = read_ray_dataset(lake, "events", columns=["event_id", "event_type", "output_token_ids"])
    assert ds.count() == produced
    turns = ds.filter(expr="event_type == 'turn'")
    tokens = turns.map(lambda row: {"n": len(row["output_token_ids"])}).sum("n")
    assert tokens == lake.sql("select sum(len(output_token_ids)) as n from events").to_pylist()[0]["n"]
    trajectories = read_ray_dataset(lake, "trajectories").count()
    assert trajectories == 60


def test_an_empty_table_says_what_to_do(lake: Lake) -> None:
    with pytest.raises(LakeError, match="ingest events first"):
        read_ray_dataset(lake, "events")


def test_a_ray_dataset_reads_an_s3_lake_in_place(s3_lake_root: str, ray_runtime: None) -> None:
    lake = Lake(s3_lake_root)
    try:
        produced = fill(lake, 2)
        paths, fs = snapshot_paths(lake, "events")
        assert len(paths) >= 2 and all(p.startswith(s3_lake_root.removeprefix("s3://")) for p in paths)
        assert fs.type_name == "s3"
        assert read_ray_dataset(lake, "events", columns=["event_id"]).count() == produced
    finally:
        lake.close()


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A lake holding every table."""
    root = str(tmp_path_factory.mktemp("readers") / "lake")
    fill_every_table(root)
    return root


def test_ray_data_read_delta_reads_every_table(written: str, ray_runtime: None) -> None:
    import pyarrow as pa
    import ray.data

    from trajlake.store.tables import SCHEMAS

    read = {}
    for name in TABLES:
        blocks = ray.data.read_delta(f"{written}/{name}").to_arrow_refs()
        # a table without rows (this lake's batch_consumption) reads as no blocks at all
        read[name] = token_digest(
            pa.concat_tables(ray.get(blocks)) if blocks else SCHEMAS[name].empty_table()
        )
    assert read == lake_digests(written)


def test_ray_assembles_each_trajectorys_tokens_as_the_sql_view_does(written: str, ray_runtime: None) -> None:
    import pyarrow as pa
    import ray

    from trajlake.store.ray_data import read_trajectory_tokens

    lake = Lake(written, create=False)
    ray_rows = pa.concat_tables(ray.get(read_trajectory_tokens(lake).to_arrow_refs()))
    view = lake.sql("select run_id, trajectory_id, token_ids, logprobs, loss_mask from trajectories")
    key = [("run_id", "ascending"), ("trajectory_id", "ascending")]
    assert ray_rows.sort_by(key).to_pylist() == view.sort_by(key).to_pylist()
