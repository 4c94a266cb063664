"""Buses by role: the in-process and Kafka buses are publishers and consumers, a worker's bus only publishes."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import turn_event
from trajlake.ingest import codec
from trajlake.ingest.bus import setup_bus, setup_consumer, setup_publisher
from trajlake.ingest.bus.base import Bus, Consumer, Packing, Publisher, SpoolStats
from trajlake.ingest.bus.inprocess import InProcessBus, partition_for
from trajlake.ingest.config import KafkaConfig
from trajlake.ingest.sink import DeltaSink
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.rollout.workers import CollectingBus


def kafka_settings(tmp_path: Path) -> dict:
    """Settings of a Kafka bus that never connects (its clients start on first use)."""
    return {"bootstrap": "127.0.0.1:9", "topic": "roles", "spool_dir": tmp_path / "spool"}


class Listener:
    """A `RebalanceListener` that notes what it is told."""

    def __init__(self) -> None:
        self.told: list[tuple[str, list[int]]] = []

    def on_assigned(self, partitions: list[int]) -> None:
        self.told.append(("assigned", partitions))

    def on_revoked(self, partitions: list[int]) -> None:
        self.told.append(("revoked", partitions))

    def on_lost(self, partitions: list[int]) -> None:
        self.told.append(("lost", partitions))


@pytest.mark.parametrize("kind", ["inprocess", "kafka"])
def test_both_bus_types_publish_and_consume_and_a_listener_hears_nothing_before_a_group_acts(
    kind: str, tmp_path: Path
) -> None:
    bus = setup_bus(kind, **(kafka_settings(tmp_path) if kind == "kafka" else {}))  # type: ignore[arg-type]
    listener = Listener()
    try:
        assert isinstance(bus, Publisher) and isinstance(bus, Consumer) and isinstance(bus, Bus)
        assert bus.spool_stats() == SpoolStats()  # nothing held back before anything was sent
        bus.listen(listener)
        assert listener.told == []
    finally:
        bus.close()


def test_a_kafka_publisher_is_only_a_publisher_and_a_subscriber_only_a_consumer(tmp_path: Path) -> None:
    """A producer process never builds a consumer (nor a consumer-capable object), a sink no producer."""
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
    from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber

    publisher = setup_publisher("kafka", **kafka_settings(tmp_path))
    consumer = setup_consumer("kafka", **kafka_settings(tmp_path))
    assert type(publisher) is KafkaPublisher and not isinstance(publisher, Consumer)
    assert type(consumer) is KafkaSubscriber and not isinstance(consumer, Publisher)
    assert type(setup_publisher("inprocess")) is InProcessBus  # the embedded bus plays both roles
    publisher.close()
    consumer.close()


def test_a_workers_collecting_bus_only_publishes_and_raises_nothing_for_what_it_cannot_do() -> None:
    bus = CollectingBus()
    assert isinstance(bus, Publisher) and not isinstance(bus, Consumer)
    for name, method in inspect.getmembers(CollectingBus, inspect.isfunction):
        assert "NotImplementedError" not in inspect.getsource(method), name
    bus.flush()
    assert bus.spool_stats() == SpoolStats()


def test_encoded_messages_sent_to_a_collecting_bus_reach_the_lake_once_published(lake, bus, drain) -> None:
    """loadgen sends pre-encoded Arrow messages; a worker's bus keeps their events for the driver."""
    collected = CollectingBus()
    produced = generate(collected, LoadgenConfig(trajectories=3, prompt_tokens=4, output_tokens=4)).events
    assert len(collected.events) == produced
    bus.publish(collected.events)
    drain()
    assert lake.sql("select count(*) as n from events").to_pylist()[0]["n"] == produced
    assert not lake.exists("dead_letters")


def test_the_in_process_bus_reports_lag_per_partition_and_a_sink_takes_it_to_zero(lake) -> None:
    bus = setup_bus("inprocess", partitions=2)
    bus.publish([turn_event(trajectory_id=f"t{i}") for i in range(6)])  # one message per trajectory
    assert sum(bus.lag().values()) == 6 and set(bus.lag()) == {0, 1}
    DeltaSink(lake, bus).poll_once()
    assert bus.lag() == {0: 0, 1: 0}


ROLES = """
from trajlake.ingest.bus.base import Bus, Consumer, Publisher
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.bus.kafka import KafkaBus
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber
from trajlake.ingest.config import KafkaConfig
from trajlake.rollout.workers import CollectingBus


def roles(config: KafkaConfig) -> None:
    buses: list[Bus] = [InProcessBus(), KafkaBus(config)]
    publishers: list[Publisher] = [CollectingBus(), KafkaPublisher(config)]
    consumers: list[Consumer] = [KafkaSubscriber(config)]
    consumer: Consumer = CollectingBus()  # the one line mypy must refuse
"""


