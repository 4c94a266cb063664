"""Faults during a 200k-event ingest: sinks SIGKILLed at random moments, the broker killed and restarted."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from trajlake.ingest.broker import BrokerConfig, free_port, kill_broker, start_broker, stop_broker
from trajlake.ingest.bus.kafka import create_topic
from trajlake.ingest.config import KafkaConfig
from trajlake.store.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = ("--prompt-tokens", "4", "--output-tokens", "4", "--env-tokens", "2")


@pytest.fixture
def own_broker(tmp_path: Path):
    """A broker this test may kill: never the shared session broker."""
    config = BrokerConfig(port=free_port(), data_dir=tmp_path / "broker", partitions=4)
    start_broker(config)
    yield config
    stop_broker(config.data_dir)


def wait_for_assignment(sink: subprocess.Popen, timeout_s: float = 90.0) -> None:
    """Block until `sink` owns partitions (its log says so)."""
    log: Path = sink.log_path  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "partitions assigned" in log.read_text(errors="replace"):
            return
        time.sleep(0.1)
    raise AssertionError(f"the sink got no partitions within {timeout_s} s; see {log}")


def test_sigkilled_sinks_and_a_restarted_broker_lose_and_duplicate_nothing(
    own_broker: BrokerConfig, trajlake_cli, tmp_path: Path
) -> None:
    bootstrap = f"127.0.0.1:{own_broker.port}"
    topic = KafkaConfig(bootstrap=bootstrap, topic="faults", partitions=4)
    create_topic(topic)
    lake_dir = tmp_path / "lake"
    kafka = ("--kafka", bootstrap, "--topic", topic.topic)
    producers = [
        trajlake_cli("loadgen", *kafka, "--json", "--run-id", f"p{i}", "--seed", str(i), "--trajectories", "6150", *SMALL)
        for i in range(2)
    ]
    os.environ["TRAJLAKE_KAFKA_SESSION_TIMEOUT_S"] = "2"  # the group drops a killed sink quickly
    try:
        sink_args = ("ingest", *kafka, "--group", "faults", "--lake", str(lake_dir), "--max-latency", "0.3")
        rng = random.Random(1234)
        kills = 0
        broker_restarted = False
        while kills < 10 or any(p.poll() is None for p in producers) and kills < 30:
            sink = trajlake_cli(*sink_args, "--until-idle", "600")
            wait_for_assignment(sink)
            time.sleep(rng.uniform(0.2, 2.5))  # a random moment: polling, writing Parquet or committing
            sink.send_signal(signal.SIGKILL)
            sink.wait()
            kills += 1
            if kills == 4:  # mid-stream: the producers are still writing
                assert any(p.poll() is None for p in producers)
                kill_broker(own_broker.data_dir)
                time.sleep(2)
                start_broker(own_broker)
                broker_restarted = True
        produced = 0
        for proc in producers:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out
            produced += json.loads(out.strip().splitlines()[-1])["events"]
        final = trajlake_cli(*sink_args, "--until-idle", "8")
        out, _ = final.communicate(timeout=300)
        assert final.returncode == 0, out
    finally:
        del os.environ["TRAJLAKE_KAFKA_SESSION_TIMEOUT_S"]
    assert kills >= 10 and broker_restarted
    assert produced >= 200_000
    lake = Lake(lake_dir)
    try:
        row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
        assert (row["n"], row["d"]) == (produced, produced)
    finally:
        lake.close()
