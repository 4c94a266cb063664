"""Opening tables of a local lake: whether one exists, and catching up on other writers' commits."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from tests.helpers import age_log
from trajlake.store import delta_log
from trajlake.store.config import LakeConfig
from trajlake.store.delta_log import LOG_CLEANUP_INTERVAL
from trajlake.store.errors import LakeError
from trajlake.store.lake import Lake
from trajlake.store.tables import CHECKPOINT_INTERVAL


def one_row(i: int) -> pa.Table:
    return pa.table({"run_id": ["r"], "step": [i], "trainer_version": [i], "rank": [0]})


def test_a_reader_sees_every_commit_another_writer_makes(tmp_path) -> None:
    writer, reader = Lake(tmp_path / "lake"), Lake(tmp_path / "lake")
    assert not reader.exists("trainer_steps") and reader.version("trainer_steps") == -1
    for i in range(3):
        writer.append("trainer_steps", one_row(i))
        assert reader.exists("trainer_steps")
        assert reader.version("trainer_steps") == writer.version("trainer_steps")
        assert sorted(reader.read("trainer_steps").column("step").to_pylist()) == list(range(i + 1))


def test_a_long_log_is_checkpointed_so_a_reader_replays_few_commits(tmp_path) -> None:
    writer = Lake(tmp_path / "lake")
    for i in range(2 * CHECKPOINT_INTERVAL + 3):
        writer.append("trainer_steps", one_row(i))
    log = tmp_path / "lake" / "trainer_steps" / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in log.glob("*.checkpoint.parquet"))
    assert len(checkpoints) == 2
    assert writer.version("trainer_steps") - checkpoints[-1] <= CHECKPOINT_INTERVAL
    assert Lake(tmp_path / "lake").read("trainer_steps").num_rows == 2 * CHECKPOINT_INTERVAL + 3


def test_expired_log_entries_are_cleaned_up_every_interval_not_at_every_commit(tmp_path) -> None:
    """delta-rs's clean-up after each commit lists the whole log; the lake runs it every
    `LOG_CLEANUP_INTERVAL` versions, and the table reads the same afterwards."""
    writer = Lake(tmp_path / "lake")
    writer.append("trainer_steps", one_row(0))
    writer.delta("trainer_steps").alter.set_table_properties(
        {"delta.logRetentionDuration": "interval 0 seconds"}
    )
    log = tmp_path / "lake" / "trainer_steps" / "_delta_log"
    commits = lambda: sorted(int(p.name.split(".")[0]) for p in log.glob("*.json"))  # noqa: E731
    while writer.version("trainer_steps") < LOG_CLEANUP_INTERVAL - 1:
        writer.append("trainer_steps", one_row(writer.version("trainer_steps")))
    assert commits()[0] == 0  # every commit is still there
    rows = writer.read("trainer_steps").column("step").to_pylist()
    writer.append("trainer_steps", one_row(LOG_CLEANUP_INTERVAL))
    assert writer.version("trainer_steps") == LOG_CLEANUP_INTERVAL
    assert commits()[0] >= LOG_CLEANUP_INTERVAL - CHECKPOINT_INTERVAL  # the last checkpoint on
    reader = Lake(tmp_path / "lake")
    assert sorted(reader.read("trainer_steps").column("step").to_pylist()) == sorted(
        [*rows, LOG_CLEANUP_INTERVAL]
    )


def test_a_new_table_keeps_its_log_for_the_configured_hours_not_thirty_days(tmp_path) -> None:
    """A commit lists the whole log on a local disk, so the log must not keep a month of commits."""
    writer = Lake(tmp_path / "lake", LakeConfig(log_retention_hours=3))
    log = tmp_path / "lake" / "trainer_steps" / "_delta_log"
    appended = 0

    def append_until(version: int) -> None:  # `version` included: a clean-up runs at its multiples
        nonlocal appended
        while writer.version("trainer_steps") < version:
            writer.append("trainer_steps", one_row(appended))
            appended += 1

    append_until(1)
    configuration = DeltaTable(str(tmp_path / "lake" / "trainer_steps")).metadata().configuration
    assert configuration["delta.logRetentionDuration"] == "interval 3 hours"
    append_until(LOG_CLEANUP_INTERVAL - 1)
    age_log(log, 2)  # younger than the retention: kept
    append_until(LOG_CLEANUP_INTERVAL)
    assert (log / f"{0:020d}.json").exists()
    append_until(2 * LOG_CLEANUP_INTERVAL - 1)
    age_log(log, 4)  # older: the commits before the last checkpoint go
    append_until(2 * LOG_CLEANUP_INTERVAL)
    first_kept = min(int(p.name.split(".")[0]) for p in log.glob("*.json"))
    assert first_kept >= 2 * LOG_CLEANUP_INTERVAL - CHECKPOINT_INTERVAL
    steps = Lake(tmp_path / "lake").read("trainer_steps").column("step").to_pylist()
    assert sorted(steps) == list(range(appended))


def test_a_reader_whose_commit_was_cleaned_up_still_sees_every_later_commit(tmp_path) -> None:
    """A reader checks for the commit after its own with one `stat`; once the log before a
    checkpoint is cleaned up, that commit is gone for good, and so is the reader's own."""
    writer, reader = Lake(tmp_path / "lake"), Lake(tmp_path / "lake")
    writer.append("trainer_steps", one_row(0))
    assert reader.version("trainer_steps") == writer.version("trainer_steps")
    for i in range(1, 2 * CHECKPOINT_INTERVAL + 3):
        writer.append("trainer_steps", one_row(i))
    age_log(tmp_path / "lake" / "trainer_steps" / "_delta_log", LakeConfig().log_retention_hours + 1)
    writer.delta("trainer_steps").cleanup_metadata()
    assert not (tmp_path / "lake" / "trainer_steps" / "_delta_log" / f"{1:020d}.json").exists()
    assert reader.version("trainer_steps") == writer.version("trainer_steps")
    assert reader.read("trainer_steps").num_rows == 2 * CHECKPOINT_INTERVAL + 3


