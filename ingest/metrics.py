"""Metrics: a Prometheus endpoint and a periodic log line (lag, throughput, dead letters, spool).

Sink figures are read from the sink's running totals at scrape time; consumer lag is refreshed
by the sink's own loop (`SinkMetrics.tick`), because the Kafka consumer is not thread-safe.
Producer figures (`PRODUCER_METRICS`) are process-wide, per topic: the sink's `/metrics` serves
them, and so does the default Prometheus registry, for a producer process with its own exporter.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.ingest.bus.base import Publisher
    from trajlake.ingest.sink import DeltaSink

log = logging.getLogger(__name__)


class ProducerMetrics:
    """Spool figures of every publisher in this process, per topic: counted as they happen, read at scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spooled: dict[str, int] = {}
        self.redelivered: dict[str, int] = {}
        self._publishers: weakref.WeakSet[Publisher] = weakref.WeakSet()

    def watch(self, publisher: Publisher) -> None:
        """Include `publisher`'s waiting messages in the gauges until it is closed or gone."""
        with self._lock:
            self._publishers.add(publisher)

    def unwatch(self, publisher: Publisher) -> None:
        """Stop counting `publisher` (closed: what it left waits for the next producer of the topic)."""
        with self._lock:
            self._publishers.discard(publisher)

    def count_spooled(self, topic: str, n: int) -> None:
        """`n` messages of `topic` went to the disk spool."""
        with self._lock:
            self.spooled[topic] = self.spooled.get(topic, 0) + n

    def count_redelivered(self, topic: str, n: int) -> None:
        """`n` spooled messages of `topic` reached the bus."""
        with self._lock:
            self.redelivered[topic] = self.redelivered.get(topic, 0) + n

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """(spooled, redelivered) messages ever, per topic."""
        with self._lock:
            return dict(self.spooled), dict(self.redelivered)

    def waiting(self) -> dict[str, int]:
        """Messages waiting in the spools of open publishers, per topic."""
        with self._lock:
            publishers = list(self._publishers)
        out: dict[str, int] = {}
        for publisher in publishers:
            out[publisher.topic] = out.get(publisher.topic, 0) + publisher.spool_stats().messages
        return out


PRODUCER_METRICS = ProducerMetrics()


class SinkMetrics:
    """Serves a `DeltaSink`'s totals, its consumer's lag and the producer figures; logs a summary every `log_interval_s`."""

    def __init__(
        self, sink: DeltaSink, port: int | None = None, host: str = "127.0.0.1", log_interval_s: float = 10.0
    ) -> None:
        self.sink = sink
        self.log_interval_s = log_interval_s
        self.lag: dict[int, int] = {}
        self.started = time.monotonic()
        self._last_log = self.started
        self._last_counts = (0, 0, 0)
        self.rates = {"messages": 0.0, "events": 0.0, "bytes": 0.0}
        self.server: Any = None
        self.port: int | None = None
        if port is not None:
            self._serve(host, port)

    def _serve(self, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=True)
        registry.register(_SinkCollector(self))
        registry.register(_ProducerCollector(PRODUCER_METRICS))
        self.server, _thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self.server.server_port)
        log.info("sink metrics on http://%s:%d/metrics", host, self.port)

    def tick(self, force: bool = False) -> None:
        """Refresh lag and rates and log a line, at most every `log_interval_s` (or now if `force`)."""
        now = time.monotonic()
        if not force and now - self._last_log < self.log_interval_s:
            return
        stats = self.sink.stats
        counts = (stats.messages, stats.events, stats.bytes)
        elapsed = max(now - self._last_log, 1e-9)
        self.rates = {
            name: (c - p) / elapsed
            for name, c, p in zip(("messages", "events", "bytes"), counts, self._last_counts, strict=True)
        }
        self._last_counts = counts
        self._last_log = now
        try:
            self.lag = self.sink.bus.lag()
        except Exception as err:  # a broker that is down: keep the last figures, the loop goes on
            log.debug("could not read consumer lag: %s", err)
        log.info(self.summary())

    def summary(self) -> str:
        """One line: throughput, lag, commits, dead letters, spool."""
        s = self.sink.stats
        spooled = sum(PRODUCER_METRICS.waiting().values())
        return (
            f"sink: {self.rates['events']:.0f} events/s, {self.rates['bytes'] / 1e6:.2f} MB/s; "
            f"lag {sum(self.lag.values())} messages on {len(self.lag)} partitions; "
            f"totals: {s.events} events, {s.messages} messages, {s.commits} commits, "
            f"{s.dead_letters} dead letters; spooled {spooled}"
        )

    def close(self) -> None:
        """Stop the HTTP endpoint."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _SinkCollector:
    """Reads the sink's totals when Prometheus scrapes."""

    def __init__(self, metrics: SinkMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.metrics
        s = m.sink.stats
        for name, value, text in (
            ("trajlake_sink_messages", s.messages, "Messages consumed"),
            ("trajlake_sink_events", s.events, "Events committed to the events table"),
            ("trajlake_sink_dead_letters", s.dead_letters, "Messages or events committed to dead_letters"),
            ("trajlake_sink_commits", s.commits, "Delta commits of the events table"),
            ("trajlake_sink_bytes", s.bytes, "Message bytes consumed"),
        ):
            yield CounterMetricFamily(name, text, value=value)
        lag = GaugeMetricFamily(
            "trajlake_sink_lag_messages", "Messages behind the end of the partition", labels=["partition"]
        )
        for partition, value in sorted(m.lag.items()):
            lag.add_metric([str(partition)], value)
        yield lag
        for name, value in m.rates.items():
            yield GaugeMetricFamily(
                f"trajlake_sink_{name}_per_second", f"Recent {name} per second", value=value
            )
        if s.last_commit_at is not None:
            yield GaugeMetricFamily(
                "trajlake_sink_last_commit_timestamp_seconds",
                "Time of the last commit",
                value=s.last_commit_at,
            )


class _ProducerCollector:
    """Reads the process's producer figures when Prometheus scrapes (one series per topic)."""

    def __init__(self, producers: ProducerMetrics) -> None:
        self.producers = producers

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        spooled, redelivered = self.producers.totals()
        for family, values in (
            (
                CounterMetricFamily(
                    "trajlake_producer_spooled_messages",
                    "Messages spooled to disk while Kafka was unreachable",
                    labels=["topic"],
                ),
                spooled,
            ),
            (
                CounterMetricFamily(
                    "trajlake_producer_redelivered_messages",
                    "Spooled messages delivered later",
                    labels=["topic"],
                ),
                redelivered,
            ),
            (
                GaugeMetricFamily(
                    "trajlake_producer_spool_waiting_messages",
                    "Messages waiting in the disk spools of open producers",
                    labels=["topic"],
                ),
                self.producers.waiting(),
            ),
        ):
            for topic, value in sorted(values.items()):
                family.add_metric([topic], value)
            yield family


try:  # a producer process that serves the default registry (prometheus_client.start_http_server) shows them
    from prometheus_client import REGISTRY
except ImportError:  # pragma: no cover - prometheus-client is in the kafka extra
    pass
else:
    REGISTRY.register(_ProducerCollector(PRODUCER_METRICS))
