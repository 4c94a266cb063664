"""The `Bus` interface: how events travel from producers to the sink.

A message carries one or more events of one trajectory, encoded by `trajlake.ingest.codec`;
its key is the trajectory id, so a trajectory stays ordered on one partition. Every
message the sink sees has a `SourcePosition`, which is what exactly-once is built on.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajlake.schemas.errors import TrajlakeError


class BusUnreachable(TrajlakeError, ConnectionError):
    """The bus's brokers could not be reached in time; the message says how to fix it."""


@dataclass(frozen=True)
class SourcePosition:
    """Where a message came from: topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    @property
    def app_id(self) -> str:
        """The Delta `txn` app id that stores this partition's committed offset."""
        return f"trajlake-sink:{self.topic}:{self.partition}"

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass
class Message:
    """One message on the bus: raw bytes plus headers, as the wire carries them."""

    key: str | None
    value: bytes
    headers: dict[str, str] = field(default_factory=dict)
    position: SourcePosition | None = None
    timestamp_ms: int | None = None


class Bus(abc.ABC):
    """Publishes events and hands messages to a consumer, with their positions."""

    topic: str

    @abc.abstractmethod
    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Encode `events` (one message per trajectory) and send them; return messages sent."""

    @abc.abstractmethod
    def send(self, message: Message) -> None:
        """Send one already-encoded message (used for raw JSON and for tests of bad input)."""

    @abc.abstractmethod
    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list[Message]:
        """Return up to `max_messages` messages, waiting at most `timeout_s` for the first."""

    @abc.abstractmethod
    def seek(self, partition: int, offset: int) -> None:
        """Continue consuming `partition` at `offset` (the sink resumes from the Delta log)."""

    @abc.abstractmethod
    def assigned_partitions(self) -> list[int]:
        """Partitions this consumer currently reads."""

    def caught_up(self) -> bool:
        """True when the last poll left nothing known to be waiting (False when the bus can't tell)."""
        return False

    def flush(self, timeout_s: float | None = None) -> None:  # noqa: B027 - optional hook
        """Block until published messages are delivered (no-op where delivery is immediate)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and threads."""

    def __enter__(self) -> Bus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
