"""The embedded default bus: partitioned in-memory queues with offsets, in one process."""

from __future__ import annotations

import threading
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from trajlake.ingest import codec, shutdown
from trajlake.ingest.bus.base import Bus, Message, RebalanceListener, SourcePosition, SpoolStats


def partition_for(key: str | None, partitions: int) -> int:
    """Stable partition of a key (crc32), so a trajectory stays on one partition."""
    return zlib.crc32((key or "").encode()) % partitions


def group_by_trajectory(events: Sequence[Mapping[str, Any]]) -> dict[str | None, list[Mapping[str, Any]]]:
    """Events split by message key (trajectory id, else run id), keeping their order."""
    groups: dict[str | None, list[Mapping[str, Any]]] = {}
    for event in events:
        key = event.get("trajectory_id") or event.get("run_id")
        groups.setdefault(key, []).append(event)
    return groups


class InProcessBus(Bus):
    """Thread-safe in-memory bus; the test double for `KafkaBus`, with the same message path.

    One consumer, no group: it owns every partition, so its rebalance listener is never told anything.
    """

    def __init__(self, topic: str | None = None, partitions: int = 4) -> None:
        # Offsets restart at 0 in every process, while the sink resumes from the offsets
        # stored in the lake per topic: each bus therefore gets a topic of its own.
        self.topic = topic or f"inprocess-{uuid.uuid4().hex[:12]}"
        self.partitions = partitions
        self._logs: list[list[Message]] = [[] for _ in range(partitions)]
        self._next: list[int] = [0] * partitions
        self._cond = threading.Condition()
        self.listener: RebalanceListener | None = None
        shutdown.hold(self, shutdown.CHECK)

    def listen(self, listener: RebalanceListener) -> None:
        """Kept, never told anything: no group moves this bus's partitions."""
        self.listener = listener

    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        groups = group_by_trajectory(events)
        for key, group in groups.items():
            value = codec.encode_arrow(group)
            self.send(
                Message(key=key, value=value, headers={codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE})
            )
        return len(groups)

    def send(self, message: Message) -> None:
        with self._cond:
            partition = partition_for(message.key, self.partitions)
            log = self._logs[partition]
            message.position = SourcePosition(self.topic, partition, len(log))
            log.append(message)
            self._cond.notify_all()

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list[Message]:
        with self._cond:
            if not self._has_pending():
                self._cond.wait(timeout_s)
            out: list[Message] = []
            for p in range(self.partitions):
                log = self._logs[p]
                take = log[self._next[p] : self._next[p] + max_messages - len(out)]
                out.extend(take)
                self._next[p] += len(take)
                if len(out) >= max_messages:
                    break
            return out

    def caught_up(self) -> bool:
        with self._cond:
            return not self._has_pending()

    def _has_pending(self) -> bool:
        return any(self._next[p] < len(self._logs[p]) for p in range(self.partitions))

    def seek(self, partition: int, offset: int) -> None:
        with self._cond:
            self._next[partition] = offset

    def assigned_partitions(self) -> list[int]:
        return list(range(self.partitions))

    def pending(self) -> int:
        """Messages published but not yet polled."""
        return sum(self.lag().values())

    def lag(self, timeout_s: float = 2.0) -> dict[int, int]:
        with self._cond:
            return {p: len(self._logs[p]) - self._next[p] for p in range(self.partitions)}

    def end_offsets(self) -> dict[int, int]:
        with self._cond:
            return {p: len(self._logs[p]) for p in range(self.partitions)}

    def group_state(self) -> str:
        """No group: this bus's one consumer owns every partition."""
        return "in-process bus, one consumer, no group"

    def commit_offsets(self, next_offsets: Mapping[int, int]) -> None:
        """Nothing to do: offsets live in the Delta log, and nothing else reads them here."""

    def flush(self, timeout_s: float | None = None) -> None:
        """Nothing to do: a message is delivered when `send` returns."""

    def spool_stats(self) -> SpoolStats:
        """Always empty: delivery cannot fail."""
        return SpoolStats()

    def close(self) -> None:
        """Nothing to release; the messages stay readable."""

    def settle(self, deadline: float) -> str | None:
        """A stop, after the sinks committed: say what nothing read (it dies with the process)."""
        left = self.pending()
        if not left:
            return None
        return (
            f"LOST: {left:,} messages on the in-process bus {self.topic} were never written to a lake: no "
            "sink read them (run a SinkThread on an in-process bus, or use Kafka)"
        )
