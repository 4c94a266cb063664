"""Buses: how events travel from a `Publisher` to the sink's `Consumer`. Built by `setup_bus` from a `type`."""

from __future__ import annotations

from typing import Any, Literal

from trajlake.ingest.bus.base import Bus, Consumer, Message, Publisher, SourcePosition, SpoolStats
from trajlake.ingest.bus.inprocess import InProcessBus

__all__ = [
    "Bus",
    "Consumer",
    "InProcessBus",
    "Message",
    "Publisher",
    "SourcePosition",
    "SpoolStats",
    "setup_bus",
]


def setup_bus(
    kind: Literal["inprocess", "kafka"] = "inprocess",
    *,
    bootstrap: str | None = None,
    topic: str | None = None,
    **options: Any,
) -> Bus:
    """A bus of `kind`: "inprocess" (embedded default) or "kafka" (needs `bootstrap`, HOST:PORT).

    Kafka options not given here come from TRAJLAKE_KAFKA_* env vars (see `KafkaConfig`);
    `options` are further `KafkaConfig` fields (group_id, wire_format, sasl_*, …).
    """
    if kind == "inprocess":
        return InProcessBus(topic=topic, **options)
    if kind == "kafka":
        from trajlake.ingest.bus.kafka import KafkaBus
        from trajlake.ingest.config import KafkaConfig

        config = KafkaConfig.from_env(bootstrap=bootstrap, topic=topic, **options)
        return KafkaBus(config)
    raise ValueError(f"unknown bus type {kind!r}; use 'inprocess' or 'kafka'")
