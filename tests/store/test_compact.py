"""`trajlake compact`: fewer files, the same rows, no lost bytes-per-token, and a retention guard."""

from __future__ import annotations

import pytest

from tests.helpers import trajlake
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration  # runs the trajlake CLI in processes


def test_compact_merges_files_and_keeps_every_row(tmp_path) -> None:
    root = str(tmp_path / "lake")
    for seed in range(3):
        trajlake(
            "loadgen", "--lake", root, "--trajectories", "30", "--seed", str(seed), "--run-id", f"r{seed}"
        )
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


def test_a_short_retention_is_refused_without_the_override(tmp_path) -> None:
    root = str(tmp_path / "lake")
    trajlake("loadgen", "--lake", root, "--trajectories", "5")
    out = trajlake("compact", "--lake", root, "--retention-hours", "1", check=False)
    assert out.returncode == 2
    assert "below the 168h guard" in out.stderr and "--allow-short-retention" in out.stderr
