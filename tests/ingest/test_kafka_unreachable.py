"""No broker at the address: the sink, the topic helper and the CLI say so and how to fix it, no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from tests.helpers import clean_env, trajlake
from trajlake.ingest.broker import free_port
from trajlake.ingest.bus.base import BusUnreachable
from trajlake.ingest.bus.kafka import KafkaBus, create_topic
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.sink import DeltaSink
from trajlake.store.lake import Lake

# Kafka clients against closed or hung ports, a real broker, and CLI processes that take seconds each
pytestmark = pytest.mark.integration


@pytest.fixture
def nowhere(tmp_path: Path) -> KafkaConfig:
    """A config whose bootstrap address has nothing listening."""
    return KafkaConfig(
        bootstrap=f"127.0.0.1:{free_port()}", topic="t", spool_dir=tmp_path / "spool", connect_timeout_s=1
    )


def test_a_sink_without_a_broker_fails_naming_the_address_and_the_fix(
    nowhere: KafkaConfig, tmp_path: Path
) -> None:
    bus = KafkaBus(nowhere)
    with pytest.raises(BusUnreachable) as err:
        DeltaSink(Lake(tmp_path / "lake"), bus)
    message = str(err.value)
    assert nowhere.bootstrap in message and "within 1 s" in message
    assert "trajlake kafka up" in message and "TRAJLAKE_KAFKA_CONNECT_TIMEOUT_S" in message
    bus.close()


def test_a_broker_that_stops_answering_right_after_bootstrap_is_unreachable_too(
    kafka_topic: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a broker that hangs (SIGSTOP) right after the bootstrap makes the sink's metadata request
    # raise this error after kafka-python's request timeout (10 s, seen by hand); here at once
    from kafka import KafkaConsumer
    from kafka.errors import RequestTimedOutError

    def hung(self: KafkaConsumer, topic: str) -> set[int]:
        raise RequestTimedOutError("Request timed out after 9999 ms")

    monkeypatch.setattr(KafkaConsumer, "partitions_for_topic", hung)
    bus = KafkaBus(kafka_topic)
    with pytest.raises(BusUnreachable) as err:
        DeltaSink(Lake(tmp_path / "lake"), bus)
    assert f"the Kafka broker at {kafka_topic.bootstrap} stopped answering" in str(err.value)
    assert "Request timed out" in str(err.value) and "trajlake kafka up" in str(err.value)
    bus.close()


def test_creating_a_topic_without_a_broker_fails_the_same_way(nowhere: KafkaConfig) -> None:
    with pytest.raises(BusUnreachable, match=f"no Kafka broker answered at {nowhere.bootstrap}"):
        create_topic(nowhere)


def trajlake_without_broker(tmp_path: Path, *args: str, **kafka: str) -> subprocess.CompletedProcess[str]:
    """Run `trajlake ARGS…` with a clean environment plus TRAJLAKE_KAFKA_<NAME> settings `kafka`."""
    env = {f"TRAJLAKE_KAFKA_{k.upper()}": v for k, v in kafka.items()}
    env["TRAJLAKE_KAFKA_SPOOL_DIR"] = str(tmp_path / "spool")
    return trajlake(*args, env=clean_env(tmp_path, **env), check=False)


@pytest.mark.parametrize(
    "command",
    [
        ["ingest", "--topic", "t", "--until-idle", "1"],
        ["demo", "--steps", "5"],
    ],
)
def test_cli_without_a_broker_is_an_error_not_a_traceback(command: list[str], tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    out = trajlake_without_broker(
        tmp_path, *command, "--kafka", bootstrap, "--lake", str(tmp_path), connect_timeout_s="1"
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"trajlake {command[0]}: error: no Kafka broker answered at {bootstrap} within 1 s" in out.stderr
    assert "Traceback" not in out.stderr


def test_loadgen_without_a_broker_keeps_its_messages_in_the_spool_and_says_so(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    out = trajlake_without_broker(
        tmp_path, "loadgen", "--kafka", bootstrap, "--topic", "waiting", "--trajectories", "3", "--json",
        max_block_s="0.5", delivery_timeout_s="2",
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result["undelivered_messages"] > 0
    assert (
        f"{result['undelivered_messages']} messages did not reach Kafka at {bootstrap} "
        "(no broker answers: the cluster is unreachable)"
    ) in out.stderr
    spool = tmp_path / "spool" / "waiting"
    assert str(spool) in out.stderr and list(spool.glob("spool-*.bin"))
    assert "waiting up to 2 s" in out.stderr and "Traceback" not in out.stderr


def test_ingest_refuses_a_bad_bootstrap_or_a_busy_metrics_port_before_connecting(tmp_path: Path) -> None:
    out = trajlake_without_broker(tmp_path, "ingest", "--kafka", "localhost:abc", "--lake", str(tmp_path))
    assert out.returncode == 2 and "'localhost:abc' is not HOST:PORT" in out.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        bootstrap = f"127.0.0.1:{free_port()}"
        out = trajlake_without_broker(
            tmp_path, "ingest", "--kafka", bootstrap, "--lake", str(tmp_path), "--metrics-port", str(port)
        )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port} (Address already in use)" in out.stderr
    assert "no Kafka broker answered" not in out.stderr  # refused before waiting for the broker


def test_ingest_takes_its_cluster_from_trajlake_kafka_bootstrap(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    out = trajlake_without_broker(
        tmp_path, "ingest", "--lake", str(tmp_path), bootstrap=bootstrap, connect_timeout_s="1"
    )
    assert out.returncode == 2 and f"no Kafka broker answered at {bootstrap}" in out.stderr
    out = trajlake_without_broker(tmp_path, "ingest", "--lake", str(tmp_path))
    assert out.returncode == 2 and "set TRAJLAKE_KAFKA or TRAJLAKE_KAFKA_BOOTSTRAP" in out.stderr


def test_loadgen_that_fills_the_spool_stops_with_an_error_naming_the_limit(tmp_path: Path) -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    out = trajlake_without_broker(
        tmp_path, "loadgen", "--kafka", bootstrap, "--topic", "full", "--trajectories", "200",
        max_block_s="0.5", spool_max_bytes=str(1 << 20),
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "trajlake loadgen: error: the spool in" in out.stderr
    assert "(limit 1048576)" in out.stderr and "TRAJLAKE_KAFKA_SPOOL_MAX_BYTES" in out.stderr


def test_ingest_names_each_bad_setting_and_where_to_set_it(tmp_path: Path) -> None:
    out = trajlake_without_broker(
        tmp_path,
        "ingest",
        "--kafka",
        "127.0.0.1:9",
        "--max-rows",
        "0",
        "--lake",
        str(tmp_path),
        linger_ms="-5",
    )
    assert out.returncode == 2 and "validation error for" not in out.stderr
    assert (
        "linger_ms: Input should be greater than or equal to 0 (got '-5'); set TRAJLAKE_KAFKA_LINGER_MS"
        in out.stderr
    )
    out = trajlake_without_broker(
        tmp_path, "ingest", "--kafka", "127.0.0.1:9", "--max-rows", "0", "--lake", str(tmp_path)
    )
    assert (
        "max_rows: Input should be greater than or equal to 1 (got 0); set --max-rows or TRAJLAKE_MAX_ROWS"
        in out.stderr
    )
