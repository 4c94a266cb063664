"""While the broker is unreachable the producer spools to disk, then delivers; logs and metrics say so."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.kafka import sink_topic
from trajlake.ingest.broker import BrokerConfig, free_port, start_broker, stop_broker
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.metrics import SinkMetrics
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


def test_events_sent_while_the_broker_is_down_are_spooled_then_delivered(
    lake: Lake, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    config = KafkaConfig(
        bootstrap=f"127.0.0.1:{port}",
        topic="spooled",
        spool_dir=tmp_path / "spool",
        max_block_s=0.5,
        retry_interval_s=0.2,
        delivery_timeout_s=3,
    )
    caplog.set_level(logging.WARNING, logger="trajlake.ingest.bus.kafka_publisher")
    producer = KafkaPublisher(config)
    produced = generate(producer, LoadgenConfig(trajectories=40, prompt_tokens=8, output_tokens=8)).events
    assert producer.spooled() > 0
    assert list((tmp_path / "spool" / "spooled").glob("spool-*.bin"))
    assert "unreachable" in caplog.text
    stats = producer.spool_stats()
    assert stats.spooled_total >= producer.spooled() > 0
    producer.close()  # gives up for now: what is left stays on disk

    broker = BrokerConfig(port=port, data_dir=tmp_path / "broker", partitions=2)
    start_broker(broker)
    try:
        later = KafkaPublisher(config)  # a new producer takes over the spool and delivers it
        later.flush(timeout_s=60)
        assert later.spooled() == 0
        delivered = later.spool_stats().delivered_total
        assert delivered > 0
        later.close()
        assert not list((tmp_path / "spool" / "spooled").glob("spool-*.bin"))

        consumer = KafkaSubscriber(config)
        sink = DeltaSink(lake, consumer, SinkConfig(max_latency_s=0.2))
        metrics = SinkMetrics(sink, port=free_port())  # the producers of this process show on it too
        try:
            sink.run(until_idle_s=2.0, on_tick=metrics.tick)
            text = httpx.get(f"http://127.0.0.1:{metrics.port}/metrics", timeout=5).text
        finally:
            metrics.close()
            consumer.close()
    finally:
        stop_broker(broker.data_dir)
    row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    assert (row["n"], row["d"]) == (produced, produced)
    series = {
        (s.name, s.labels.get("topic")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert series[("trajlake_producer_spooled_messages_total", "spooled")] >= stats.spooled_total
    assert series[("trajlake_producer_redelivered_messages_total", "spooled")] >= delivered
    # nothing waits: the sink process has no publisher of the topic open (a consumer is no producer)
    assert series.get(("trajlake_producer_spool_waiting_messages", "spooled"), 0) == 0


def test_a_flush_waiting_on_a_broker_that_went_away_says_so_then_delivers_once_it_is_back(
    lake: Lake, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from trajlake.common.retry import wait_until
    from trajlake.common.threads import run_in_thread
    from trajlake.ingest.broker import kill_broker
    from trajlake.ingest.bus.kafka_admin import create_topic
    from trajlake.ingest.bus.kafka_publisher import OUTAGE_NOTICE_S

    broker = BrokerConfig(port=free_port(), data_dir=tmp_path / "broker", partitions=2)
    config = KafkaConfig(
        bootstrap=start_broker(broker), topic="outage", partitions=2, spool_dir=tmp_path / "spool"
    )
    small = {"trajectories": 20, "prompt_tokens": 8, "output_tokens": 8}
    try:
        create_topic(config)
        producer = KafkaPublisher(config)
        produced = generate(producer, LoadgenConfig(**small)).events
        kill_broker(broker.data_dir)
        caplog.set_level(logging.WARNING, logger="trajlake.ingest.bus.kafka_publisher")
        # packed, the second batch fits the producer's buffer: nothing blocks or spools, and
        # kafka-python retries it until the delivery timeout (120 s) with nothing said but this
        job = run_in_thread(
            lambda: generate(producer, LoadgenConfig(**small, seed=1, first_group=100)), name="producer"
        )
        said = wait_until(
            lambda: "unacknowledged after" in caplog.text, timeout_s=OUTAGE_NOTICE_S + 30, interval_s=0.1
        )
        assert said, caplog.text
        assert not job.done()  # still waiting for the broker, not given up
        start_broker(broker)
        produced += job.result(timeout=120).events
        assert producer.spooled() == 0
        producer.close()
        sink_topic(lake, config)
    finally:
        stop_broker(broker.data_dir)
    row = lake.sql("select count(*) as n, count(distinct event_id) as d from events").to_pylist()[0]
    assert (row["n"], row["d"]) == (produced, produced)
