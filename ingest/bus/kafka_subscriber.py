"""`KafkaSubscriber`: the consumer role on Apache Kafka, one member of a consumer group.

Kafka's committed offsets never drive positions: on every partition assignment the listener
(the sink) seeks each partition to the offset after the one stored in the Delta log, and on a
revocation it commits what it holds before another member takes the partition over. End
offsets and the group's state come from the admin role (`kafka_admin`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from trajlake.ingest.bus.base import Consumer, Message, RebalanceListener, SourcePosition
from trajlake.ingest.bus.kafka_admin import KafkaAdmin
from trajlake.ingest.bus.kafka_client import connect, redact_secrets_in_kafka_logs
from trajlake.ingest.bus.kafka_refusals import access_refused
from trajlake.ingest.config import KafkaConfig
from trajlake.schemas.errors import TrajlakeError

log = logging.getLogger(__name__)


class KafkaSubscriber(Consumer):
    """Consumes one Kafka topic as a member of the config's consumer group (it joins on its first poll)."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.topic = config.topic
        self.listener: RebalanceListener | None = None
        self._consumer: Any = None
        self._admin: KafkaAdmin | None = None
        self._unreachable = False  # the last poll failed on a retriable Kafka error
        redact_secrets_in_kafka_logs(config)

    def __repr__(self) -> str:
        return f"KafkaSubscriber({self.config.bootstrap!r}, topic={self.topic!r}, group={self.config.group_id!r})"

    def listen(self, listener: RebalanceListener) -> None:
        """Tell `listener` which partitions the group assigns, revokes or drops, as it does."""
        self.listener = listener

    def _ensure_consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = connect(self.config, self._new_consumer)
        return self._consumer

    def _new_consumer(self, bootstrap_ms: int) -> Any:
        from kafka import KafkaConsumer

        c = self.config
        consumer = KafkaConsumer(
            **c.client_kwargs(),
            bootstrap_timeout_ms=bootstrap_ms,
            group_id=c.group_id,
            group_instance_id=c.group_instance_id,
            enable_auto_commit=False,  # positions live in the Delta log
            auto_offset_reset="earliest",
            max_poll_records=c.max_poll_records,
            max_partition_fetch_bytes=c.fetch_max_bytes,
            fetch_max_bytes=max(c.fetch_max_bytes, 52_428_800),
            session_timeout_ms=int(c.session_timeout_s * 1000),
            heartbeat_interval_ms=max(500, int(c.session_timeout_s * 1000) // 4),
            max_poll_interval_ms=300_000,
            isolation_level="read_committed",
        )
        consumer.subscribe([self.topic], listener=_GroupListener(self))
        # Learn the topic's partitions before the first poll joins the group. Otherwise
        # kafka-python joins with no metadata for the topic, the leader assigns nothing, and
        # the metadata that arrives next forces a second rebalance; a metadata refresh
        # landing during that one at times left the sink polling forever with no partitions.
        if not consumer.partitions_for_topic(self.topic):
            log.warning(
                "topic %s does not exist at %s yet; the sink waits for it (create it, e.g. with "
                "create_topic, or let the brokers auto-create it)",
                self.topic,
                c.bootstrap,
            )
        return consumer

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list[Message]:
        """Up to `max_messages` messages from the assigned partitions (rebalances happen here)."""
        from kafka.errors import KafkaError

        consumer = self._ensure_consumer()
        try:
            records = consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_messages)
        except KafkaError as err:
            if (refused := access_refused(err, self.config, "consumer")) is not None:
                raise refused from None
            if isinstance(err.__cause__, TrajlakeError):  # the sink's own error, from a rebalance callback
                raise err.__cause__ from None
            if not err.retriable:
                raise
            # brokers going or coming back (a connection reset while finding the group's
            # coordinator): no messages this time; the poll's own wait, then the next poll tries again
            if not self._unreachable:
                log.warning("Kafka at %s did not answer a poll (%s); polling on", self.config.bootstrap, err)
            self._unreachable = True
            time.sleep(timeout_s)
            return []
        if self._unreachable:
            log.warning("Kafka at %s answers polls again", self.config.bootstrap)
            self._unreachable = False
        out: list[Message] = []
        for tp, batch in records.items():
            for r in batch:
                out.append(
                    Message(
                        key=r.key.decode("utf-8", "replace") if r.key is not None else None,
                        value=r.value if r.value is not None else b"",
                        headers={k: (v or b"").decode("utf-8", "replace") for k, v in (r.headers or [])},
                        position=SourcePosition(tp.topic, tp.partition, r.offset),
                        timestamp_ms=r.timestamp,
                    )
                )
        return out

    def caught_up(self) -> bool:
        """True when every assigned partition's position has reached the high watermark of its last fetch."""
        from kafka.errors import IllegalStateError

        consumer = self._consumer
        if consumer is None:
            return False
        try:
            tps = [tp for tp in consumer.assignment() if tp.topic == self.topic]
            for tp in tps:
                end = consumer.highwater(tp)
                position = consumer.position(tp, timeout_ms=0) if end is not None else None
                if position is None or position < end:
                    return False
        except IllegalStateError:  # a rebalance (on kafka-python's IO thread) just took a partition away
            return False
        return bool(tps)

    def seek(self, partition: int, offset: int) -> None:
        from kafka import TopicPartition

        self._ensure_consumer().seek(TopicPartition(self.topic, partition), offset)

    def assigned_partitions(self) -> list[int]:
        consumer = self._ensure_consumer()
        return sorted(tp.partition for tp in consumer.assignment() if tp.topic == self.topic)

    def commit_offsets(self, next_offsets: Mapping[int, int]) -> None:
        """Tell Kafka how far the sink got (advisory: lag tools read it; the sink resumes from Delta)."""
        from kafka import TopicPartition
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        if self._consumer is None or not next_offsets:
            return
        offsets = {
            TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in next_offsets.items()
        }
        try:
            self._consumer.commit_async(offsets)
        except KafkaError as err:  # advisory only; never fail a Delta commit over it
            log.debug("advisory offset commit failed: %s", err)

    def lag(self, timeout_s: float = 2.0) -> dict[int, int]:
        """Messages behind the end of each assigned partition (KafkaTimeoutError after `timeout_s`)."""
        consumer = self._ensure_consumer()
        tps = [tp for tp in consumer.assignment() if tp.topic == self.topic]
        if not tps:
            return {}
        # bounded: kafka-python waits its 30 s request timeout for a broker that is down, and the
        # sink's loop, SIGTERM included, would wait with it
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        out = {}
        for tp in tps:
            position = consumer.position(tp)
            out[tp.partition] = max(0, ends.get(tp, 0) - (position or 0))
        return out

    def end_offsets(self) -> dict[int, int]:
        """Every partition of the topic -> its last stable offset, from a fresh ListOffsets."""
        return self._ensure_admin().end_offsets()

    def group_state(self) -> str:
        """The consumer group's state and members, as the group coordinator tells them."""
        return self._ensure_admin().group_state()

    def _ensure_admin(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self.config)
        return self._admin

    def close(self) -> None:
        """Leave the group (at once, so the others take the partitions over) and release connections."""
        if self._consumer is not None:
            # leaving the group waits on the broker, which may be down
            self._consumer.close(autocommit=False, timeout_ms=5000)
            self._consumer = None
        if self._admin is not None:
            self._admin.close()
            self._admin = None


