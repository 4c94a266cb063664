"""The `trajlake ingest` process: a Kafka consumer-group sink with metrics and graceful shutdown."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from trajlake.ingest.bus.kafka_admin import KafkaAdmin
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.metrics import SinkMetrics
from trajlake.ingest.sink import DRAIN_TIMEOUT_S, DeltaSink, SinkConfig, SinkStats
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
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
) -> SinkStats:
    """Consume `kafka.topic` into the lake until SIGTERM/SIGINT, `stop_event`, or, with `until_idle_s`,
    until the lake holds the topic's end (`DrainIncomplete` if it cannot get there)."""
    stop = stop_event or threading.Event()
    restore = _on_signals(stop) if threading.current_thread() is threading.main_thread() else {}
    with KafkaAdmin(kafka) as admin:  # created here, replicated as the cluster allows, never auto-created
        admin.create_topic()
    lake = Lake(lake_root)
    bus = KafkaSubscriber(kafka)
    metrics: SinkMetrics | None = None
    try:
        delta_sink = DeltaSink(lake, bus, sink)
        metrics = SinkMetrics(delta_sink, port=metrics_port, host=metrics_host, log_interval_s=log_interval_s)
        log.info(
            "ingesting %s from %s into %s (group %s)", kafka.topic, kafka.bootstrap, lake.root, kafka.group_id
        )
        delta_sink.run(
            until_idle_s=until_idle_s, stop_event=stop, on_tick=metrics.tick, drain_timeout_s=drain_timeout_s
        )
        metrics.tick(force=True)
        return delta_sink.stats
    finally:
        if metrics is not None:
            metrics.close()
        bus.close()  # leaves the group at once, so the other sinks take the partitions over
        lake.close()
        for sig, handler in restore.items():
            signal.signal(sig, handler)


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    def handle(signum: int, _frame: Any) -> None:
        log.info("received %s; committing and stopping", signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
