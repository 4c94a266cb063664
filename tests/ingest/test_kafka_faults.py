"""Faults during a 200k-event ingest: sinks SIGKILLed at random moments, the broker killed and restarted."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures.kafka import events_produced, start_producers, wait_for_log
from trajlake.ingest.broker import BrokerConfig, free_port, kill_broker, start_broker, stop_broker
from trajlake.ingest.bus.kafka import create_topic
from trajlake.ingest.config import KafkaConfig
from trajlake.store.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def own_broker(tmp_path: Path):
    """A broker this test may kill: never the shared session broker."""
    config = BrokerConfig(port=free_port(), data_dir=tmp_path / "broker", partitions=4)
    start_broker(config)
    yield config
    stop_broker(config.data_dir)


def messages_in(topic: KafkaConfig) -> int:
    """Messages written to `topic` so far (sum of its partitions' end offsets)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**topic.client_kwargs())
    try:
        ends = consumer.end_offsets([TopicPartition(topic.topic, p) for p in range(topic.partitions)])
        return sum(ends.values())
    finally:
        consumer.close()


def test_sigkilled_sinks_and_a_restarted_broker_lose_and_duplicate_nothing(
    own_broker: BrokerConfig, trajlake_cli, tmp_path: Path
) -> None:
    bootstrap = f"127.0.0.1:{own_broker.port}"
    topic = KafkaConfig(bootstrap=bootstrap, topic="faults", partitions=4)
    create_topic(topic)
    lake_dir = tmp_path / "lake"
    kafka = ("--kafka", bootstrap, "--topic", topic.topic)
    producers = start_producers(trajlake_cli, kafka, 2, 6150)
    # mid-stream: both producers are writing when the broker dies; they must hold on and deliver
    # (loadgen packs dozens of these small trajectories per message: a few hundred messages in all)
    while messages_in(topic) < 30:
        assert all(p.poll() is None for p in producers), "a producer ended before the broker was killed"
        time.sleep(0.05)
    assert all(p.poll() is None for p in producers)
    kill_broker(own_broker.data_dir)
    for producer in producers:  # each has felt the outage and spools rather than fail or drop
        wait_for_log(producer, "unreachable")
    start_broker(own_broker)

    sink_env = {"TRAJLAKE_KAFKA_SESSION_TIMEOUT_S": "2"}  # the group drops a killed sink quickly
    sink_args = ("ingest", *kafka, "--group", "faults", "--lake", str(lake_dir), "--max-latency", "0.3")
    rng = random.Random(1234)
    for _ in range(10):
        sink = trajlake_cli(*sink_args, "--until-idle", "600", env=sink_env)
        wait_for_log(sink, "partitions assigned")
        time.sleep(rng.uniform(0.1, 2.5))  # a random moment: polling, writing Parquet or committing
        sink.send_signal(signal.SIGKILL)
        sink.wait()

    produced = events_produced(producers)
    assert produced >= 200_000
    final = trajlake_cli(*sink_args, "--until-idle", "5", env=sink_env)
    out, _ = final.communicate(timeout=300)
    assert final.returncode == 0, out
    lake = Lake(lake_dir)
    try:
        row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
        assert (row["n"], row["d"]) == (produced, produced)
    finally:
        lake.close()
