"""`KafkaSubscriber.caught_up` against a consumer whose assignment moves under it (kafka-python rebalances on its IO thread)."""

from __future__ import annotations

from kafka import TopicPartition
from kafka.errors import IllegalStateError

from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig


class Consumer:
    """Two partitions read to their end; `revoked` makes the next lookup fail as after a rebalance."""

    def __init__(self, revoked: bool) -> None:
        self.revoked = revoked
        self.tps = [TopicPartition("t", 0), TopicPartition("t", 1)]

    def assignment(self) -> set[TopicPartition]:
        return set(self.tps)

    def highwater(self, tp: TopicPartition) -> int:
        if self.revoked:
            raise IllegalStateError("Partition is not assigned")
        return 10

    def position(self, tp: TopicPartition, timeout_ms: int | None = None) -> int:
        return 10


def test_caught_up_reads_position_against_the_high_watermark() -> None:
    bus = KafkaSubscriber(KafkaConfig(topic="t"))
    assert not bus.caught_up()  # no consumer yet
    bus._consumer = Consumer(revoked=False)
    assert bus.caught_up()


def test_a_partition_taken_away_mid_check_means_not_caught_up_rather_than_a_crash() -> None:
    bus = KafkaSubscriber(KafkaConfig(topic="t"))
    bus._consumer = Consumer(revoked=True)
    assert not bus.caught_up()
