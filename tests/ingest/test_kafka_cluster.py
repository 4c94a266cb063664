"""A replicated cluster as the normal case: `trajlake kafka up --nodes 3`, topics replicated as the
cluster allows, brokers that log, and a node down told apart from a cluster that is unreachable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.kafka import KafkaCluster
from trajlake.ingest.broker import free_port

pytestmark = pytest.mark.integration


def trajlake(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    exe = str(Path(sys.executable).parent / "trajlake")
    return subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_kafka_up_with_three_nodes_prints_the_bootstrap_list_and_every_node_logs(
    kafka_cluster: KafkaCluster,
) -> None:
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin
    from trajlake.ingest.config import KafkaConfig

    port = kafka_cluster.config.port
    assert kafka_cluster.printed == f"127.0.0.1:{port},127.0.0.1:{port + 1},127.0.0.1:{port + 2}"
    with KafkaAdmin(KafkaConfig(bootstrap=kafka_cluster.bootstrap)) as admin:
        assert admin.brokers() == [1, 2, 3]  # readiness waited for all three
    for node in (1, 2, 3):
        node_dir = kafka_cluster.config.data_dir / f"node-{node}"
        assert f"127.0.0.1:{port + node - 1}" in (node_dir / "server.properties").read_text()
        assert (
            f"[KafkaRaftServer nodeId={node}] Kafka Server started" in (node_dir / "server.log").read_text()
        )
    again = trajlake("kafka", "up", "--nodes", "3", "--data-dir", str(kafka_cluster.config.data_dir))
    assert again.returncode == 0 and again.stdout.strip() == kafka_cluster.printed  # already running
    other = trajlake("kafka", "up", "--data-dir", str(kafka_cluster.config.data_dir))
    assert other.returncode == 2 and "holds a 3-node cluster; pass --nodes 3" in other.stderr


def test_topics_are_replicated_three_times_with_two_in_sync_by_default(kafka_cluster: KafkaCluster) -> None:
    from kafka.errors import UnknownTopicOrPartitionError

    from trajlake.common.retry import retrying
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin
    from trajlake.ingest.config import KafkaConfig

    made = trajlake("kafka", "topic", "create", "--kafka", kafka_cluster.bootstrap, "--topic", "replicated")
    assert made.returncode == 0, made.stderr
    answer = json.loads(made.stdout)
    assert answer | {"health": None} == {
        "topic": "replicated", "created": True, "partitions": 4, "replication_factor": 3,
        "min_insync_replicas": 2, "brokers": [1, 2, 3], "health": None,
    }  # fmt: skip
    again = json.loads(trajlake("kafka", "topic", "create", "--kafka", kafka_cluster.bootstrap,
                                "--topic", "replicated").stdout)  # fmt: skip
    assert again["created"] is False and again["replication_factor"] == 3

    asked = trajlake(
        "kafka", "topic", "create", "--kafka", kafka_cluster.bootstrap, "--topic", "narrow",
        "--partitions", "2", "--replication-factor", "2", "--min-insync-replicas", "1",
    )  # fmt: skip
    assert json.loads(asked.stdout) | {"health": None, "brokers": None} == {
        "topic": "narrow", "created": True, "partitions": 2, "replication_factor": 2,
        "min_insync_replicas": 1, "brokers": None, "health": None,
    }  # fmt: skip

    too_many = trajlake("kafka", "topic", "create", "--kafka", kafka_cluster.bootstrap, "--topic", "x",
                        "--replication-factor", "4")  # fmt: skip
    assert too_many.returncode == 2
    assert "replication_factor 4 exceeds the 3 broker(s) of the cluster" in too_many.stderr

    # the consumer groups' internal topic too: asking for a group's coordinator creates it
    config = KafkaConfig(bootstrap=kafka_cluster.bootstrap, topic="replicated", group_id="any")
    with KafkaAdmin(config) as admin:

        def offsets_topic() -> dict:
            admin.group_state()
            return admin.topic("__consumer_offsets")

        for attempt in retrying(retry_on=UnknownTopicOrPartitionError, attempts=60, wait=1.0):
            with attempt:
                offsets = offsets_topic()
    assert {len(p["replica_nodes"]) for p in offsets["partitions"]} == {3}


def test_an_unreachable_cluster_is_named_as_such() -> None:
    port = free_port()
    result = trajlake(
        "kafka", "topic", "create", "--kafka", f"127.0.0.1:{port}", "--topic", "t",
        env={"TRAJLAKE_KAFKA_CONNECT_TIMEOUT_S": "2"},
    )  # fmt: skip
    assert result.returncode == 2
    assert f"no Kafka broker answered at 127.0.0.1:{port} within 2 s" in result.stderr
