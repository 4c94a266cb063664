"""The bus interfaces by role: a `Publisher` sends events, a `Consumer` hands them to the sink.

A message carries one or more events of one trajectory, encoded by `trajlake.ingest.codec`;
its key is the trajectory id, so a trajectory stays ordered on one partition. A publisher
that hands over many trajectories at once may pack those bound for the same partition into
one message (`Packing`), keyed by the first of them: still one partition per trajectory. Every
message the sink sees has a `SourcePosition`, which is what exactly-once is built on.
A backend implements each role it plays: `InProcessBus` both (`Bus`); on Kafka,
`KafkaPublisher` publishes, `KafkaSubscriber` consumes and `KafkaAdmin` answers the rest
(`KafkaBus` composes the first two for a process that does both); a worker's `CollectingBus`
only publishes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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


@dataclass(frozen=True)
class SpoolStats:
    """What a publisher holds back while its bus is unreachable (all zero where it never does)."""

    messages: int = 0  # waiting now (after `close`: left for the next publisher of the topic)
    bytes: int = 0
    spooled_total: int = 0
    delivered_total: int = 0
    corrupt_total: int = 0  # torn or corrupt spool records found (and logged) when taking files over
    directory: Path | None = None  # where the waiting messages are kept


@dataclass(frozen=True)
class Packing:
    """How a publisher packs trajectories into messages: those whose keys land on one partition
    share a message of up to `max_bytes` (Arrow bytes); a key mapped to None travels alone."""

    partition_of: Callable[[str | None], int | None]
    max_bytes: int

    def packs(self, keys: Sequence[str | None], sizes: Sequence[int]) -> list[list[int]]:
        """Indices of the messages `keys` (with their sizes) grouped into packs, in order of their
        first member; each partition's messages keep their order across its packs."""
        out: list[list[int]] = []
        open_: dict[int, tuple[list[int], int]] = {}  # partition -> (its open pack, its bytes)
        for i, (key, size) in enumerate(zip(keys, sizes, strict=True)):
            partition = self.partition_of(key)
            if partition is None:
                out.append([i])
                continue
            pack, used = open_.get(partition, (None, 0))
            if pack is None or used + size > self.max_bytes:
                pack, used = [], 0
                out.append(pack)
            pack.append(i)
            open_[partition] = (pack, used + size)
        return out


@runtime_checkable
class Publisher(Protocol):
    """Sends events to a topic."""

    topic: str

    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        """Encode `events` (one message per trajectory) and send them; return messages sent."""
        ...

    def send(self, message: Message) -> None:
        """Send one already-encoded message (raw JSON, pre-encoded Arrow, tests of bad input)."""
        ...

    def packing(self) -> Packing | None:
        """How trajectories may share messages on this bus; None: one trajectory per message."""
        return None

    def flush(self, timeout_s: float | None = None) -> None:
        """Block until published messages are delivered (returns at once where delivery is immediate)."""
        ...

    def spool_stats(self) -> SpoolStats:
        """Messages held back for later delivery: `messages` > 0 after `close` means undelivered."""
        ...

    def close(self) -> None:
        """Deliver what can be delivered quickly and release connections."""
        ...


class RebalanceListener(Protocol):
    """Told which partitions a consumer group moves to or away from one consumer (the sink is one)."""

    def on_assigned(self, partitions: list[int]) -> None:
        """`partitions` are this consumer's now: continue each from the position the lake holds."""
        ...

    def on_revoked(self, partitions: list[int]) -> None:
        """`partitions` go to another consumer: commit what was read of them while still their owner."""
        ...

    def on_lost(self, partitions: list[int]) -> None:
        """The group dropped this consumer (it stalled): others own `partitions`; drop what was read."""
        ...


@runtime_checkable
class Consumer(Protocol):
    """Hands messages of a topic to one sink, with their positions.

    Where consumers form a group (Kafka), partitions move between them and the consumer tells
    its `RebalanceListener` (`listen`). A consumer without a group owns every partition for
    good and tells it nothing.
    """

    topic: str

    def listen(self, listener: RebalanceListener) -> None:
        """Tell `listener` of every partition assignment, revocation or loss from now on."""
        ...

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list[Message]:
        """Return up to `max_messages` messages, waiting at most `timeout_s` for the first."""
        ...

    def seek(self, partition: int, offset: int) -> None:
        """Continue consuming `partition` at `offset` (the sink resumes from the Delta log)."""
        ...

    def assigned_partitions(self) -> list[int]:
        """Partitions this consumer currently reads."""
        ...

    def caught_up(self) -> bool:
        """True when the last poll left nothing known to be waiting (False when it can't tell)."""
        ...

    def commit_offsets(self, next_offsets: Mapping[int, int]) -> None:
        """Tell the bus how far the sink committed, per partition (advisory: for lag tools only)."""
        ...

    def lag(self, timeout_s: float = 2.0) -> dict[int, int]:
        """Messages behind the end of each assigned partition."""
        ...

    def end_offsets(self) -> dict[int, int]:
        """Every partition of the topic, assigned here or not -> its end offset, asked afresh (the
        last stable offset: what a read_committed consumer can reach)."""
        ...

    def group_state(self) -> str:
        """The consumer group's state and members, in words (for a drain that cannot finish)."""
        ...

    def close(self) -> None:
        """Leave the group (if any) and release connections."""
        ...


@runtime_checkable
class Bus(Publisher, Consumer, Protocol):
    """Both roles over one topic: what `setup_bus` builds (a process that publishes and sinks)."""
