"""A Ray Dataset over the lake's Delta tables, read in place by a local Ray runtime."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.errors import LakeError
from trajlake.store.lake import Lake
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
