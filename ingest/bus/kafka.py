"""`KafkaBus`: the scale-out bus on Apache Kafka (kafka-python with crc32c).

Producer: idempotent (acks=all), key = trajectory id, batch compression, oversized values
split into chunks (`trajlake.ingest.chunking`). While the broker is unreachable, messages
wait in the producer's bounded buffer and then in a disk spool (`trajlake.ingest.spool`)
and are delivered once it answers again; both are logged and counted (the producer figures of
`trajlake.ingest.metrics`, served on the sink's `/metrics` and in the default Prometheus registry).

Consumer: a consumer group without Kafka offset commits driving positions: on every
partition assignment the sink's `on_assigned` callback seeks each partition to the offset
after the one stored in the Delta log, and `on_revoked` lets the sink commit what it holds
before another sink takes the partition over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from trajlake.ingest import chunking, codec
from trajlake.ingest.bus.base import (
    Bus,
    BusUnreachable,
    Message,
    Packing,
    PartitionCallback,
    SourcePosition,
    SpoolStats,
)
from trajlake.ingest.bus.inprocess import group_by_trajectory
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.metrics import PRODUCER_METRICS
from trajlake.ingest.spool import Spool
from trajlake.schemas.retry import BackoffPolicy, backoff_delay, wait_until

log = logging.getLogger(__name__)

OUTAGE_NOTICE_S = 5.0
"""How long a flush waits on unacknowledged messages before it reports the broker not answering."""


class KafkaBus(Bus):
    """Publishes to and consumes from one Kafka topic (a consumer group member once it polls)."""

    def __init__(self, config: KafkaConfig) -> None:
        self.config = config
        self.topic = config.topic
        self._producer: Any = None
        self._consumer: Any = None
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
        self.on_assigned: PartitionCallback | None = None
        self.on_revoked: PartitionCallback | None = None
        self.on_lost: PartitionCallback | None = None
        self.sent_total = 0
        self.chunked_total = 0
        self._partitions: list[int] | None = None  # the topic's, once packing asked for them
        self._partitions_asked_at = -float("inf")
        _redact_secrets_in_kafka_logs(config)
        PRODUCER_METRICS.watch(self)

    def __repr__(self) -> str:
        return f"KafkaBus({self.config.bootstrap!r}, topic={self.topic!r})"

    # -- producer ------------------------------------------------------------------------
    def _ensure_producer(self) -> Any:
        if self._producer is None:
            with _AuthFailureWatch(self.config):
                self._producer = self._new_producer()
        return self._producer

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
            packing.packs([k for k, _ in groups], [_event_bytes(g) for _, g in groups])
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
            if len(spool):
                self._put(spool, part)  # keep order: nothing overtakes what is already waiting
            else:
                self._send_now(part)

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
            _raise_if_misconfigured(err)
            self._release(len(message.value))
            self._spool_message(message, err)
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
        with self._acked:
            message = self._inflight.pop(token, None)
            if message is not None:
                self._inflight_bytes -= len(message.value)
            self._acked.notify_all()
        if message is not None:
            self._spool_message(message, err)

    def _spool_message(self, message: Message, err: Exception) -> None:
        spool = self._ensure_spool()
        if self._outage_since is None:
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
                _raise_if_misconfigured(err)
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
        timeout_s = self.config.delivery_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        self._ensure_spool()  # also adopts what a dead producer left on disk
        if self._producer is not None:
            self._flush_producer(timeout_s)
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

    # -- consumer ------------------------------------------------------------------------
    def _ensure_consumer(self) -> Any:
        if self._consumer is None:
            with bootstrapping(self.config):
                self._consumer = self._new_consumer()
        return self._consumer

    def _new_consumer(self) -> Any:
        from kafka import KafkaConsumer

        c = self.config
        consumer = KafkaConsumer(
            **c.client_kwargs(),
            bootstrap_timeout_ms=int(c.connect_timeout_s * 1000),
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
        consumer.subscribe([self.topic], listener=_Listener(self))
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
        consumer = self._ensure_consumer()
        records = consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_messages)
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

    def close(self) -> None:
        """Flush what can be delivered quickly, leave the rest in the spool, and close clients.

        A configuration error met while flushing (refused credentials) is raised after
        everything is closed; the undelivered messages stay in the spool.
        """
        try:
            if self._producer is not None:
                self.flush(timeout_s=5.0)
        finally:
            self._close_clients()

    def _close_clients(self) -> None:
        PRODUCER_METRICS.unwatch(self)
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None
        if self._consumer is not None:
            # leaving the group waits on the broker, which may be down
            self._consumer.close(autocommit=False, timeout_ms=5000)
            self._consumer = None
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


def kafka_partition_of(partitions: Sequence[int]) -> Callable[[str | None], int | None]:
    """The partition Kafka's default partitioner (murmur2 of the key, as the Java client) gives a
    key, among `partitions`; None for no key (those go to a random partition)."""
    from kafka.partitioner.default import murmur2

    ordered = sorted(partitions)

    def partition_of(key: str | None) -> int | None:
        if key is None:
            return None
        return ordered[(murmur2(key.encode()) & 0x7FFFFFFF) % len(ordered)]

    return partition_of


def _event_bytes(events: Sequence[Mapping[str, Any]]) -> int:
    """About the Arrow bytes of event dicts: 4 per token id and logprob, 200 per event besides."""
    size = 0
    for e in events:
        size += 200
        for name in ("input_token_ids", "output_token_ids", "output_logprobs"):
            value = e.get(name)
            if value is not None:
                size += 4 * len(value)
    return size


class _Redact(logging.Filter):
    """Masks secrets in log records (kafka-python logs SASL handshakes, password included, at DEBUG)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, "**********")
            record.msg, record.args = message, None
        return True


