"""The token layout: a lake writes token lists every Parquet reader reads by default
(`token_layout="portable"`), BYTE_STREAM_SPLIT only when asked (`"compact"`), and compaction
rewrites a compact lake's files once it is portable, its rows unchanged."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.helpers import quick_bench
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.compact import compact
from trajlake.store.config import LakeConfig
from trajlake.store.lake import TABLES, Lake


def encodings(lake: Lake, name: str) -> set[str]:
    """Every encoding of every column chunk of the table's current files."""
    found: set[str] = set()
    for uri in lake.files(name):
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                found |= set(meta.row_group(g).column(c).encodings)
    return found


def fill(lake: Lake, seed: int) -> None:
    bus = InProcessBus(topic=f"layout-{seed}")
    generate(bus, LoadgenConfig(trajectories=12, seed=seed, run_id="layout", first_group=seed * 100))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)


def answers(lake: Lake) -> list[dict]:
    return lake.sql(
        "select trajectory_id, token_ids, logprobs, loss_mask from trajectories order by trajectory_id"
    ).to_pylist()


def test_the_default_layout_has_no_byte_stream_split_and_compact_is_opt_in(tmp_path: Path) -> None:
    portable = Lake(tmp_path / "portable")
    fill(portable, 1)
    assert LakeConfig().token_layout == "portable"
    for name in TABLES:
        if portable.exists(name):
            assert "BYTE_STREAM_SPLIT" not in encodings(portable, name), name
    compact_lake = Lake(tmp_path / "compact", LakeConfig(token_layout="compact"))
    fill(compact_lake, 1)
    assert "BYTE_STREAM_SPLIT" in encodings(compact_lake, "events")
    tokens = "select token_ids, logprobs, loss_mask from trajectories order by token_ids"
    assert compact_lake.sql(tokens).to_pylist() == portable.sql(tokens).to_pylist()  # the same either way


def test_compaction_rewrites_a_compact_lake_in_the_portable_layout(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    old = Lake(root, LakeConfig(token_layout="compact"))
    fill(old, 1)
    fill(old, 2)
    before = answers(old)
    old.close()
    kept = Lake(root, LakeConfig(token_layout="compact"))
    compact(kept, vacuum=False)  # a compact lake keeps its layout
    assert "BYTE_STREAM_SPLIT" in encodings(kept, "events")
    lake = Lake(root)
    report = compact(lake, vacuum=False)
    assert report.files_added["events"] > 0
    assert "BYTE_STREAM_SPLIT" not in encodings(lake, "events")
    assert answers(Lake(root)) == before


@pytest.mark.integration
@pytest.mark.slow
def test_quick_bench_measures_each_layout_side_by_side_and_holds_its_baseline(tmp_path: Path) -> None:
    printed, figures = quick_bench("token_layout", tmp_path, "--check")
    layouts = figures["layouts"]
    assert set(layouts) == {"portable", "compact", "split_floats", "delta_ids", "portable_zstd9"}
    assert figures["portable_bytes_ratio"] == pytest.approx(
        layouts["portable"]["bytes_per_token"] / layouts["compact"]["bytes_per_token"]
    )
    assert "check portable_bytes_ratio:" in printed and "REGRESSED" not in printed