@pytest.mark.integration  # runs mypy: seconds
def test_mypy_agrees_which_bus_plays_which_role(tmp_path: Path) -> None:
    """Statically: every method of each role is there, with its signature (isinstance checks names only)."""
    pytest.importorskip("mypy")
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "pkgs").mkdir()
    (tmp_path / "pkgs" / "trajlake").symlink_to(root)  # the repository root is the package
    (tmp_path / "roles.py").write_text(ROLES)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(root / "pyproject.toml"), "--follow-imports=silent",
         "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "roles.py")],
        capture_output=True, text=True, env={**os.environ, "MYPYPATH": str(tmp_path / "pkgs")}, timeout=300,
    )  # fmt: skip
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "roles.py:15:" in errors[0] and '"Consumer"' in errors[0], out.stdout


class _PackingBus(InProcessBus):
    """The in-process bus packing as `KafkaPublisher` does, by its own (crc32) partitions."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__()
        self.max_bytes = max_bytes

    def packing(self) -> Packing | None:
        return Packing(lambda key: partition_for(key, self.partitions), self.max_bytes)


def test_packs_keep_each_partitions_order_and_their_size() -> None:
    packing = Packing(lambda key: None if key is None else int(key) % 2, max_bytes=10)
    keys = ["0", "1", "2", None, "4", "3", "6"]
    packs = packing.packs(keys, [4, 4, 4, 4, 4, 4, 4])
    assert packs == [[0, 2], [1, 5], [3], [4, 6]]  # partition 0 in order: 0, 2 | 4, 6; no key alone


def test_packed_loadgen_messages_keep_trajectories_on_their_partition_and_reach_the_lake_once(
    lake, tmp_path: Path
) -> None:
    bus = _PackingBus(max_bytes=64 * 1024)
    counts = generate(bus, LoadgenConfig(trajectories=40, prompt_tokens=64, output_tokens=64, seed=3))
    assert counts.messages < counts.trajectories  # several trajectories share a message
    for partition, log in enumerate(bus._logs):
        for message in log:
            table, _ = codec.decode(message.value, message.headers)
            keys = {
                t or r
                for t, r in zip(table["trajectory_id"].to_pylist(), table["run_id"].to_pylist(), strict=True)
            }
            assert {partition_for(k, bus.partitions) for k in keys} == {partition}
    DeltaSink(lake, bus).run(until_idle_s=0)
    assert lake.sql("select count(*) as n from events").to_pylist()[0]["n"] == counts.events
    assert lake.sql("select count(distinct trajectory_id) as n from events").to_pylist()[0]["n"] == 40
    assert not lake.exists("dead_letters")


def test_kafka_publish_packs_trajectories_of_one_partition_and_json_stays_one_per_message(
    tmp_path: Path,
) -> None:
    from trajlake.ingest.bus.kafka_client import kafka_partition_of
    from trajlake.ingest.bus.kafka_publisher import KafkaPublisher

    partition_of = kafka_partition_of([0, 1, 2, 3])
    events = [turn_event(trajectory_id=f"t{i}", seq=s) for i in range(12) for s in range(2)]
    partitions = {partition_of(f"t{i}") for i in range(12)}
    for wire_format, expected in (("arrow", len(partitions)), ("json", 12)):
        config = KafkaConfig(
            bootstrap="127.0.0.1:9", topic="packs", spool_dir=tmp_path / "spool", wire_format=wire_format,
            pack_bytes=256 * 1024,
        )  # fmt: skip
        bus = KafkaPublisher(config)
        bus._partitions = [0, 1, 2, 3]  # as the producer's metadata would tell; nothing connects
        sent: list = []
        bus.send = sent.append  # type: ignore[method-assign]
        assert bus.publish(events) == len(sent) == expected
        for message in sent:
            table, _ = codec.decode(message.value, message.headers)
            rows = list(zip(table["trajectory_id"].to_pylist(), table["seq"].to_pylist(), strict=True))
            assert {partition_of(t) for t, _ in rows} == {partition_of(message.key)}
            assert rows == sorted(rows, key=lambda r: (rows.index((r[0], 0)), r[1]))  # each in seq order
        assert sum(codec.decode(m.value, m.headers)[0].num_rows for m in sent) == len(events)
        bus.close()


class _FailingConsumer:
    """A kafka-python consumer whose polls raise `errors` in turn, then return nothing."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)

    def poll(self, timeout_ms: int, max_records: int) -> dict:
        if self.errors:
            raise self.errors.pop(0)
        return {}


def test_a_sinks_poll_rides_out_brokers_that_reset_its_connection_and_raises_what_will_not_pass(
    tmp_path: Path,
) -> None:
    """A sink died of `KafkaConnectionError: Connection reset by peer` out of `poll` (finding its
    group's coordinator while two of three nodes came back) and its partitions were never read again."""
    from kafka.errors import AuthorizationError, KafkaConnectionError, TopicAuthorizationFailedError

    from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber

    subscriber = KafkaSubscriber(KafkaConfig(bootstrap="127.0.0.1:9", topic="t", spool_dir=tmp_path))
    subscriber._consumer = _FailingConsumer(KafkaConnectionError("[Errno 104] Connection reset by peer"))
    assert subscriber.poll(timeout_s=0.01) == [] and subscriber.poll(timeout_s=0.01) == []
    subscriber._consumer = _FailingConsumer(TopicAuthorizationFailedError("t"))
    # not a passing fault: the sink says which right its principal lacks, and stops
    with pytest.raises(AuthorizationError, match="lacks READ on topic t"):
        subscriber.poll(timeout_s=0.01)