def test_a_failed_log_clean_up_leaves_the_commit_standing(tmp_path, monkeypatch, caplog) -> None:
    def refuse(self: DeltaTable) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(delta_log, "LOG_CLEANUP_INTERVAL", 1)
    monkeypatch.setattr(DeltaTable, "cleanup_metadata", refuse)
    writer = Lake(tmp_path / "lake")
    writer.append("trainer_steps", one_row(0))
    writer.append("trainer_steps", one_row(1))
    assert Lake(tmp_path / "lake").read("trainer_steps").num_rows == 2
    assert "could not clean up expired log entries of trainer_steps: read-only file system" in caplog.text


def test_a_table_whose_first_commits_were_cleaned_up_still_exists(tmp_path) -> None:
    writer = Lake(tmp_path / "lake")
    for i in range(3):
        writer.append("trainer_steps", one_row(i))
    writer.delta("trainer_steps").create_checkpoint()
    log = tmp_path / "lake" / "trainer_steps" / "_delta_log"
    for version in range(2):  # what log cleanup leaves: the checkpoint and the commits after it
        (log / f"{version:020d}.json").unlink()
    reader = Lake(tmp_path / "lake")
    assert reader.exists("trainer_steps")
    assert reader.read("trainer_steps").num_rows == 3


def test_a_file_where_a_table_directory_belongs_is_an_error_not_an_empty_table(tmp_path) -> None:
    lake = Lake(tmp_path / "lake")
    (tmp_path / "lake" / "trainer_steps").write_text("not a table")
    with pytest.raises(LakeError, match="cannot use the lake at"):
        lake.exists("trainer_steps")


def test_an_s3_store_that_refused_is_named_with_the_key_it_refused() -> None:
    from trajlake.store.storage import Storage

    storage = Storage(
        "s3://trajlake/lake", {"AWS_ACCESS_KEY_ID": "trajlake-writer", "AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    )
    said = storage.unreachable(OSError("Generic S3 error\n 403 Forbidden\n <Code>InvalidAccessKeyId</Code>"))
    assert "AWS_ACCESS_KEY_ID=trajlake-writer" in said and "InvalidAccessKeyId" in said
    assert "s3cr3t" not in said


@pytest.mark.parametrize(
    ("said", "transient"),
    [
        (
            "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7, Could not connect to server",
            True,
        ),
        ("AWS Error ACCESS_DENIED during HeadObject operation: <Code>InvalidAccessKeyId</Code>", False),
    ],
    ids=["store-down", "key-refused"],
)
def test_a_scan_duckdb_could_not_read_from_a_store_that_did_not_answer_is_tried_again(
    said, transient
) -> None:
    """A sink's read of the seqs it knows went through DuckDB while SeaweedFS restarted: DuckDB says
    pyarrow's I/O error as its own InvalidInputException, and the sink stopped instead of waiting."""
    import duckdb

    from trajlake.store.storage import is_transient

    scan = f"Invalid Input Error: reading the stream registered as '_d_events' failed: IOError: {said}"
    assert is_transient(duckdb.InvalidInputException(scan)) is transient
    assert not is_transient(duckdb.BinderException("Referenced column NETWORK_CONNECTION not found"))
