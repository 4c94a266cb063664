"""SASL settings reach a real broker: the right credentials deliver, wrong ones fail loudly (never delivered, never printed)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from kafka.errors import KafkaError, SaslAuthenticationFailedError

from trajlake.ingest.broker import BrokerConfig, free_port, start_broker, stop_broker
from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory):
    config = BrokerConfig(
        port=free_port(),
        sasl_port=free_port(),
        data_dir=tmp_path_factory.mktemp("sasl-broker"),
        sasl_users={"alice": "alice-secret-pw"},
    )
    start_broker(config)
    yield config
    stop_broker(config.data_dir)
    assert "alice-secret-pw" not in repr(config)


def sasl_config(broker: BrokerConfig, password: str, tmp_path: Path) -> KafkaConfig:
    return KafkaConfig(
        bootstrap=f"127.0.0.1:{broker.sasl_port}",
        topic="secured",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="alice",
        sasl_password=password,
        spool_dir=tmp_path / "spool",
        max_block_s=5,
    )


def test_the_right_credentials_deliver_through_a_sasl_listener(
    sasl_broker: BrokerConfig, tmp_path: Path
) -> None:
    config = sasl_config(sasl_broker, "alice-secret-pw", tmp_path)
    bus, consumer = KafkaPublisher(config), KafkaSubscriber(config)
    try:
        bus.send(Message("k", b'{"hello": 1}', {"content-type": "application/json"}))
        bus.flush(timeout_s=30)
        assert bus.sent_total == 1 and bus.spooled() == 0
        (message,) = _consume_one(consumer)
        assert message.value == b'{"hello": 1}'
    finally:
        bus.close()
        consumer.close()


def _consume_one(bus: KafkaSubscriber) -> list[Message]:
    for _ in range(100):
        got = bus.poll(10, 0.5)
        if got:
            return got
    return []


def test_wrong_credentials_deliver_nothing_and_are_never_printed(
    sasl_broker: BrokerConfig, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    config = sasl_config(sasl_broker, "not-the-password", tmp_path).model_copy(update={"topic": "refused"})
    bus = KafkaPublisher(config)
    try:
        # the broker refuses the handshake: kafka-python reports it as an authentication
        # error or, when the broker drops the socket first, as a timeout the publisher diagnoses;
        # raised either way, and the message waits in the spool for a producer with the right password
        try:
            bus.send(Message("k", b"{}", {"content-type": "application/json"}))
        except KafkaError as err:
            assert isinstance(err, SaslAuthenticationFailedError), err
            assert "not-the-password" not in str(err) and "user 'alice'" in str(err)
            assert bus.spooled() == 1
        try:
            bus.flush(timeout_s=2)
        except KafkaError as err:
            # the broker dropped the socket before answering, so the first attempt looked like an
            # outage and the message was spooled; the retry met the refusal and raised it
            assert isinstance(err, SaslAuthenticationFailedError), err
            assert "not-the-password" not in str(err)
        assert bus.sent_total == 0
    finally:
        bus.close()
    assert "not-the-password" not in caplog.text
