"""Sink metrics: a Prometheus endpoint and a periodic log line (lag, throughput, dead letters).

Figures are read from the sink's running totals at scrape time; consumer lag is refreshed
by the sink's own loop (`SinkMetrics.tick`), because the Kafka consumer is not thread-safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


class SinkMetrics:
    """Exposes a `DeltaSink`'s totals and its bus's lag; logs a summary every `log_interval_s`."""

    def __init__(
        self, sink: Any, port: int | None = None, host: str = "127.0.0.1", log_interval_s: float = 10.0
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
        registry.register(_Collector(self))
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
        lag_of = getattr(self.sink.bus, "lag", None)
        if lag_of is not None:
            try:
                self.lag = lag_of()
            except Exception as err:
                log.debug("could not read consumer lag: %s", err)
        log.info(self.summary())

    def summary(self) -> str:
        """One line: throughput, lag, commits, dead letters, spool."""
        s = self.sink.stats
        spool = self._spool()
        return (
            f"sink: {self.rates['events']:.0f} events/s, {self.rates['bytes'] / 1e6:.2f} MB/s; "
            f"lag {sum(self.lag.values())} messages on {len(self.lag)} partitions; "
            f"totals: {s.events} events, {s.messages} messages, {s.commits} commits, "
            f"{s.dead_letters} dead letters; spooled {spool.get('messages', 0)}"
        )

    def _spool(self) -> dict[str, int]:
        stats = getattr(self.sink.bus, "spool_stats", None)
        return stats() if stats is not None else {}

    def close(self) -> None:
        """Stop the HTTP endpoint."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Collector:
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
        spool = m._spool()
        if spool:
            yield GaugeMetricFamily(
                "trajlake_producer_spooled_messages",
                "Messages waiting in the disk spool",
                value=spool["messages"],
            )
            yield CounterMetricFamily(
                "trajlake_producer_spooled", "Messages ever spooled", value=spool["spooled_total"]
            )
