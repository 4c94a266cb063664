"""Every writer of a lake at once on one S3 lake (SeaweedFS): two sinks, the projector, compaction
runs, fed by two loadgens. Nothing is lost or stored twice, every table's log is whole (each
version written once), and the commits the store refused because another writer had just written
that version (412) are counted at the store itself, beside the projector's position retries;
every one of them was retried, since nothing is missing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.fixtures.kafka import events_produced, start_producers, wait_for_log, wait_for_split
from tests.fixtures.s3 import create_bucket
from tests.fixtures.s3_proxy import s3_proxy
from tests.helpers import trajlake
from trajlake.common.retry import wait_until
from trajlake.ingest.config import KafkaConfig
from trajlake.store import projections
from trajlake.store.lake import TABLES, Lake
from trajlake.store.put_if_absent import PROBE_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRAJECTORIES = 300
"""Per loadgen."""


def _log_versions(lake: Lake, name: str) -> list[int]:
    """The versions of `name` whose log entry is in the store, in order."""
    import pyarrow.fs as pafs

    fs, root = lake.filesystem()
    entries = fs.get_file_info(pafs.FileSelector(f"{root}/{name}/_delta_log"))
    return sorted(int(Path(e.path).stem) for e in entries if e.path.endswith(".json"))


def test_two_sinks_a_projector_compaction_and_two_loadgens_share_one_s3_lake(
    s3_server: dict[str, str],
    kafka_topic: KafkaConfig,
    trajlake_cli,
    tmp_path: Path,
    capsys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_PACK_BYTES", "0")  # a message per trajectory: many small commits
    root = f"s3://{create_bucket(s3_server)}/lake"
    kafka = ("--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic)
    with s3_proxy(s3_server, tmp_path / "proxy.log") as proxy:
        env = {**s3_server, "AWS_ENDPOINT_URL": proxy.endpoint}
        lake = Lake(root, storage_options=env)
        # commits of 50 events at most: the two sinks commit to `events` many times a second, and race
        sink_args = ("ingest", *kafka, "--group", kafka_topic.group_id, "--lake", root, "--max-rows", "50",
                     "--max-latency", "0.1", "--no-update-projections")  # fmt: skip
        sinks = [trajlake_cli(*sink_args, env=env) for _ in range(2)]
        wait_for_split(sinks)
        projector = trajlake_cli("project", "--lake", root, "--follow", "--poll-interval", "0.2", env=env)
        producers = start_producers(trajlake_cli, kafka, 2, TRAJECTORIES)
        wait_for_log(projector, "holds the projections")
        assert wait_until(lambda: lake.exists("events"), timeout_s=120, interval_s=0.2), "no sink committed"
        compactions = []
        while any(p.poll() is None for p in producers) or len(compactions) < 2:
            compactions.append(trajlake("compact", "--lake", root, "--no-vacuum", env={**os.environ, **env}))
        produced = events_produced(producers)

        def stored() -> bool:
            return lake.sql("select count(*) as n from events").to_pylist()[0]["n"] >= produced

        assert wait_until(stored, timeout_s=300, interval_s=0.5), "the sinks did not store every event"
        for sink in sinks:  # a stopped sink commits what it holds, and says what it stored
            sink.send_signal(signal.SIGTERM)
            out, _ = sink.communicate(timeout=300)
            assert sink.returncode == 0, sink.log_path.read_text(errors="replace")[-3000:]
            assert json.loads(out.strip().splitlines()[-1])["events"] > 0  # both sinks took part
        events_version = lake.version("events")
        assert wait_until(
            lambda: lake.txn_version("trajectories", projections.APP_ID) == events_version,
            timeout_s=300,
            interval_s=0.5,
        ), "the projector did not catch up"
        projector.send_signal(signal.SIGTERM)
        out, _ = projector.communicate(timeout=120)
        assert projector.returncode == 0, projector.log_path.read_text(errors="replace")[-3000:]
        projected = json.loads(out.strip().splitlines()[-1])
        commits = [(status, path) for status, path in proxy.commits() if PROBE_PREFIX not in path]

    lake = Lake(root, storage_options=s3_server)
    row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    assert (row["n"], row["d"]) == (produced, produced)  # nothing lost, nothing twice
    keys = "run_id, trajectory_id"
    stored = lake.sql(f"select * from trajectories order by {keys}").to_pylist()
    assert len(stored) == 2 * TRAJECTORIES
    projections.rebuild(lake)
    assert (
        Lake(root, storage_options=s3_server).sql(f"select * from trajectories order by {keys}").to_pylist()
        == stored
    )
    for name in TABLES:  # every log whole: each version from 0 to the last, each written once
        if lake.exists(name):
            assert _log_versions(lake, name) == list(range(lake.version(name) + 1)), name
    refused = sum(1 for status, _ in commits if status == 412)
    landed = sum(1 for status, _ in commits if status == 200)
    assert landed == len({path for status, path in commits if status == 200})  # no entry written twice
    with capsys.disabled():
        print(
            f"\n[s3 writers] events {produced}, commits {landed}, refused by the store and retried {refused}, "
            f"projector position retries {projected['position_retries']}, compaction runs {len(compactions)}"
        )