_REDACT = _Redact()


def _redact_secrets_in_kafka_logs(config: KafkaConfig) -> None:
    import kafka  # noqa: F401 - its modules create their loggers on import

    secrets = [s.get_secret_value() for s in (config.sasl_password, config.ssl_password) if s is not None]
    if not secrets:
        return
    _REDACT.secrets.update(secrets)
    for name in list(logging.root.manager.loggerDict):
        if name == "kafka" or name.startswith("kafka."):
            logger = logging.getLogger(name)
            if _REDACT not in logger.filters:
                logger.addFilter(_REDACT)


class _AuthFailureWatch(logging.Handler):
    """Turns a bootstrap that timed out because the broker refused our credentials into that error.

    kafka-python retries a failed SASL handshake until its bootstrap timeout and then reports
    only a timeout, which would look like an outage and be spooled for ever.
    """

    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(logging.WARNING)
        self.config = config
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if "SaslAuthenticationFailedError" in record.getMessage():
            self.failed = True

    def __enter__(self) -> _AuthFailureWatch:
        logging.getLogger("kafka").addHandler(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        logging.getLogger("kafka").removeHandler(self)
        if exc is not None and self.failed:
            from kafka.errors import SaslAuthenticationFailedError

            raise SaslAuthenticationFailedError(
                f"the brokers at {self.config.bootstrap} refused SASL {self.config.sasl_mechanism} credentials "
                f"of user {self.config.sasl_username!r}; check TRAJLAKE_KAFKA_SASL_USERNAME / TRAJLAKE_KAFKA_SASL_PASSWORD"
            ) from None


@contextmanager
def bootstrapping(config: KafkaConfig) -> Iterator[None]:
    """Around a kafka-python consumer's or admin's bootstrap: refused credentials, and a cluster that
    never answered or stopped answering mid-way, become errors that name the fix, not bare timeouts."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, RequestTimedOutError

    with _AuthFailureWatch(config):
        try:
            yield
        except KafkaTimeoutError as err:  # kafka-python 3: "Unable to bootstrap from [...]"
            raise BusUnreachable(
                f"no Kafka broker answered at {config.bootstrap} within {config.connect_timeout_s:g} s; "
                "start one with `trajlake kafka up` or point --kafka (TRAJLAKE_KAFKA) at a running cluster "
                "(TRAJLAKE_KAFKA_CONNECT_TIMEOUT_S waits longer)"
            ) from err
        except (RequestTimedOutError, KafkaConnectionError) as err:
            # bootstrapped, then the broker died or hung before the topic's metadata came back
            raise BusUnreachable(
                f"the Kafka broker at {config.bootstrap} stopped answering while connecting ({err}); "
                "check that it is up (`trajlake kafka up` for a local one) and run the command again"
            ) from err


def _raise_if_misconfigured(err: Exception) -> None:
    """A configuration or credentials error is the caller's to fix, not an outage to spool through."""
    from kafka import errors

    fatal = (
        errors.KafkaConfigurationError,
        errors.SaslAuthenticationFailedError,
        errors.UnsupportedSaslMechanismError,
        errors.AuthorizationError,
    )
    if isinstance(err, fatal):
        raise err


def _listener_base() -> type:
    from kafka import ConsumerRebalanceListener

    return ConsumerRebalanceListener


class _Listener(_listener_base()):  # type: ignore[misc]
    """Routes rebalance events of the consumer group to the sink's callbacks."""

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus

    def on_partitions_revoked(self, revoked: Any) -> None:
        parts = sorted(tp.partition for tp in revoked if tp.topic == self.bus.topic)
        log.info("partitions revoked: %s", parts)
        if parts and self.bus.on_revoked is not None:
            self.bus.on_revoked(parts)

    def on_partitions_lost(self, lost: Any) -> None:
        # evicted (e.g. stalled past the session timeout): others own these partitions now, so
        # buffered work must be dropped, not committed
        parts = sorted(tp.partition for tp in lost if tp.topic == self.bus.topic)
        log.warning("partitions lost (this consumer was evicted from the group): %s", parts)
        if parts and self.bus.on_lost is not None:
            self.bus.on_lost(parts)

    def on_partitions_assigned(self, assigned: Any) -> None:
        parts = sorted(tp.partition for tp in assigned if tp.topic == self.bus.topic)
        log.info("partitions assigned: %s", parts)
        if parts and self.bus.on_assigned is not None:
            self.bus.on_assigned(parts)


def create_topic(config: KafkaConfig, topic: str | None = None, partitions: int | None = None) -> None:
    """Create `topic` (default: the config's) if it does not exist, and wait until it has leaders."""
    from kafka import KafkaAdminClient
    from kafka.errors import TopicAlreadyExistsError

    with bootstrapping(config):
        admin = KafkaAdminClient(
            **config.client_kwargs(), bootstrap_timeout_ms=int(config.connect_timeout_s * 1000)
        )
    try:
        admin.create_topics(
            {
                topic or config.topic: {
                    "num_partitions": partitions or config.partitions,
                    "replication_factor": -1,
                }
            },
            wait_for_metadata=True,
        )
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()