def _listener_base() -> type:
    from kafka import ConsumerRebalanceListener

    return ConsumerRebalanceListener


class _GroupListener(_listener_base()):  # type: ignore[misc]
    """kafka-python's rebalance callbacks, for this topic's partitions, to the subscriber's listener."""

    def __init__(self, subscriber: KafkaSubscriber) -> None:
        self.subscriber = subscriber

    def _partitions(self, tps: Any) -> list[int]:
        return sorted(tp.partition for tp in tps if tp.topic == self.subscriber.topic)

    def on_partitions_revoked(self, revoked: Any) -> None:
        parts = self._partitions(revoked)
        log.info("partitions revoked: %s", parts)
        if parts and self.subscriber.listener is not None:
            self.subscriber.listener.on_revoked(parts)

    def on_partitions_lost(self, lost: Any) -> None:
        # evicted (e.g. stalled past the session timeout): others own these partitions now, so
        # buffered work must be dropped, not committed
        parts = self._partitions(lost)
        log.warning("partitions lost (this consumer was evicted from the group): %s", parts)
        if parts and self.subscriber.listener is not None:
            self.subscriber.listener.on_lost(parts)

    def on_partitions_assigned(self, assigned: Any) -> None:
        parts = self._partitions(assigned)
        log.info("partitions assigned: %s", parts)
        if parts and self.subscriber.listener is not None:
            self.subscriber.listener.on_assigned(parts)
