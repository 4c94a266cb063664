"""`trajlake ingest --until-idle` tells the truth: after sinks are SIGKILLed and their dead sessions
hold the group, a fresh drain exits 0 only once the lake holds every message of the topic."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.fixtures.kafka import events_produced, start_producers, wait_for_log
from trajlake.ingest.config import KafkaConfig
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("killed", ["after joining", "while joining"])
def test_a_drain_after_killed_sinks_ingests_everything_before_it_stops(
    kafka_topic: KafkaConfig, trajlake_cli, tmp_path: Path, killed: str
) -> None:
    lake = tmp_path / "lake"
    kafka = ("--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic)
    sink = ("ingest", *kafka, "--group", kafka_topic.group_id, "--lake", str(lake), "--no-update-projections")
    doomed = [trajlake_cli(*sink, log_name=f"doomed{i}") for i in range(3)]
    for proc in doomed:  # the default 10 s session: a dead member holds its partitions that long
        wait_for_log(proc, "partitions assigned" if killed == "after joining" else "ingesting")
    for proc in doomed:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    produced = events_produced(start_producers(trajlake_cli, kafka, 1, 300))

    drain = trajlake_cli(*sink, "--until-idle", "2", log_name="drain")
    out, _ = drain.communicate(timeout=300)
    assert drain.returncode == 0, drain.log_path.read_text(errors="replace")[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["events"] == produced
    row = Lake(lake).sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    assert (row["n"], row["d"]) == (produced, produced)
