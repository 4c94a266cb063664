"""`trajlake kafka up/down`: a real Apache Kafka 4.x broker (KRaft) from Maven Central, no Docker."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trajlake.ingest.broker import free_port

pytestmark = pytest.mark.integration


def trajlake(*args: str) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).parent / "trajlake")
    return subprocess.run([exe, *args], capture_output=True, text=True, check=False, timeout=300)


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_kafka_up_starts_a_broker_that_serves_clients_and_down_stops_it(tmp_path: Path) -> None:
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
    from trajlake.ingest.config import KafkaConfig

    port, data = free_port(), tmp_path / "broker"
    up = trajlake("kafka", "up", "--port", str(port), "--data-dir", str(data))
    assert up.returncode == 0, up.stderr
    try:
        assert up.stdout.strip() == f"127.0.0.1:{port}"
        node = data / "node-1"
        assert (node / "broker.pid").exists() and (node / "kraft-logs" / "meta.properties").exists()
        assert "Kafka Server started" in (node / "server.log").read_text()  # the broker logs (SLF4J bound)
        again = trajlake("kafka", "up", "--port", str(port), "--data-dir", str(data))
        assert again.returncode == 0 and again.stdout.strip() == f"127.0.0.1:{port}"  # already running

        config = KafkaConfig(bootstrap=f"127.0.0.1:{port}", topic="hello", spool_dir=tmp_path / "spool")
        bus = KafkaPublisher(config)
        from trajlake.ingest.bus.base import Message

        bus.send(Message("k", b"{}", {"content-type": "application/json"}))
        bus.flush(timeout_s=30)
        assert bus.sent_total == 1 and bus.spooled() == 0
        bus.close()
    finally:
        down = trajlake("kafka", "down", "--data-dir", str(data))
    assert down.returncode == 0 and down.stdout.strip() == "stopped"
    assert not answers(port)
    assert trajlake("kafka", "down", "--data-dir", str(data)).stdout.startswith("no broker running")


def test_kafka_up_on_a_busy_port_says_so(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = trajlake("kafka", "up", "--port", str(port), "--data-dir", str(tmp_path / "b"))
    assert result.returncode == 2
    assert "already in use; pass --port" in result.stderr
