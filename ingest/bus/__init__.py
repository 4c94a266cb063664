"""Buses: how events travel from a `Publisher` to the sink's `Consumer`.

The backend is chosen by `BusConfig.type`, and one factory per role builds it: `setup_publisher`
(a producer process: on Kafka it never builds a consumer), `setup_consumer` (a sink) and
`setup_bus` (both, in one process: the embedded default).
"""

from __future__ import annotations

from typing import Any, Literal

from trajlake.ingest.bus.base import (
    Bus,
    Consumer,
    Message,
    Publisher,
    RebalanceListener,
    SourcePosition,
    SpoolStats,
)
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.config import BusConfig

__all__ = [
    "Bus",
    "BusConfig",
    "Consumer",
    "InProcessBus",
    "Message",
    "Publisher",
    "RebalanceListener",
    "SourcePosition",
    "SpoolStats",
    "setup_bus",
    "setup_consumer",
    "setup_publisher",
]

Kind = Literal["inprocess", "kafka"]


def bus_config(kind: Kind = "inprocess", *, bootstrap: str | None = None, topic: str | None = None,
               **options: Any) -> BusConfig:  # fmt: skip
    """A `BusConfig` of `type` `kind`; Kafka settings not given come from TRAJLAKE_KAFKA_* env vars
    (see `KafkaConfig`), `options` are further `KafkaConfig` fields (group_id, wire_format, sasl_*, …)."""
    if kind == "inprocess":
        return BusConfig(type="inprocess", topic=topic, partitions=options.pop("partitions", None))
    if kind == "kafka":
        from trajlake.ingest.config import KafkaConfig

        return BusConfig(
            type="kafka", kafka=KafkaConfig.from_env(bootstrap=bootstrap, topic=topic, **options)
        )
    raise ValueError(f"unknown bus type {kind!r}; use 'inprocess' or 'kafka'")


def setup_publisher(kind: Kind = "inprocess", **settings: Any) -> Publisher:
    """A publisher of bus type `kind` (see `bus_config` for `settings`)."""
    config = bus_config(kind, **settings)
    if config.kafka is not None:
        from trajlake.ingest.bus.kafka_publisher import KafkaPublisher

        return KafkaPublisher(config.kafka)
    return _inprocess(config)


def setup_consumer(kind: Kind = "inprocess", **settings: Any) -> Consumer:
    """A consumer (one sink's) of bus type `kind` (see `bus_config` for `settings`)."""
    config = bus_config(kind, **settings)
    if config.kafka is not None:
        from trajlake.ingest.bus.kafka_subscriber import KafkaSubscriber

        return KafkaSubscriber(config.kafka)
    return _inprocess(config)


def setup_bus(kind: Kind = "inprocess", **settings: Any) -> Bus:
    """Both roles of bus type `kind` in one object: "inprocess" (embedded default) or "kafka"
    (needs `bootstrap`, HOST:PORT); see `bus_config` for `settings`."""
    config = bus_config(kind, **settings)
    if config.kafka is not None:
        from trajlake.ingest.bus.kafka import KafkaBus

        return KafkaBus(config.kafka)
    return _inprocess(config)


def _inprocess(config: BusConfig) -> InProcessBus:
    return InProcessBus(
        topic=config.topic, **({"partitions": config.partitions} if config.partitions else {})
    )
