"""The lake on S3-compatible storage (SeaweedFS): reads, writes and two concurrent sinks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from tests.fixtures.kafka import wait_for_split
from trajlake.ingest.config import KafkaConfig
from trajlake.schemas import events_to_table, make_event
from trajlake.store import projections
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


def test_an_s3_lake_stores_and_queries_events(s3_lake_root: str) -> None:
    lake = Lake(s3_lake_root)
    try:
        events = [make_event("policy_updated", "r", policy_version=v, step=v) for v in range(5)]
        version = lake.append("events", events_to_table(events), {"trajlake-sink:t:0": 4})
        assert version >= 0
        assert lake.txn_version("events", "trajlake-sink:t:0") == 4
        assert all(f.startswith("s3://") for f in lake.files("events"))
        rows = lake.sql("select policy_version from events order by 1").column("policy_version").to_pylist()
        assert rows == [0, 1, 2, 3, 4]
        # rebuild reads the events files from S3 a row group at a time
        assert projections.rebuild(lake)["policy_versions"] == 5
        assert lake.sql("select count(*) as n from policy_versions").column("n").to_pylist() == [5]
    finally:
        lake.close()


def test_a_stale_writer_cannot_commit_offsets_another_writer_stored(s3_lake_root: str) -> None:
    from trajlake.store.errors import TxnFenced

    first, second = Lake(s3_lake_root), Lake(s3_lake_root)
    empty = events_to_table([])
    first.append("events", empty, {"trajlake-sink:t:0": 10})
    expect = {"trajlake-sink:t:0": 10}
    second.commit("events", [], {"trajlake-sink:t:0": 20}, expect_txns=expect)
    with pytest.raises(TxnFenced, match="expected 10, found 20"):
        first.commit("events", [], {"trajlake-sink:t:0": 20}, expect_txns=expect)
    assert isinstance(empty, pa.Table)
    first.close()
    second.close()


def test_two_sink_processes_write_the_same_s3_tables_exactly_once(
    s3_lake_root: str, kafka_topic: KafkaConfig, trajlake_cli, tmp_path: Path
) -> None:
    kafka = ("--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic)
    sinks = [
        trajlake_cli(
            "ingest",
            *kafka,
            "--group",
            kafka_topic.group_id,
            "--lake",
            s3_lake_root,
            "--until-idle",
            "15",  # a slow group join must not outlast it
            "--max-latency",
            "0.5",
        )
        for _ in range(2)
    ]
    wait_for_split(sinks)  # both sinks share the partitions before anything is produced
    producer = trajlake_cli(
        "loadgen",
        *kafka,
        "--json",
        "--trajectories",
        "600",
        "--prompt-tokens",
        "8",
        "--output-tokens",
        "8",
        "--env-tokens",
        "4",
    )
    out, _ = producer.communicate(timeout=300)
    assert producer.returncode == 0
    produced = json.loads(out.strip().splitlines()[-1])["events"]
    per_sink = []
    for sink in sinks:
        out, _ = sink.communicate(timeout=300)
        assert sink.returncode == 0, sink.log_path.read_text()[-3000:]
        per_sink.append(json.loads(out.strip().splitlines()[-1])["events"])
    assert all(n > 0 for n in per_sink), per_sink  # both sinks committed to the same tables
    lake = Lake(s3_lake_root)
    try:
        row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
        assert (row["n"], row["d"]) == (produced, produced)
        assert lake.sql("select count(*) as n from trajectories").to_pylist()[0]["n"] == 600
    finally:
        lake.close()


def test_a_missing_bucket_is_an_error_that_names_the_fix_not_an_empty_lake(s3_lake_root: str) -> None:
    from trajlake.store.errors import LakeError

    missing = "s3://no-such-bucket-" + s3_lake_root.split("/")[2].removeprefix("lake-") + "/lake"
    lake = Lake(missing)
    with pytest.raises(LakeError, match=f"cannot use the lake at {missing} .*that the bucket exists"):
        lake.sql("select count(*) from events")
    with pytest.raises(LakeError, match="that the bucket exists"):
        lake.append("events", events_to_table([make_event("policy_updated", "r", policy_version=0, step=0)]))
    assert Lake(s3_lake_root).version("events") == -1  # a fresh prefix of a bucket that exists: empty


def test_cli_with_no_s3_server_at_the_endpoint_says_so(tmp_path: Path) -> None:
    from tests.helpers import clean_env, trajlake
    from trajlake.ingest.broker import free_port

    s3 = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x"}
    s3.update(AWS_SECRET_ACCESS_KEY="y", AWS_REGION="us-east-1", AWS_ALLOW_HTTP="true")
    out = trajlake(
        "sql",
        "--lake",
        "s3://b/lake",
        "select count(*) from events",
        env=clean_env(tmp_path, **s3),
        check=False,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "trajlake sql: error: cannot use the lake at s3://b/lake" in out.stderr
    assert "AWS_ENDPOINT_URL" in out.stderr and "Traceback" not in out.stderr


def test_storage_options_given_to_the_lake_reach_its_parquet_writes_too(
    s3_lake_root: str, s3_server: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in s3_server:  # only the options below say where the storage is
        monkeypatch.delenv(key, raising=False)
    lake = Lake(s3_lake_root, storage_options=s3_server)
    try:
        events = [make_event("policy_updated", "r", policy_version=v, step=v) for v in range(3)]
        lake.append("events", events_to_table(events))
        assert lake.sql("select count(*) as n from events").to_pylist()[0]["n"] == 3
    finally:
        lake.close()


def test_aggregates_per_file_of_an_s3_lake_equal_each_file_read_alone(s3_lake_root: str) -> None:
    """Rows read through a pyarrow dataset do not say their file: `read(by_file=True)` reads each."""
    lake = Lake(s3_lake_root)
    try:
        for versions in (range(3), range(3, 8)):
            lake.append(
                "events",
                events_to_table([make_event("policy_updated", "r", policy_version=v) for v in versions]),
            )
        files = lake.file_stats("events")
        per_file = lake.read("events", files=files, select="count(*) as n", by_file=True).to_pylist()
        assert sorted((row["uri"], row["n"]) for row in per_file) == sorted(
            (uri, lake.read("events", files=files.slice(i, 1), select="count(*) as n").column("n")[0].as_py())
            for i, uri in enumerate(files.column("uri").to_pylist())
        )
        assert sorted(row["n"] for row in per_file) == [3, 5]
    finally:
        lake.close()


def test_a_reader_refuses_an_empty_prefix_and_reads_the_lake_once_one_is_written(
    s3_lake_root: str, capsys
) -> None:
    from trajlake.cli import main

    assert main(["sql", "--lake", s3_lake_root, "select count(*) from events"]) == 2
    assert f"error: no lake at {s3_lake_root} " in capsys.readouterr().err
    lake = Lake(s3_lake_root)
    lake.append("events", events_to_table([make_event("policy_updated", "r", policy_version=0, step=0)]))
    lake.close()
    assert main(["sql", "--lake", s3_lake_root, "--format", "json", "select count(*) as n from events"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 1}]
