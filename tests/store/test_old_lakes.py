"""A lake written by the previous release (3359190, BYTE_STREAM_SPLIT token lists throughout) opens,
answers queries, takes new events, rebuilds and compacts with this code, and Spark then reads it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.fixtures.spark import token_digest
from trajlake.cli import main
from trajlake.store.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OLD_RELEASE = "3359190"
"""The commit before the portable layout: its lakes' token lists are BYTE_STREAM_SPLIT."""
REPO = Path(__file__).resolve().parents[2]


def checkout(commit: str, into: Path) -> Path:
    """The tree of `commit` as the package `trajlake` under `into` (for PYTHONPATH)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True, check=False
    )
    assert archive.returncode == 0, (
        f"git archive {commit} failed: the old-lake test needs the repository's history "
        f"(a full clone): {archive.stderr.decode()[-500:]}"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into / "trajlake", filter="data")
    return into


@pytest.fixture(scope="module")
def old_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A loadgen run written by the old release's own code, in a process of its own."""
    base = tmp_path_factory.mktemp("old-release")
    code = checkout(OLD_RELEASE, base / "src")
    root = base / "lake"
    env = {**os.environ, "PYTHONPATH": str(code)}
    args = [
        "loadgen",
        "--lake",
        str(root),
        "--trajectories",
        "24",
        "--run-id",
        "old",
        "--prompt-tokens",
        "64",
    ]
    done = subprocess.run(
        [sys.executable, "-c", f"import sys, trajlake.cli as c; assert c.__file__.startswith({str(code)!r}); "
         f"sys.exit(c.main({args!r}))"],
        cwd=base, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root


def byte_stream_split_files(lake: Lake, name: str) -> int:
    """How many current files of `name` hold a BYTE_STREAM_SPLIT column chunk."""
    count = 0
    for uri in lake.files(name):
        meta = pq.ParquetFile(uri.removeprefix("file://")).metadata
        encodings = {e for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                     for e in meta.row_group(g).column(c).encodings}  # fmt: skip
        count += "BYTE_STREAM_SPLIT" in encodings
    return count


def answers(lake: Lake) -> dict[str, Any]:
    """What a user asks of the lake: its trajectories per run, their tokens, their tool calls."""
    return {
        "runs": lake.sql(
            "select run_id, count(*) as n, sum(total_tokens) as t from trajectories group by 1 order by 1"
        ).to_pylist(),
        "tokens": token_digest(lake.sql("select token_ids, logprobs from trajectories")),
        "tool_calls": lake.sql("select count(*) as n from tool_calls").to_pylist(),
    }


def test_an_old_lake_opens_takes_events_rebuilds_compacts_and_spark_reads_it(
    old_lake: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from trajlake.store.spark import register_lake

    root = str(old_lake)
    lake = Lake(root, create=False)
    assert byte_stream_split_files(lake, "events") == len(lake.files("events")) > 0
    before = answers(lake)
    assert before["runs"][0]["n"] == 24

    assert (
        main(["loadgen", "--lake", root, "--trajectories", "6", "--run-id", "new", "--prompt-tokens", "64"])
        == 0
    )
    lake = Lake(root, create=False)
    grown = answers(lake)
    assert [r["run_id"] for r in grown["runs"]] == ["new", "old"]
    assert grown["runs"][1] == before["runs"][0]

    assert main(["rebuild", "--lake", root]) == 0
    assert answers(Lake(root, create=False)) == grown

    assert main(["compact", "--lake", root]) == 0
    lake = Lake(root, create=False)
    assert byte_stream_split_files(lake, "events") == 0  # rewritten in the portable layout
    assert answers(lake) == grown
    capsys.readouterr()

    register_lake(spark, root)
    spark_runs = spark.sql(
        "select run_id, count(*) as n, sum(total_tokens) as t from trajectories group by 1 order by 1"
    ).toArrow()
    assert spark_runs.to_pylist() == grown["runs"]
    assert (
        token_digest(spark.sql("select token_ids, logprobs from trajectories").toArrow()) == grown["tokens"]
    )
