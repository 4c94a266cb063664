"""Exactly-once delivery from a real Kafka broker into the lake, with several producers and sinks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.fixtures.kafka import events_produced, start_producers, wait_for_split
from trajlake.ingest.bus.kafka import KafkaBus
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


def counts(lake: Lake) -> tuple[int, int]:
    row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    return row["n"], row["d"]


def produce(kafka_topic: KafkaConfig, trajectories: int, run_id: str = "run") -> int:
    bus = KafkaBus(kafka_topic)
    try:
        produced = generate(
            bus, LoadgenConfig(trajectories=trajectories, run_id=run_id, prompt_tokens=8, output_tokens=8)
        )
    finally:
        bus.close()
    return produced.events


def test_replaying_the_same_offsets_adds_no_rows(lake: Lake, kafka_topic: KafkaConfig) -> None:
    produced = produce(kafka_topic, 30)
    for group in ("first-group", "a-group-kafka-never-saw"):  # Kafka forgets; the Delta log does not
        bus = KafkaBus(kafka_topic.model_copy(update={"group_id": f"{kafka_topic.group_id}-{group}"}))
        try:
            DeltaSink(lake, bus, SinkConfig(max_latency_s=0.2)).run(until_idle_s=1.5)
        finally:
            bus.close()
        assert counts(lake) == (produced, produced)


def test_four_producers_and_two_sinks_store_100k_events_once(
    kafka_topic: KafkaConfig, trajlake_cli, tmp_path: Path
) -> None:
    lake_dir = tmp_path / "lake"
    kafka = ("--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic)
    sinks = [
        trajlake_cli(
            "ingest", *kafka, "--group", kafka_topic.group_id, "--lake", str(lake_dir), "--until-idle", "15"
        )
        for _ in range(2)
    ]
    wait_for_split(sinks)  # else one sink may drain the topic before the other has joined
    producers = start_producers(trajlake_cli, kafka, 4, 1530)
    produced = events_produced(producers)
    assert produced >= 100_000
    stored_by_sink = []
    for proc in sinks:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        stored_by_sink.append(json.loads(out.strip().splitlines()[-1])["events"])
    assert all(n > 0 for n in stored_by_sink), f"both sinks should share the topic: {stored_by_sink}"
    lake = Lake(lake_dir)
    try:
        assert counts(lake) == (produced, produced)
        assert sum(stored_by_sink) == produced
    finally:
        lake.close()


def test_kafka_is_told_how_far_the_sink_committed(lake: Lake, kafka_topic: KafkaConfig) -> None:
    """Lag tools read the group's offsets in Kafka; the sink sets them after each Delta commit."""
    from kafka import KafkaConsumer, TopicPartition

    from trajlake.ingest.bus.base import SourcePosition

    produce(kafka_topic, 20)
    bus = KafkaBus(kafka_topic)
    try:
        DeltaSink(lake, bus, SinkConfig(max_latency_s=0.2)).run(until_idle_s=1.0)
    finally:
        bus.close()
    in_delta = {
        p: lake.txn_version("events", SourcePosition(kafka_topic.topic, p, 0).app_id)
        for p in range(kafka_topic.partitions)
    }
    reader = KafkaConsumer(
        **kafka_topic.client_kwargs(), group_id=kafka_topic.group_id, enable_auto_commit=False
    )
    try:
        in_kafka = {p: reader.committed(TopicPartition(kafka_topic.topic, p)) for p in in_delta}
    finally:
        reader.close()
    assert any(v is not None for v in in_delta.values())
    assert in_kafka == {p: None if v is None else v + 1 for p, v in in_delta.items()}


def test_a_burst_is_committed_as_soon_as_the_sink_has_read_it(lake: Lake, kafka_topic: KafkaConfig) -> None:
    """Once the consumer reaches the high watermark the sink flushes, without waiting for a quiet poll."""
    produced = produce(kafka_topic, 20)
    bus = KafkaBus(kafka_topic)
    try:
        sink = DeltaSink(lake, bus, SinkConfig(max_latency_s=60, min_commit_interval_s=0))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = sink.poll_once()
            if got and not sum(bus.lag().values()):
                break  # this poll brought the last messages: the input never went quiet
        assert bus.caught_up() and sink.should_flush()
        sink.flush()
    finally:
        bus.close()
    assert counts(lake) == (produced, produced)
