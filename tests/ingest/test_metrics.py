"""One `/metrics` endpoint serves the sink's figures and the producers' (spool) figures, each under its own name."""

from __future__ import annotations

import uuid

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import started_event, turn_event
from trajlake.ingest.broker import free_port
from trajlake.ingest.bus.base import SpoolStats
from trajlake.ingest.metrics import PRODUCER_METRICS, SinkMetrics
from trajlake.ingest.sink import DeltaSink
from trajlake.rollout.workers import CollectingBus


class StalledPublisher(CollectingBus):
    """A publisher whose broker is away: `waiting` messages sit in its spool."""

    def __init__(self, topic: str, waiting: int) -> None:
        super().__init__()
        self.topic = topic
        self.waiting = waiting

    def spool_stats(self) -> SpoolStats:
        return SpoolStats(messages=self.waiting)


@pytest.fixture
def topic() -> str:
    """A topic name of this test only: producer figures are process-wide."""
    return f"metrics-{uuid.uuid4().hex[:8]}"


def scrape(metrics: SinkMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).text
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), f"a metric name is served twice: {sorted(names)}"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_the_sink_endpoint_serves_producer_spool_figures_per_topic(lake, bus, topic) -> None:
    bus.publish([started_event(trajectory_id="t"), turn_event(trajectory_id="t", seq=1)])
    sink = DeltaSink(lake, bus)
    sink.run(until_idle_s=0)
    stalled = StalledPublisher(topic, waiting=4)
    PRODUCER_METRICS.watch(stalled)
    PRODUCER_METRICS.count_spooled(topic, 7)
    PRODUCER_METRICS.count_redelivered(topic, 3)
    metrics = SinkMetrics(sink, port=free_port())
    try:
        metrics.tick(force=True)
        got = scrape(metrics)
    finally:
        metrics.close()
    by_topic = (("topic", topic),)
    assert got[("trajlake_sink_events_total", ())] == 2
    assert got[("trajlake_producer_spooled_messages_total", by_topic)] == 7
    assert got[("trajlake_producer_redelivered_messages_total", by_topic)] == 3
    assert got[("trajlake_producer_spool_waiting_messages", by_topic)] == 4
    assert all(got[("trajlake_sink_lag_messages", (("partition", str(p)),))] == 0 for p in range(4))
    # a producer process serving the default registry shows the same figures
    assert REGISTRY.get_sample_value("trajlake_producer_spooled_messages_total", {"topic": topic}) == 7


def test_a_publisher_closed_or_gone_no_longer_counts_as_waiting(topic) -> None:
    closed, gone = StalledPublisher(topic, waiting=2), StalledPublisher(topic, waiting=3)
    PRODUCER_METRICS.watch(closed)
    PRODUCER_METRICS.watch(gone)
    assert PRODUCER_METRICS.waiting()[topic] == 5
    PRODUCER_METRICS.unwatch(closed)
    del gone
    assert topic not in PRODUCER_METRICS.waiting()
