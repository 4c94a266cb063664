"""`KafkaBus`: both roles on one Kafka topic, for a process that publishes and sinks at once (the
demo on Kafka, tests): a `KafkaPublisher` and a `KafkaSubscriber`, each built when its role is
first used, so a process that only publishes never builds a consumer. Processes of one role
use that role's class (`setup_publisher`, `setup_consumer`); `KafkaAdmin` answers the rest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trajlake.ingest.bus.base import Bus, Message, Packing, RebalanceListener, SpoolStats
from trajlake.ingest.bus.kafka_admin import create_topic
from trajlake.ingest.bus.kafka_client import kafka_partition_of
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig

__all__ = ["KafkaBus", "create_topic", "kafka_partition_of"]


class KafkaBus(Bus):
    """Publishes to and consumes from one Kafka topic, each role built on first use."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.topic = config.topic
        self._publisher: KafkaPublisher | None = None
        self._subscriber: KafkaSubscriber | None = None

    def __repr__(self) -> str:
        return f"KafkaBus({self.config.bootstrap!r}, topic={self.topic!r})"

    @property
    def publisher(self) -> KafkaPublisher:
        """The producer role (with its spool)."""
        if self._publisher is None:
            self._publisher = KafkaPublisher(self.config)
        return self._publisher

    @property
    def subscriber(self) -> KafkaSubscriber:
        """The consumer role (a member of the config's group)."""
        if self._subscriber is None:
            self._subscriber = KafkaSubscriber(self.config)
        return self._subscriber

    # -- publishing ----------------------------------------------------------------------
    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        return self.publisher.publish(events)

    def send(self, message: Message) -> None:
        self.publisher.send(message)

    def packing(self) -> Packing | None:
        return self.publisher.packing()

    def flush(self, timeout_s: float | None = None) -> None:
        self.publisher.flush(timeout_s)

    def spool_stats(self) -> SpoolStats:
        return self._publisher.spool_stats() if self._publisher is not None else SpoolStats()

    # -- consuming -----------------------------------------------------------------------
    def listen(self, listener: RebalanceListener) -> None:
        self.subscriber.listen(listener)

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list[Message]:
        return self.subscriber.poll(max_messages, timeout_s)

    def seek(self, partition: int, offset: int) -> None:
        self.subscriber.seek(partition, offset)

    def assigned_partitions(self) -> list[int]:
        return self.subscriber.assigned_partitions()

    def caught_up(self) -> bool:
        return self.subscriber.caught_up()

    def commit_offsets(self, next_offsets: Mapping[int, int]) -> None:
        self.subscriber.commit_offsets(next_offsets)

    def lag(self, timeout_s: float = 2.0) -> dict[int, int]:
        return self.subscriber.lag(timeout_s)

    def end_offsets(self) -> dict[int, int]:
        return self.subscriber.end_offsets()

    def group_state(self) -> str:
        return self.subscriber.group_state()

    def close(self) -> None:
        """Close the roles that were built: the publisher delivers or spools what it holds first."""
        try:
            if self._publisher is not None:
                self._publisher.close()
        finally:
            if self._subscriber is not None:
                self._subscriber.close()
