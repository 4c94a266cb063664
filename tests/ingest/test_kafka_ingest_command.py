"""`trajlake ingest`: Prometheus metrics and a progress log line while it runs; SIGTERM commits and exits 0."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.fixtures.kafka import wait_for_log
from tests.helpers import wait_until
from trajlake.ingest import codec
from trajlake.ingest.broker import BrokerConfig, free_port, start_broker, stop_broker
from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.kafka import KafkaBus, create_topic
from trajlake.ingest.config import KafkaConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    assert values, f"{name} not in /metrics"
    return values[0]


def test_ingest_serves_metrics_logs_progress_and_commits_on_sigterm(
    kafka_topic: KafkaConfig, trajlake_cli, tmp_path: Path
) -> None:
    producer = KafkaBus(kafka_topic)
    produced = generate(producer, LoadgenConfig(trajectories=40, prompt_tokens=8, output_tokens=8)).events
    producer.send(Message("bad", b"garbage", {codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE}))
    producer.close()

    port = free_port()
    lake_dir = tmp_path / "lake"
    sink = trajlake_cli(
        "ingest", "--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic, "--group", kafka_topic.group_id,
        "--lake", str(lake_dir), "--metrics-port", str(port), "--metrics-host", "127.0.0.2",
        "--log-interval", "0.5", "--max-latency", "0.2",
    )  # fmt: skip
    wait_for_log(sink, "partitions assigned")
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=5).text
        if metric(text, "trajlake_sink_events_total") >= produced or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert metric(text, "trajlake_sink_events_total") == produced
    assert metric(text, "trajlake_sink_dead_letters_total") == 1
    assert metric(text, "trajlake_sink_commits_total") >= 1
    wait_for_log(sink, "lag 0 messages")  # the periodic log line reports lag once it was refreshed
    text = httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=5).text
    assert 'trajlake_sink_lag_messages{partition="0"} 0.0' in text
    with pytest.raises(httpx.ConnectError):  # served on --metrics-host only
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)

    sink.send_signal(signal.SIGTERM)
    out, _ = sink.communicate(timeout=60)
    assert sink.returncode == 0
    totals = json.loads(out.strip().splitlines()[-1])
    assert totals["events"] == produced and totals["dead_letters"] == 1
    log = sink.log_path.read_text()
    assert "received SIGTERM" in log and "1 dead letters" in log
    lake = Lake(lake_dir)
    try:
        assert lake.sql("select count(*) as n from events").to_pylist()[0]["n"] == produced
    finally:
        lake.close()


def test_sigterm_while_the_broker_is_down_commits_and_exits_promptly(trajlake_cli, tmp_path: Path) -> None:
    broker = BrokerConfig(port=free_port(), data_dir=tmp_path / "broker", partitions=4)
    start_broker(broker)
    config = KafkaConfig(
        bootstrap=f"127.0.0.1:{broker.port}", topic="outage", group_id="outage", spool_dir=tmp_path / "spool"
    )
    create_topic(config)
    producer = KafkaBus(config)
    produced = generate(producer, LoadgenConfig(trajectories=20, prompt_tokens=8, output_tokens=8)).events
    producer.close()
    lake_dir = tmp_path / "lake"
    sink = trajlake_cli(
        "ingest", "--kafka", config.bootstrap, "--topic", config.topic, "--group", config.group_id,
        "--lake", str(lake_dir), "--log-interval", "0.5", "--max-latency", "0.2",
    )  # fmt: skip
    try:
        wait_for_log(sink, f"totals: {produced} events")
    finally:
        stop_broker(broker.data_dir)
    # two more log lines: the second one's lag refresh surely met the stopped broker
    logged = sink.log_path.read_text(errors="replace").count("totals: ")
    wait_until(
        lambda: sink.log_path.read_text(errors="replace").count("totals: ") >= logged + 2, 60, "lag refreshes"
    )
    stopped_at = time.monotonic()
    sink.send_signal(signal.SIGTERM)
    out, _ = sink.communicate(timeout=60)
    # before, each lag refresh waited kafka-python's 30 s request timeout, then leaving the group did
    assert time.monotonic() - stopped_at < 15
    assert sink.returncode == 0 and json.loads(out.strip().splitlines()[-1])["events"] == produced
    lake = Lake(lake_dir)
    try:
        assert lake.sql("select count(*) as n from events").to_pylist()[0]["n"] == produced
    finally:
        lake.close()
