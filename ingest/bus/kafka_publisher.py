"""`KafkaPublisher`: the producer role on Apache Kafka (kafka-python with crc32c).

Idempotent (acks=all), key = trajectory id, batch compression, oversized values split into
chunks (`trajlake.ingest.chunking`). While the brokers cannot take a message (unreachable, or
fewer in-sync replicas than min.insync.replicas), it waits in the producer's bounded buffer
and then in a disk spool (`trajlake.ingest.spool`), and is delivered once they take it again;
both are logged and counted (the producer figures of `trajlake.ingest.metrics`). A publisher
never builds a consumer.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from trajlake.common.retry import BackoffPolicy, backoff_delay, wait_until
from trajlake.ingest import chunking, codec, shutdown
from trajlake.ingest.bus.base import Message, Packing, Publisher, SpoolStats
from trajlake.ingest.bus.inprocess import group_by_trajectory
from trajlake.ingest.bus.kafka_client import (
    AuthFailureWatch,
    close_kafka_producer,
    event_bytes,
    kafka_partition_of,
    redact_secrets_in_kafka_logs,
)
from trajlake.ingest.bus.kafka_refusals import producer_refusal
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.metrics import PRODUCER_METRICS
from trajlake.ingest.spool import Spool

log = logging.getLogger(__name__)

OUTAGE_NOTICE_S = 5.0
"""How long a flush waits on unacknowledged messages before it reports the broker not answering."""


class KafkaPublisher(Publisher):
    """Publishes to one Kafka topic: an idempotent producer, with a disk spool for what it cannot deliver."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.topic = config.topic
        self._producer: Any = None
        self._spool: Spool | None = None
        self._inflight: dict[int, Message] = {}
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)
        self._inflight_bytes = 0
        self._last_retry = 0.0
        self._drain_backoff = BackoffPolicy(
            max_attempts=1, initial_backoff_s=config.retry_interval_s, max_backoff_s=30.0, jitter=0.0
        )
        self._failed_drains = 0
        self._retry_delay = config.retry_interval_s
        self._outage_since: float | None = None
        self._left = SpoolStats()  # what `close` left in the disk spool
        self.sent_total = 0
        self.chunked_total = 0
        self._partitions: list[int] | None = None  # the topic's, once packing asked for them
        self._partitions_asked_at = -float("inf")
        self._refused: BaseException | None = None  # credentials or a right the brokers refused
        redact_secrets_in_kafka_logs(config)
        PRODUCER_METRICS.watch(self)
        shutdown.hold(self, shutdown.PUBLISH)

    def __repr__(self) -> str:
        return f"KafkaPublisher({self.config.bootstrap!r}, topic={self.topic!r})"

    # -- producer ------------------------------------------------------------------------
    def _ensure_producer(self) -> Any:
        from kafka.errors import KafkaError

        if self._refused is not None:
            raise self._refused
        if self._producer is None:
            try:
                with AuthFailureWatch(self.config):
                    self._producer = self._new_producer()
            except KafkaError as err:  # unreachable (spooled by the caller), or refused: said at once
                self._raise_if_refused(err, bootstrapped=False)
                raise
        return self._producer

    def _raise_if_refused(self, err: BaseException, bootstrapped: bool = True) -> None:
        """Raise the refusal in `err` (credentials, TLS, a right), and again on every later send and
        flush: what waits in the spool stays there for a producer the brokers accept."""
        refused = producer_refusal(err, self.config, bootstrapped)
        if refused is not None:
            self._refused = refused
            raise refused from None

    def _new_producer(self) -> Any:
        from kafka import KafkaProducer

        c = self.config
        return KafkaProducer(
            **c.client_kwargs(),
            enable_idempotence=True,
            acks="all",
            compression_type=c.compression_type(),
            linger_ms=c.linger_ms,
            batch_size=c.batch_bytes,
            max_request_size=c.max_message_bytes + 64 * 1024,
            delivery_timeout_ms=int(c.delivery_timeout_s * 1000),
            request_timeout_ms=min(30_000, int(c.delivery_timeout_s * 1000) - c.linger_ms - 1),
            max_block_ms=int(c.max_block_s * 1000),
            bootstrap_timeout_ms=max(500, int(c.max_block_s * 1000)),  # unreachable: spool, retry later
        )

    def _ensure_spool(self) -> Spool:
        if self._spool is None:
            self._spool = Spool(self.config.spool_dir / self.topic, self.config.spool_max_bytes)
            if len(self._spool):
                log.warning(
                    "found %d undelivered messages in %s; delivering them first",
                    len(self._spool),
                    self._spool.directory,
                )
        return self._spool

    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Encode events (one message per trajectory, or per pack of trajectories bound for one
        partition, in the configured wire format) and send them; return messages sent."""
        groups = list(group_by_trajectory(events).items())
        if self.config.wire_format == "json":
            for key, group in groups:
                value = codec.encode_json(group)
                self.send(Message(key, value, {codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE}))
            return len(groups)
        packing = self.packing() if len(groups) > 1 else None
        packs = (
            packing.packs([k for k, _ in groups], [event_bytes(g) for _, g in groups])
            if packing is not None
            else [[i] for i in range(len(groups))]
        )
        for pack in packs:
            value = codec.encode_arrow([e for i in pack for e in groups[i][1]])
            key = groups[pack[0]][0]
            self.send(Message(key, value, {codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE}))
        return len(packs)

    def packing(self) -> Packing | None:
        """Trajectories whose keys Kafka's default partitioner puts on one partition may share a
        message (Arrow only, up to `pack_bytes`); None while the topic's partitions are unknown."""
        from kafka.errors import KafkaError

        if self.config.pack_bytes <= 0 or self.config.wire_format != "arrow":
            return None
        if self._partitions is None:
            # asking an unreachable cluster blocks up to max_block_s: at most once per retry interval
            if time.monotonic() - self._partitions_asked_at < self.config.retry_interval_s:
                return None
            self._partitions_asked_at = time.monotonic()
            try:
                partitions = self._ensure_producer().partitions_for(self.topic)
            except KafkaError:  # unreachable: one trajectory per message, as the spool takes them
                return None
            if not partitions:
                return None
            self._partitions = sorted(partitions)
        return Packing(
            kafka_partition_of(self._partitions),
            min(self.config.pack_bytes, self.config.max_message_bytes // 2),
        )

    def send(self, message: Message) -> None:
        """Send one message (split into chunks when it exceeds `max_message_bytes`)."""
        parts = chunking.split(message, self.config.max_message_bytes)
        if len(parts) > 1:
            self.chunked_total += 1
        spool = self._ensure_spool()
        self._maybe_retry_spool()
        for part in parts:
            if len(spool) or self._refused is not None:
                self._put(spool, part)  # keep order: nothing overtakes what is already waiting
            else:
                self._send_now(part)
        if self._refused is not None:  # kept in the spool, for a producer the brokers accept
            raise self._refused

    def _send_now(self, message: Message) -> None:
        from kafka.errors import KafkaError

        if not self._reserve(len(message.value)):
            self._spool_message(message, TimeoutError(f"{self._inflight_bytes} bytes unacknowledged"))
            return
        try:
            producer = self._ensure_producer()
            future = producer.send(
                self.topic,
                value=message.value,
                key=message.key.encode() if message.key is not None else None,
                headers=[(k, v.encode()) for k, v in message.headers.items()],
            )
        except KafkaError as err:  # no metadata within max_block_s: the broker is unreachable
            self._release(len(message.value))
            self._spool_message(message, err)  # refused or not, the message waits in the spool
            self._raise_if_refused(err)
            return
        token = id(message)
        with self._lock:
            self._inflight[token] = message
        future.add_callback(self._on_delivered, token)
        future.add_errback(self._on_failed, token)

    def _reserve(self, size: int) -> bool:
        """Count `size` bytes as unacknowledged, waiting up to max_block_s for room in the budget."""
        deadline = time.monotonic() + self.config.max_block_s
        with self._acked:
            while self._inflight_bytes and self._inflight_bytes + size > self.config.buffer_memory_bytes:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._acked.wait(left)
            self._inflight_bytes += size
            return True

    def _release(self, size: int) -> None:
        with self._acked:
            self._inflight_bytes -= size
            self._acked.notify_all()

    def _on_delivered(self, token: int, _metadata: Any) -> None:
        with self._acked:
            message = self._inflight.pop(token, None)
            if message is not None:
                self._inflight_bytes -= len(message.value)
            self.sent_total += 1
            self._acked.notify_all()

    def _on_failed(self, token: int, err: Exception) -> None:
        if self._refused is None:  # a refused right (on the producer's IO thread): the next call raises it
            self._refused = producer_refusal(err, self.config, bootstrapped=True)
        with self._acked:
            message = self._inflight.pop(token, None)
            if message is not None:
                self._inflight_bytes -= len(message.value)
            self._acked.notify_all()
        if message is not None:
            self._spool_message(message, err)

    def _spool_message(self, message: Message, err: Exception) -> None:
        spool = self._ensure_spool()
        if self._outage_since is None and self._refused is None:  # a refusal is raised, not waited out
            self._outage_since = time.monotonic()
            log.warning(
                "Kafka at %s unreachable (%s: %s); spooling messages to %s until it answers",
                self.config.bootstrap,
                type(err).__name__,
                err,
                spool.directory,
            )
        self._put(spool, message)

    def _put(self, spool: Spool, message: Message) -> None:
        spool.put(message)
        PRODUCER_METRICS.count_spooled(self.topic, 1)

    def _maybe_retry_spool(self, force: bool = False) -> None:
        spool = self._spool
        if spool is None or not len(spool):
            return
        if not force and time.monotonic() - self._last_retry < self._retry_delay:
            return
        delivered = self._drain_spool()
        self._last_retry = time.monotonic()
        # back off while the broker stays away, so callers are rarely blocked by retries
        self._failed_drains = 0 if delivered else self._failed_drains + 1
        self._retry_delay = backoff_delay(self._failed_drains + 1, self._drain_backoff)

    def _drain_spool(self) -> bool:
        """Deliver spooled messages in order, synchronously; stop at the first failure; True if all went."""
        from kafka.errors import KafkaError

        spool = self._spool
        assert spool is not None
        while len(spool):
            batch = spool.peek(500)
            try:
                producer = self._ensure_producer()
                futures = [
                    producer.send(
                        self.topic,
                        value=m.value,
                        key=m.key.encode() if m.key is not None else None,
                        headers=[(k, v.encode()) for k, v in m.headers.items()],
                    )
                    for m, _ in batch
                ]
                producer.flush(timeout=self.config.delivery_timeout_s)
            except KafkaError as err:
                self._raise_if_refused(err)
                return False
            delivered = []
            for (_, size), future in zip(batch, futures, strict=True):
                if not future.succeeded():
                    break
                delivered.append(size)
            spool.pop(delivered)
            self.sent_total += len(delivered)
            PRODUCER_METRICS.count_redelivered(self.topic, len(delivered))
            if len(delivered) < len(batch):
                if futures[len(delivered)].failed():
                    self._raise_if_refused(futures[len(delivered)].exception)
                return False
        if self._outage_since is not None:
            log.warning(
                "Kafka at %s reachable again; delivered %d spooled messages after %.1f s",
                self.config.bootstrap,
                spool.delivered_total,
                time.monotonic() - self._outage_since,
            )
            self._outage_since = None
        return True

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until every message is delivered (spooled ones included), or `timeout_s` passes.

        The default timeout is `delivery_timeout_s`; what is still undelivered then stays in
        the disk spool (logged), for this producer's next call or the next producer to deliver.
        """
        from kafka.errors import KafkaTimeoutError

        timeout_s = self.config.delivery_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._ensure_spool()  # also adopts what a dead producer left on disk
        if self._producer is not None:
            try:
                self._flush_producer(timeout_s)
                if self._refused is not None:  # met on the producer's IO thread
                    raise self._refused
            except KafkaTimeoutError:  # below min.insync.replicas, or no leader: `close` spools them
                with self._lock:
                    waiting = len(self._inflight)
                log.warning(
                    "%d messages still unacknowledged by Kafka at %s after %.0f s; closing spools them",
                    waiting,
                    self.config.bootstrap,
                    timeout_s,
                )
                return
        if self._spool is not None and len(self._spool) and timeout_s > 0:
            log.warning(
                "waiting up to %.0f s for Kafka at %s to take %d spooled messages (TRAJLAKE_KAFKA_DELIVERY_TIMEOUT_S)",
                timeout_s,
                self.config.bootstrap,
                len(self._spool),
            )

        def delivered() -> bool:
            if time.monotonic() < deadline:
                self._maybe_retry_spool(force=True)
            return not self.spooled()

        if not wait_until(delivered, timeout_s=timeout_s, interval_s=self.config.retry_interval_s):
            log.warning(
                "%d messages still undelivered after %.0f s; they stay in %s",
                self.spooled(),
                timeout_s,
                self._ensure_spool().directory,
            )

    def _flush_producer(self, timeout_s: float) -> None:
        """kafka-python's flush, which retries a broker that went away without a word until each
        message's delivery timeout: after `OUTAGE_NOTICE_S` of waiting it says so, once."""
        from kafka.errors import KafkaTimeoutError

        notice = min(OUTAGE_NOTICE_S, timeout_s)
        try:
            self._producer.flush(timeout=notice)
            return
        except KafkaTimeoutError:
            if timeout_s <= notice:
                raise
        with self._lock:
            waiting = len(self._inflight)
        log.warning(
            "Kafka at %s unreachable or slow: %d messages unacknowledged after %.0f s; the producer "
            "retries each until %.0f s after it was sent (TRAJLAKE_KAFKA_DELIVERY_TIMEOUT_S), then spools it",
            self.config.bootstrap,
            waiting,
            notice,
            self.config.delivery_timeout_s,
        )
        self._producer.flush(timeout=timeout_s - notice)

    def spooled(self) -> int:
        """Messages waiting in the disk spool."""
        return self.spool_stats().messages

    def spool_stats(self) -> SpoolStats:
        """The disk spool's figures; after `close`, what it left for the next producer of the topic."""
        s = self._spool  # read once: metrics scrapes call this from their own thread
        if s is None:
            return self._left
        return SpoolStats(
            s.messages, s.bytes, s.spooled_total, s.delivered_total, s.corrupt_total, s.directory
        )

    def close(self) -> None:
        """Flush what can be delivered quickly, leave the rest in the spool, and close the producer.

        A configuration error met while flushing (refused credentials) is raised after
        everything is closed; the undelivered messages stay in the spool. During a stop
        (`trajlake.ingest.shutdown`), the open trajectories of this process are published first.
        """
        shutdown.settle_upstream(shutdown.PUBLISH)
        try:
            if self._producer is not None:
                self._close_producer(timeout_s=5.0)
        finally:
            self._close_clients()

    def settle(self, deadline: float) -> str | None:
        """A stop: deliver what the producer holds by `deadline`, spool the rest (`shutdown.Holder`)."""
        if self._producer is None and not (self._spool is not None and len(self._spool)):
            return None
        sent = self.sent_total
        try:
            self._close_producer(timeout_s=max(0.5, deadline - time.monotonic()))
        finally:
            shutdown.release(self)
        line = f"Kafka topic {self.topic} at {self.config.bootstrap}: delivered {self.sent_total - sent:,} messages"
        left = self.spool_stats()
        if left.messages:
            line += (
                f"; spooled {left.messages:,} to {left.directory}: the next producer of topic {self.topic} "
                "sends them"
            )
        return line

    def _close_producer(self, timeout_s: float) -> None:
        """Flush for up to `timeout_s`, spool what is still unacknowledged, close the producer.

        A message the broker acknowledges after that is sent again by the spool's next producer;
        the copy's seqs are duplicates, which the sink sends to dead letters (nothing is lost).
        """
        from kafka.errors import KafkaTimeoutError

        with contextlib.suppress(KafkaTimeoutError):  # what is left is spooled below
            self.flush(timeout_s=timeout_s)
        with self._acked:
            left = list(self._inflight.values())
            self._inflight.clear()
            self._inflight_bytes = 0
        if left:
            spool = self._ensure_spool()
            log.warning(
                "%d messages unacknowledged by Kafka at %s after %.0f s; spooling them to %s",
                len(left),
                self.config.bootstrap,
                timeout_s,
                spool.directory,
            )
            for message in left:
                self._put(spool, message)
        producer, self._producer = self._producer, None
        if producer is not None:
            close_kafka_producer(producer, timeout_s=0 if left else 5)

    def _close_clients(self) -> None:
        PRODUCER_METRICS.unwatch(self)
        shutdown.release(self)
        if self._producer is not None:
            close_kafka_producer(self._producer, timeout_s=5)
            self._producer = None
        if self._spool is not None:
            self._left = self.spool_stats()
            if len(self._spool):
                log.warning(
                    "%d messages left undelivered in %s; the next producer delivers them",
                    len(self._spool),
                    self._spool.directory,
                )
            self._spool.close()
            self._spool = None
