"""A sink joins its consumer group once: every partition in the first assignment, no second rebalance."""

from __future__ import annotations

import logging
import time

import pytest

from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig

pytestmark = pytest.mark.integration


def test_a_new_sink_gets_every_partition_in_one_rebalance(kafka_topic: KafkaConfig, caplog) -> None:
    """Joining before the topic's metadata arrived assigned nothing, then rebalanced again; a
    metadata refresh during that second rebalance could leave the sink with no partitions."""
    caplog.set_level(logging.INFO, logger="kafka.coordinator")
    bus = KafkaSubscriber(kafka_topic)
    rebalances: list[tuple[str, list[int]]] = []

    class Listener:
        def on_assigned(self, parts: list[int]) -> None:
            rebalances.append(("assigned", sorted(parts)))

        def on_revoked(self, parts: list[int]) -> None:
            rebalances.append(("revoked", sorted(parts)))

        def on_lost(self, parts: list[int]) -> None:
            rebalances.append(("lost", sorted(parts)))

    bus.listen(Listener())
    try:
        deadline = time.monotonic() + 30
        while not bus.assigned_partitions() and time.monotonic() < deadline:
            bus.poll(100, 0.2)
        settle = time.monotonic() + 3  # kafka-python refreshes the topic's metadata right after joining
        while time.monotonic() < settle:
            bus.poll(100, 0.2)
        assert sorted(bus.assigned_partitions()) == list(range(kafka_topic.partitions))
        assert rebalances == [("assigned", list(range(kafka_topic.partitions)))]  # close revokes after
    finally:
        bus.close()
    assert caplog.text.count("Successfully joined group") == 1
    assert "No partition metadata" not in caplog.text


def test_a_sink_on_a_topic_that_does_not_exist_yet_says_so(kafka_topic: KafkaConfig, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="trajlake.ingest.bus.kafka_subscriber")
    existing = KafkaSubscriber(kafka_topic)
    missing = KafkaSubscriber(kafka_topic.model_copy(update={"topic": kafka_topic.topic + "-not-created"}))
    try:
        existing.assigned_partitions()  # starts the consumer
        assert "does not exist" not in caplog.text
        missing.assigned_partitions()
        assert f"topic {missing.topic} does not exist at {kafka_topic.bootstrap} yet" in caplog.text
    finally:
        existing.close()
        missing.close()
