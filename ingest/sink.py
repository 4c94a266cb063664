"""Consume events from the bus and append them to the lake, exactly once.

Protocol (DESIGN.md "Exactly-once"): each flush commits its rows together with, per
topic-partition, the last offset it covers, as Delta `txn` actions in the same commit.
On start the sink seeks every partition to the offset after the one in the Delta log, so
whatever Kafka (or the in-process bus) remembers, a message is stored once. Dead letters
are committed first, with their own offsets, and skipped on replay when already stored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake.ingest import codec
from trajlake.ingest.bus.base import Consumer, Message, SourcePosition
from trajlake.ingest.chunking import ChunkAssembler
from trajlake.ingest.config import SinkConfig
from trajlake.ingest.dead_letters import dead_letter, dead_letters_table, raw_event, raw_json
from trajlake.ingest.seqs import SeqCache
from trajlake.schemas.events import EVENTS_SCHEMA
from trajlake.schemas.tables import PROJECTION_TABLES
from trajlake.schemas.threads import run_in_thread
from trajlake.schemas.validation import validate
from trajlake.store import projections
from trajlake.store.compact import merge_tiers
from trajlake.store.errors import TxnFenced
from trajlake.store.lake import Lake, combine_in_parts, summarized

log = logging.getLogger(__name__)

__all__ = ["DeltaSink", "SinkConfig"]


@dataclass
class _Pending:
    """Decoded events waiting for the next flush, with the positions they came from."""

    tables: list[pa.Table] = field(default_factory=list)
    origins: list[tuple[SourcePosition | None, str, str | None]] = field(default_factory=list)  # per table
    rows: int = 0
    bytes: int = 0
    dead: list[dict[str, Any]] = field(default_factory=list)
    last_offsets: dict[SourcePosition | Any, int] = field(default_factory=dict)
    first_at: float | None = None


@dataclass
class SinkStats:
    """Running totals, for logs and metrics."""

    messages: int = 0
    events: int = 0
    dead_letters: int = 0
    commits: int = 0
    bytes: int = 0
    last_commit_at: float | None = None
    last_version: int | None = None


class DeltaSink:
    """Buffers events; `flush` writes rows and source offsets in one Delta commit."""

    def __init__(self, lake: Lake, bus: Consumer, config: SinkConfig | None = None) -> None:
        self.lake = lake
        self.bus = bus
        self.config = config or SinkConfig()
        self.stats = SinkStats()
        self._pending = _Pending()
        self._idle = False
        self._seqs = SeqCache(lake, self.config.seq_cache_trajectories)
        self._dead_positions: dict[str, int] = {}
        self._committed: dict[str, int | None] = {}  # app id -> offset in the Delta log we build on
        self._assembler = ChunkAssembler(self.config.chunk_max_gap)
        self._decoder = codec.Decoder()
        self._lock = threading.RLock()
        self._inflight: Future[int] | None = None  # the commit running on its own thread
        self._last_flush = 0.0
        self._advisory: dict[int, int] = {}  # partition -> next offset, committed to Delta
        self._advisory_lock = threading.Lock()
        self._assigned_at = 0.0  # monotonic time of the last partition assignment
        # in a consumer group (Kafka) partitions move between sinks; a consumer without one never calls these
        bus.on_assigned = self._on_assigned
        bus.on_revoked = self._on_revoked
        bus.on_lost = self._on_lost
        if self.config.exactly_once:
            self.resume()
        if self.config.update_projections:
            projections.catch_up(self.lake)

    # -- positions -----------------------------------------------------------------------
    def resume(self, partitions: Iterable[int] | None = None) -> None:
        """Seek each assigned partition to just after the offset stored in the Delta log."""
        if self._inflight is not None:  # positions are read after the commit in flight lands
            wait([self._inflight])
        for partition in partitions if partitions is not None else self.bus.assigned_partitions():
            app_id = SourcePosition(self.bus.topic, partition, 0).app_id
            stored = self.lake.txn_version("events", app_id)
            dead = self.lake.txn_version("dead_letters", app_id)
            if dead is not None:
                self._dead_positions[app_id] = dead
            self._committed[app_id] = stored
            # no stored offset: start at the beginning, never at an offset Kafka remembers
            self.bus.seek(partition, stored + 1 if stored is not None else 0)
            self._assembler.reset(partition)

    def _on_assigned(self, partitions: list[int]) -> None:
        """A rebalance gave this sink `partitions`: continue each from the Delta log."""
        self._assigned_at = time.monotonic()
        if self.config.exactly_once:
            with self._lock:
                self.resume(partitions)

    def _on_revoked(self, partitions: list[int]) -> None:
        """A rebalance takes `partitions` away: commit what is buffered while they are still ours."""
        with self._lock:
            self.flush()
            for partition in partitions:
                self._assembler.reset(partition)

    def _on_lost(self, partitions: list[int]) -> None:
        """The group dropped this sink (it stalled): others own the partitions, so drop the buffer."""
        with self._lock:
            self._pending = _Pending()
            self._assembler.reset()

    # -- consuming -----------------------------------------------------------------------
    def should_flush(self) -> bool:
        """True when the buffer should be committed now (see `SinkConfig`)."""
        p = self._pending
        if not p.rows and not p.dead:
            return False
        full = p.rows >= self.config.max_rows or p.bytes >= self.config.max_bytes
        if self.committing():  # keep batching while the previous commit runs, unless full
            return full
        now = time.monotonic()
        age = now - (p.first_at or now)
        # the commit thread is free and the batch is worth a file: keep writing while reading
        worth_a_file = p.bytes >= self.config.min_flush_bytes
        # the input went quiet or the bus has nothing more: waiting longer would batch nothing,
        # only add latency; a trickle of tiny batches still waits min_commit_interval_s
        idle = self.config.flush_when_idle and self._idle
        spaced = now - self._last_flush >= self.config.min_commit_interval_s
        return full or worth_a_file or (idle and spaced) or age >= self.config.max_latency_s

    def poll_once(self) -> int:
        """Poll the bus once and buffer what arrives; return the number of messages."""
        self._send_advisory_offsets()
        # while a commit runs, look back soon: the buffer may be flushed once it lands
        timeout = min(self.config.poll_timeout_s, 0.01) if self.committing() else self.config.poll_timeout_s
        messages = self.bus.poll(self.config.poll_max_messages, timeout)
        # idle: nothing new arrived, or the bus has handed over everything it has
        self._idle = not messages or self.bus.caught_up()
        # kafka-python runs rebalance callbacks (a flush, a resume) on its own IO thread, maybe
        # while this thread buffers: the lock keeps a batch from changing while it is committed
        with self._lock:
            # chunks of an oversized message are reassembled first; later messages of their
            # partition wait, so committed offsets never pass the first chunk of a partial set
            for released in self._assembler.feed(messages):
                if released.reason is None:
                    self.add(released.message)
                else:
                    self.add_rejected(released.message, released.reason)
        return len(messages)

    def _send_advisory_offsets(self) -> None:
        """Tell the bus how far the sink committed (Kafka lag tools read it; resuming never does)."""
        if not self._advisory:
            return
        with self._advisory_lock:
            offsets, self._advisory = self._advisory, {}
        self.bus.commit_offsets(offsets)

    def _account(self, message: Message) -> None:
        """Count a message into the buffer and advance its partition's offset."""
        p = self._pending
        if p.first_at is None:
            p.first_at = time.monotonic()
        self.stats.messages += 1
        p.bytes += len(message.value)
        pos = message.position
        if pos is not None:
            p.last_offsets[pos.app_id] = max(p.last_offsets.get(pos.app_id, -1), pos.offset)

    def add_rejected(self, message: Message, reason: str) -> None:
        """Buffer `message` as a dead letter with `reason` (e.g. an incomplete chunk set)."""
        self._account(message)
        content_type = codec.content_type_of(message.headers)
        self._dead(message.position, message.key, content_type, message.value, reason)

    def add(self, message: Message) -> None:
        """Decode one message into the buffer; an unreadable one becomes a dead letter."""
        self._account(message)
        p = self._pending
        pos = message.position
        content_type = codec.content_type_of(message.headers)
        try:
            table, bad = self._decoder.decode(message.value, message.headers)
        except codec.DecodeError as err:
            self._dead(pos, message.key, content_type, message.value, str(err))
            return
        for raw, reason in bad:
            event = raw if isinstance(raw, dict) else None
            self._dead(pos, message.key, codec.JSON_CONTENT_TYPE, raw_json(raw), reason, event)
        if table.num_rows:
            p.tables.append(table)
            p.origins.append((pos, content_type, message.key))
            p.rows += table.num_rows

    def _dead(self, pos: SourcePosition | None, *letter: Any, into: _Pending | None = None) -> None:
        """Buffer `dead_letter(pos, *letter)`, unless an earlier run stored it before it crashed."""
        if pos is not None and pos.offset <= self._dead_positions.get(pos.app_id, -1):
            return
        (into or self._pending).dead.append(dead_letter(pos, *letter))

    # -- committing ----------------------------------------------------------------------
    def flush(self, wait: bool = True) -> int | None:
        """Commit the buffer; return the new `events` version (None if nothing was committed).

        With `wait=False` the Parquet write and the Delta commit run on a commit thread while
        the caller goes on consuming, and None is returned. One commit is in flight at a
        time: a flush first waits for the previous one, so batches commit in order and each
        is validated against everything committed before it.
        """
        with self._lock:
            version = self._finish_commit()
            p, self._pending = self._pending, _Pending()
            if not p.rows and not p.dead and not p.last_offsets:
                return version
            self._inflight = run_in_thread(lambda: self._validate_and_commit(p), name="trajlake-commit")
            self._last_flush = time.monotonic()
            return self._finish_commit() if wait else None

    def _validate_and_commit(self, p: _Pending) -> int:
        """Validate the batch against what is stored, then commit it (on the commit thread)."""
        # one contiguous batch: validation reads it zero-copy and Parquet writes it fastest
        batch = combine_in_parts(p.tables) if p.tables else EVENTS_SCHEMA.empty_table()
        result = validate(batch, self._seqs.known(batch))
        if result.reasons:
            self._dead_rows(p, result.rejected, result.rejected_index, result.reasons)
        offsets = p.last_offsets if self.config.exactly_once else {}
        expect = {app_id: self._committed.get(app_id) for app_id in offsets} if offsets else None
        return self._commit(p, result, offsets, expect)

    def committing(self) -> bool:
        """True while a commit started by `flush(wait=False)` is still running."""
        return self._inflight is not None and not self._inflight.done()

    def _finish_commit(self) -> int | None:
        """Wait for the commit in flight; return its version, or None when it was fenced off."""
        job, self._inflight = self._inflight, None
        if job is None:
            return None
        error = job.exception()  # waits for the commit; its error is handed to this thread
        # the consuming thread, or kafka-python's IO thread in a rebalance callback: both may use
        # the consumer (commit_async only queues work on that IO thread); the commit thread may not
        self._send_advisory_offsets()
        if isinstance(error, TxnFenced):
            # another sink owns these partitions now (we stalled past a rebalance): what we
            # buffered is theirs to commit, including what arrived since; continue from the Delta log
            log.warning("dropping buffered events: %s", error)
            self._pending = _Pending()
            self._assembler.reset()
            self.resume(self.bus.assigned_partitions())
            return None
        if error is not None:
            raise error
        return job.result()

    def _commit(
        self, p: _Pending, result: Any, offsets: dict[str, int], expect: dict[str, int | None] | None
    ) -> int:
        """Commit dead letters, then rows with their offsets (fenced against other sinks)."""
        if p.dead:
            if expect:
                self.lake.check_txns("events", expect)
            dead = dead_letters_table(p.dead)
            self.lake.append("dead_letters", dead, offsets)
            self.stats.dead_letters += len(p.dead)
            for app_id, offset in offsets.items():
                self._dead_positions[app_id] = offset
        # summarized here rather than as each file is written, so the projections below reuse it
        events = summarized(result.valid)
        actions = self.lake.write_files("events", events)
        version = self.lake.commit("events", actions, offsets, expect_txns=expect)
        self._committed.update(offsets)
        if offsets:  # sent by whoever waits for this commit, never from the commit thread (_finish_commit)
            with self._advisory_lock:
                self._advisory.update({int(a.rsplit(":", 1)[1]): o + 1 for a, o in offsets.items()})
        self._seqs.remember(result.valid)
        self.stats.events += result.valid.num_rows
        self.stats.commits += 1
        self.stats.bytes += p.bytes
        self.stats.last_commit_at = time.time()
        self.stats.last_version = version
        if self.config.update_projections:
            known = {action.path: events for action in actions}
            projections.catch_up(self.lake, known)
            if self.config.merge_fanin:
                for name in PROJECTION_TABLES:
                    merge_tiers(self.lake, name, self.config.merge_fanin)
        return version

    def _dead_rows(self, p: _Pending, rejected: pa.Table, index: np.ndarray, reasons: list[str]) -> None:
        starts = np.cumsum([0] + [t.num_rows for t in p.tables])
        for row, (i, reason) in enumerate(zip(index, reasons, strict=True)):
            which = int(np.searchsorted(starts, i, side="right") - 1)
            pos, content_type, key = p.origins[which]
            one = rejected.slice(row, 1)
            raw = raw_event(one, content_type)
            self._dead(pos, key, content_type, raw, reason, one.to_pylist()[0], into=p)

    # -- main loop -----------------------------------------------------------------------
    def run(
        self,
        until_idle_s: float | None = None,
        stop_event: threading.Event | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> SinkStats:
        """Consume until `stop_event` is set, or until a poll comes back empty after `until_idle_s` idle.

        The one main loop of every sink (the `trajlake ingest` service, the demo, loadgen,
        importers). Idle time restarts with every message, every flush (a long commit is
        not time without messages) and every partition assignment (waiting for the group
        is not quiet input): `until_idle_s=0` stops at the first empty poll. `on_tick` runs
        once per turn on this thread (metrics read the consumer, which is not thread-safe).
        What was consumed is committed, with its offsets, before this returns.
        """
        idle_since = time.monotonic()
        while not (stop_event is not None and stop_event.is_set()):
            got = self.poll_once()
            if got:
                idle_since = time.monotonic()
            idle_since = max(idle_since, self._assigned_at)
            if self.should_flush():
                self.flush(wait=False)  # the commit runs while the loop goes on consuming
                idle_since = time.monotonic()
            if on_tick is not None:
                on_tick()
            if until_idle_s is not None and not got and time.monotonic() - idle_since >= until_idle_s:
                if until_idle_s:
                    log.info("no message for %.1f s; stopping", until_idle_s)
                break
        self.flush()
        return self.stats


class SinkThread:
    """Runs a sink's main loop on a background thread; `stop` commits what it holds and joins it."""

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.stop_event = threading.Event()
        self.job = run_in_thread(lambda: self.sink.run(stop_event=self.stop_event), name="trajlake-sink")

    def check(self) -> None:
        """Raise the error the sink died of, if it did (so a caller waiting for rows stops waiting)."""
        if self.job.done():
            self.job.result()

    def stop(self, drain: bool = False, timeout_s: float | None = None) -> SinkStats:
        """Commit what is buffered and stop; with `drain`, then consume what is still on the bus."""
        self.stop_event.set()
        done, _ = wait([self.job], timeout_s)
        if not done:
            raise TimeoutError(f"the sink did not stop within {timeout_s:g} s (a commit is still running)")
        self.job.result()  # the sink's own error, in the caller's thread
        if drain:  # published after the thread's last poll: read it here, the thread is gone
            self.sink.run(until_idle_s=0)
        return self.sink.stats
