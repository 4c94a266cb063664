"""Kafka settings: SASL/SSL pass through to kafka-python, secrets are never printed, errors say the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from trajlake.ingest.bus import setup_bus
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.bus.kafka import KafkaBus
from trajlake.ingest.config import KafkaConfig


def test_sasl_and_ssl_settings_reach_kafka_python(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = KafkaConfig(
        bootstrap="b1:9093,b2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="sink",
        sasl_password="hunter2-secret",
        ssl_cafile=ca,
    )
    kwargs = config.client_kwargs()
    assert kwargs["bootstrap_servers"] == ["b1:9093", "b2:9093"]
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert kwargs["sasl_plain_username"] == "sink"
    assert kwargs["sasl_plain_password"] == "hunter2-secret"
    assert kwargs["ssl_cafile"] == str(ca)


def test_secrets_are_never_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJLAKE_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("TRAJLAKE_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("TRAJLAKE_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("TRAJLAKE_KAFKA_SASL_PASSWORD", "hunter2-secret")
    config = KafkaConfig.from_env(bootstrap="127.0.0.1:1")
    bus = setup_bus("kafka", bootstrap="127.0.0.1:1", topic="t")
    for text in (repr(config), str(config), config.model_dump_json(), repr(bus), repr(bus.config)):  # type: ignore[attr-defined]
        assert "hunter2" not in text
    assert config.sasl_password is not None and config.sasl_password.get_secret_value() == "hunter2-secret"


def test_incomplete_security_settings_name_the_fix() -> None:
    with pytest.raises(ValidationError, match="TRAJLAKE_KAFKA_SASL_PASSWORD"):
        KafkaConfig(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u")
    with pytest.raises(ValidationError, match="needs sasl_mechanism"):
        KafkaConfig(security_protocol="SASL_PLAINTEXT")
    with pytest.raises(ValidationError, match="does not exist"):
        KafkaConfig(security_protocol="SSL", ssl_cafile=Path("/nonexistent/ca.pem"))
    with pytest.raises(ValidationError):
        KafkaConfig(unknown_option=1)  # type: ignore[call-arg]


def test_a_producer_batch_larger_than_a_message_names_the_fix() -> None:
    with pytest.raises(ValidationError, match="lower TRAJLAKE_KAFKA_BATCH_BYTES"):
        KafkaConfig(batch_bytes=2 << 20)  # kafka-python would fail at flush with "Future not done"
    assert KafkaConfig(batch_bytes=2 << 20, max_message_bytes=4 << 20).batch_bytes == 2 << 20


def test_setup_bus_builds_the_backend_named_by_its_type() -> None:
    assert isinstance(setup_bus("inprocess"), InProcessBus)
    bus = setup_bus("kafka", bootstrap="127.0.0.1:1", topic="events", wire_format="json")
    assert isinstance(bus, KafkaBus) and bus.topic == "events" and bus.config.wire_format == "json"
    with pytest.raises(ValueError, match="'inprocess' or 'kafka'"):
        setup_bus("carrier-pigeon")  # type: ignore[arg-type]


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_the_ingest_command_explains_a_missing_bootstrap() -> None:
    exe = str(Path(sys.executable).parent / "trajlake")
    proc = subprocess.run(
        [exe, "ingest", "--topic", "t"],
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert "--kafka HOST:PORT is required" in proc.stderr


def test_a_bootstrap_that_is_not_host_port_names_the_fix() -> None:
    for bad in ("localhost:abc", "localhost", "b1:9092,:9092", "host:70000"):
        with pytest.raises(ValidationError, match="is not HOST:PORT; give --kafka"):
            KafkaConfig(bootstrap=bad)
    assert (
        KafkaConfig(bootstrap="b1:9092, b2:9093,[::1]:9094").client_kwargs()["bootstrap_servers"][2]
        == "[::1]:9094"
    )
