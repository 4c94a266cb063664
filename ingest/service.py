"""The `trajlake ingest` process: a Kafka consumer-group sink with metrics and graceful shutdown."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from trajlake.ingest.bus.kafka import KafkaBus
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.metrics import SinkMetrics
from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkStats
from trajlake.store.lake import Lake

log = logging.getLogger(__name__)


def run_ingest(
    lake_root: str,
    kafka: KafkaConfig,
    sink: SinkConfig | None = None,
    until_idle_s: float | None = None,
    metrics_port: int | None = None,
    log_interval_s: float = 10.0,
    metrics_host: str = "127.0.0.1",
    stop_event: threading.Event | None = None,
) -> SinkStats:
    """Consume `kafka.topic` into the lake until SIGTERM/SIGINT, `stop_event`, or `until_idle_s` of quiet."""
    stop = stop_event or threading.Event()
    restore = _on_signals(stop) if threading.current_thread() is threading.main_thread() else {}
    lake = Lake(lake_root)
    bus = KafkaBus(kafka)
    metrics: SinkMetrics | None = None
    try:
        delta_sink = DeltaSink(lake, bus, sink)
        metrics = SinkMetrics(delta_sink, port=metrics_port, host=metrics_host, log_interval_s=log_interval_s)
        log.info(
            "ingesting %s from %s into %s (group %s)", kafka.topic, kafka.bootstrap, lake.root, kafka.group_id
        )
        _loop(delta_sink, metrics, stop, until_idle_s)
        metrics.tick(force=True)
        return delta_sink.stats
    finally:
        if metrics is not None:
            metrics.close()
        bus.close()  # leaves the group at once, so the other sinks take the partitions over
        lake.close()
        for sig, handler in restore.items():
            signal.signal(sig, handler)


def _loop(sink: DeltaSink, metrics: SinkMetrics, stop: threading.Event, until_idle_s: float | None) -> None:
    import time

    idle_since = time.monotonic()
    assigned = sink.bus.on_assigned if hasattr(sink.bus, "on_assigned") else None
    if assigned is not None:

        def on_assigned(partitions: list[int]) -> None:
            nonlocal idle_since
            idle_since = time.monotonic()  # waiting for the group to hand out partitions is not idleness
            assigned(partitions)

        sink.bus.on_assigned = on_assigned
    while not stop.is_set():
        if sink.poll_once():
            idle_since = time.monotonic()
        if sink.should_flush():
            sink.flush(wait=False)  # the commit runs while the loop goes on consuming
            idle_since = time.monotonic()  # a long commit is not time without messages
        metrics.tick()
        if until_idle_s is not None and time.monotonic() - idle_since >= until_idle_s:
            log.info("no message for %.1f s; stopping", until_idle_s)
            break
    sink.flush()  # what was consumed before the stop is committed, with its offsets


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    def handle(signum: int, _frame: Any) -> None:
        log.info("received %s; committing and stopping", signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
