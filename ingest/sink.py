"""Consume events from the bus and append them to the lake, exactly once.

Protocol (docs/design.md#exactly-once): each flush commits its rows together with, per
topic-partition, the last offset it covers, as Delta `txn` actions in the same commit.
On start the sink seeks every partition to the offset after the one in the Delta log, so
whatever Kafka (or the in-process bus) remembers, a message is stored once. Dead letters
are committed first, with their own offsets, and skipped on replay when already stored.
Events a producer delivered twice (`trajlake.ingest.replays`) are dropped and counted.

The sink writes `events` and offsets only. Projections are the projector's
(`trajlake.store.projector`): with `update_projections` (the embedded default) this process
runs one beside its sinks, handed the rows each commit wrote.
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
from deltalake.exceptions import DeltaError

from trajlake.common.threads import run_in_thread
from trajlake.ingest import codec, shutdown
from trajlake.ingest.bus.base import Consumer, Message, SourcePosition
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.chunking import ChunkAssembler
from trajlake.ingest.config import SinkConfig
from trajlake.ingest.dead_letters import dead_letter, dead_letters_table, raw_event, raw_json
from trajlake.ingest.replays import drop_replays
from trajlake.ingest.seqs import SeqCache
from trajlake.schemas.errors import TrajlakeError
from trajlake.schemas.events import EVENTS_SCHEMA
from trajlake.schemas.validation import validate
from trajlake.store.config import ProjectorConfig
from trajlake.store.errors import LakeError, TxnFenced
from trajlake.store.files import combine_in_parts, summarized
from trajlake.store.lake import Lake
from trajlake.store.projector import ProjectorThread
from trajlake.store.storage import through_outages

log = logging.getLogger(__name__)

__all__ = ["DeltaSink", "DrainIncomplete", "SinkConfig"]

DRAIN_TIMEOUT_S = 120.0
"""How long `run(until_idle_s=…)` keeps trying, without progress, to hold the topic's end."""


REBALANCE_WAIT_S = 3.0
"""How long a rebalance callback waits for the commit in flight. Kafka's client runs the callbacks
on the thread that also heartbeats: waiting out a store outage there stalled the whole group's
rebalance and dropped the sink from the group after its session timeout (10 s by default). Past
this the buffer is left to the partitions' next owner, which reads them again from the position in
the Delta log; the commit goes on, fenced on the offsets it builds on."""


class DrainIncomplete(TrajlakeError, RuntimeError):
    """`--until-idle` found the lake short of the topic's end and could not get there in time."""

    def __init__(self, message: str, *, behind: dict[int, tuple[int, int]], group: str) -> None:
        super().__init__(message)
        self.behind = behind
        self.group = group


@dataclass
class _Pending:
    """Decoded events waiting for the next flush, with the positions they came from."""

    tables: list[pa.Table] = field(default_factory=list)
    origins: list[tuple[SourcePosition | None, str, str | None]] = field(default_factory=list)  # per table
    rows: int = 0
    bytes: int = 0
    dead: list[dict[str, Any]] = field(default_factory=list)
    last_offsets: dict[int, int] = field(default_factory=dict)  # partition -> last offset buffered
    dead_committed: bool = False  # by an attempt whose events commit then failed: not again
    first_at: float | None = None


@dataclass
class SinkStats:
    """Running totals, for logs and metrics."""

    messages: int = 0
    events: int = 0
    dead_letters: int = 0
    replayed: int = 0
    """Events dropped because a stored event (or one earlier in the batch) was the same event."""
    commits: int = 0
    bytes: int = 0
    last_commit_at: float | None = None
    last_version: int | None = None


class DeltaSink:
    """Buffers events; `flush` writes rows and source offsets in one Delta commit."""

    def __init__(
        self,
        lake: Lake,
        bus: Consumer,
        config: SinkConfig | None = None,
        projector: ProjectorConfig | None = None,
    ) -> None:
        self.lake = lake
        self.bus = bus
        self.config = config or SinkConfig()
        self.stats = SinkStats()
        self._pending = _Pending()
        self._idle = False
        self._seqs = SeqCache(lake, self.config.seq_cache_trajectories)
        self._dead_positions: dict[int, int] = {}  # partition -> last offset in dead_letters
        self._committed: dict[int, int | None] = {}  # partition -> offset in the Delta log we build on
        self._assembler = ChunkAssembler(self.config.chunk_max_gap)
        self._decoder = codec.Decoder()
        self._lock = threading.RLock()
        self._inflight: Future[int] | None = None  # the commit running on its own thread
        self._last_flush = 0.0
        self._advisory: dict[int, int] = {}  # partition -> next offset, committed to Delta
        self._advisory_lock = threading.Lock()
        self._assigned_at = 0.0  # monotonic time of the last partition assignment
        # left by a rebalance callback or a fenced commit for the consuming thread, where waiting
        # on the store is safe: partitions to continue from the Delta log, and whether to clear the seqs
        self._unresumed: set[int] = set()
        self._forget_seqs = False
        # in a consumer group (Kafka) partitions move between sinks; a consumer without one tells nothing
        bus.listen(self)
        if self.config.exactly_once:
            self.resume()
        self._projector_config = projector
        self._projector: ProjectorThread | None = None  # while this sink runs and has committed
        self._projector_lock = threading.Lock()

    # -- positions -----------------------------------------------------------------------
    def resume(self, partitions: Iterable[int] | None = None) -> None:
        """Seek each assigned partition to just after the offset stored in the Delta log (a store
        that does not answer is tried again for up to `STORE_OUTAGE_S`)."""
        self._settled(None)  # positions are read after the commit in flight lands
        for partition in partitions if partitions is not None else self.bus.assigned_partitions():
            app_id = self._app_id(partition)
            for tried in through_outages(f"the read of partition {partition}'s position"):
                with tried:
                    stored = self.lake.txn_version("events", app_id)
                    dead = self.lake.txn_version("dead_letters", app_id)
            self._unresumed.discard(partition)
            if dead is not None:
                self._dead_positions[partition] = dead
            self._committed[partition] = stored
            # no stored offset: start at the beginning, never at an offset Kafka remembers
            self.bus.seek(partition, stored + 1 if stored is not None else 0)
            self._assembler.reset(partition)

    def _app_id(self, partition: int) -> str:
        """The Delta `txn` app id that holds `partition`'s committed offset."""
        return SourcePosition(self.bus.topic, partition, 0).app_id

    # -- the group's rebalances (this sink is its consumer's `RebalanceListener`) -----------
    def on_assigned(self, partitions: list[int]) -> None:
        """A rebalance gave this sink `partitions`: each continues from the Delta log, read on the
        consuming thread before any of their messages count (`_after_rebalance`)."""
        self._assigned_at = time.monotonic()
        with self._lock:
            self._forget_seqs = True  # the seqs stored while another sink held a partition are read again
            if self.config.exactly_once:
                self._unresumed.update(partitions)

    def on_revoked(self, partitions: list[int]) -> None:
        """A rebalance takes `partitions` away: commit what is buffered while they are still ours,
        unless the store keeps the commit before it running past `REBALANCE_WAIT_S`; then the buffer
        is dropped, and the partitions kept are read again from the Delta log."""
        with self._lock:
            if self._settled(REBALANCE_WAIT_S):
                self.flush(wait=False)
                self._settled(REBALANCE_WAIT_S)  # landed before the next owner reads the position, if it can
            else:
                log.warning("the lake's store holds up a commit in a rebalance; what is buffered of partitions %s "
                            "is read again by their next owner", partitions)  # fmt: skip
                self._pending = _Pending()
                self._assembler.reset()
                self._unresumed.update(set(self.bus.assigned_partitions()) - set(partitions))
            for partition in partitions:
                self._assembler.reset(partition)
            self._unresumed.difference_update(partitions)

    def on_lost(self, partitions: list[int]) -> None:
        """The group dropped this sink (it stalled): others own the partitions, so drop the buffer."""
        with self._lock:
            self._pending = _Pending()
            self._assembler.reset()
            self._forget_seqs = True
            self._unresumed.difference_update(partitions)

    def _after_rebalance(self, messages: list[Message]) -> list[Message]:
        """On the consuming thread, what a rebalance or a fenced commit left: the commit in flight
        lands, the seqs cache is cleared, and the partitions to resume continue from the Delta log.
        Returns `messages` without those partitions' (read from a position that was not the lake's)."""
        if not (self._forget_seqs or self._unresumed):
            return messages
        with self._lock:
            self._settled(None)  # what this sink commits is known before the cache is cleared
            if self._forget_seqs:
                self._seqs.forget()
                self._forget_seqs = False
            stale = set(self._unresumed)
            if stale:
                self.resume(sorted(stale & set(self.bus.assigned_partitions())))
                self._unresumed.clear()
        return [m for m in messages if m.position is None or m.position.partition not in stale]

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
        messages = self._after_rebalance(self.bus.poll(self.config.poll_max_messages, timeout))
        # idle: nothing new arrived, or the bus has handed over everything it has
        self._idle = not messages or self.bus.caught_up()
        # kafka-python runs rebalance callbacks (a flush) on its own IO thread, maybe
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
            p.last_offsets[pos.partition] = max(p.last_offsets.get(pos.partition, -1), pos.offset)

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
        if pos is not None and pos.offset <= self._dead_positions.get(pos.partition, -1):
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
        """Validate the batch against what is stored, then commit it (on the commit thread).

        A store that does not answer (restarting, unreachable) is tried again for up to
        `STORE_OUTAGE_S`: safe, since the commit is fenced on the offsets it builds on (one that
        landed unseen fences its retry off, `TxnFenced`, and the sink resumes from the log).
        Any other storage error, or an outage past that, stops the sink with a `LakeError`
        naming the store and the key it was refused with.
        """
        dead = list(p.dead)

        def attempt() -> int:
            p.dead = list(dead)  # what a failed attempt added to the batch's dead letters goes
            return self._validate_and_commit_once(p)

        try:
            for tried in through_outages("a commit"):
                with tried:
                    return attempt()
        except (OSError, DeltaError) as err:
            cause = err if isinstance(err, OSError) else OSError(str(err))
            raise LakeError(self.lake.storage.unreachable(cause), table_uri=self.lake.uri("events")) from err
        raise AssertionError("unreachable")

    def _validate_and_commit_once(self, p: _Pending) -> int:
        # one contiguous batch: validation reads it zero-copy and Parquet writes it fastest
        batch = combine_in_parts(p.tables) if p.tables else EVENTS_SCHEMA.empty_table()
        known = self._seqs.known(batch)
        batch, kept, replayed = drop_replays(batch, known, self.lake)
        result = validate(batch, known)
        if result.reasons:
            index = result.rejected_index if kept is None else kept[result.rejected_index]
            self._dead_rows(p, result.rejected, index, result.reasons)
        version = self._commit(p, result, p.last_offsets if self.config.exactly_once else {})
        self.stats.replayed += replayed
        return version

    def committing(self) -> bool:
        """True while a commit started by `flush(wait=False)` is still running."""
        return self._inflight is not None and not self._inflight.done()

    def _settled(self, timeout_s: float | None) -> bool:
        """Wait up to `timeout_s` (None: as long as it takes) for the commit in flight; True when
        none is left running, its outcome taken (`_finish_commit`)."""
        job = self._inflight
        if job is not None and wait([job], timeout_s).not_done:
            return False
        self._finish_commit()
        return True

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
            self._unresumed.update(self.bus.assigned_partitions())  # before the next poll's messages count
            return None
        if error is not None:
            raise error
        return job.result()

    def _commit(self, p: _Pending, result: Any, offsets: dict[int, int]) -> int:
        """Commit dead letters, then rows with the offsets of their partitions (fenced against other
        sinks: each partition's offset must still be the one this sink built on)."""
        txns = {self._app_id(partition): offset for partition, offset in offsets.items()}
        expect = {self._app_id(partition): self._committed.get(partition) for partition in offsets} or None
        if p.dead and not p.dead_committed:
            if expect:
                self.lake.check_txns("events", expect)
            dead = dead_letters_table(p.dead)
            self.lake.append("dead_letters", dead, txns)
            p.dead_committed = True
            self.stats.dead_letters += len(p.dead)
            self._dead_positions.update(offsets)
        # summarized here rather than as each file is written, so the projections below reuse it
        events = summarized(result.valid)
        actions = self.lake.write_files("events", events)
        version = self.lake.commit("events", actions, txns, expect_txns=expect)
        self._committed.update(offsets)
        if offsets:  # sent by whoever waits for this commit, never from the commit thread (_finish_commit)
            with self._advisory_lock:
                self._advisory.update({partition: offset + 1 for partition, offset in offsets.items()})
        self._seqs.remember(result.valid)
        self.stats.events += result.valid.num_rows
        self.stats.commits += 1
        self.stats.bytes += p.bytes
        self.stats.last_commit_at = time.time()
        self.stats.last_version = version
        if self.config.update_projections:
            self._project({action.path: events for action in actions})
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
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> SinkStats:
        """Consume until `stop_event` is set, or, with `until_idle_s`, until the lake holds the
        topic's end and a poll comes back empty after `until_idle_s` idle.

        The one main loop of every sink (the `trajlake ingest` service, the demo, loadgen,
        importers). Idle time restarts with every message, every flush (a long commit is
        not time without messages) and every partition assignment (waiting for the group
        is not quiet input): `until_idle_s=0` stops at the first empty poll that finds the lake
        at the topic's end (`behind`). Short of it, the sink goes on consuming; with no progress
        for `drain_timeout_s` it raises `DrainIncomplete`. `on_tick` runs once per turn on this
        thread (metrics read the consumer, which is not thread-safe). What was consumed is
        committed, with its offsets, before this returns; so are the projections of this
        process's projector.
        """
        idle_since = time.monotonic()
        drain = _Drain(drain_timeout_s)
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
                self.flush()
                behind = self.behind()
                if not behind:
                    if until_idle_s:
                        log.info("the lake holds the end of %s and no message came for %.1f s; stopping",
                                 self.bus.topic, until_idle_s)  # fmt: skip
                    break
                drain.check(self, behind)
                idle_since = time.monotonic()  # short of the end: not idle, whatever the polls say
        self.flush()
        self.close()
        return self.stats

    def behind(self) -> dict[int, tuple[int, int]]:
        """partition -> (the next offset the lake holds, the partition's end), for every partition of
        the topic, assigned here or not, whose messages the Delta log does not cover yet; {} when
        offsets are not stored (`exactly_once` off), since then nothing says."""
        if not self.config.exactly_once:
            return {}
        behind = {}
        for partition, end in sorted(self.bus.end_offsets().items()):
            stored = self.lake.txn_version("events", self._app_id(partition))
            held = -1 if stored is None else stored
            if held + 1 < end:
                behind[partition] = (held + 1, end)
        return behind

    def _project(self, known: dict[str, pa.Table]) -> None:
        """Hand the rows a commit wrote to this process's projector (started on the first commit)."""
        with self._projector_lock:
            if self._projector is None:
                self._projector = ProjectorThread.acquire(self.lake, self._projector_config)
            self._projector.offer(known)

    def close(self) -> None:
        """Wait until the projections hold what this sink committed, and let go of the projector
        (the process's last sink stops it); `run` does this before it returns."""
        with self._projector_lock:
            projector, self._projector = self._projector, None
        if projector is not None:
            projector.release()


class SinkThread:
    """Runs a sink's main loop on a background thread; `stop` commits what it holds and joins it.

    On SIGINT/SIGTERM (`trajlake.ingest.shutdown`) it is stopped like that, after the recorders
    and publishers of the process have handed over what they held.
    """

    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.stop_event = threading.Event()
        self.job = run_in_thread(lambda: self.sink.run(stop_event=self.stop_event), name="trajlake-sink")
        shutdown.hold(self, shutdown.COMMIT)

    def check(self) -> None:
        """Raise the error the sink died of, if it did (so a caller waiting for rows stops waiting)."""
        if self.job.done():
            self.job.result()

    def stop(self, drain: bool | None = None, timeout_s: float | None = None) -> SinkStats:
        """Commit what is buffered and stop; with `drain`, then consume what is still on the bus.

        `drain` defaults to whether the bus is in-process: its messages die with the process.
        """
        shutdown.settle_upstream(shutdown.COMMIT)
        shutdown.release(self)
        if drain is None:
            drain = isinstance(self.sink.bus, InProcessBus)
        self.stop_event.set()
        done, _ = wait([self.job], timeout_s)
        if not done:
            raise TimeoutError(f"the sink did not stop within {timeout_s:g} s (a commit is still running)")
        self.job.result()  # the sink's own error, in the caller's thread
        if drain:  # published after the thread's last poll: read it here, the thread is gone
            with shutdown.deferred():  # a drain cut short would lose what it polled
                self.sink.run(until_idle_s=0)
        return self.sink.stats

    def settle(self, deadline: float) -> str | None:
        """A stop: commit what the sink holds, and what an in-process bus still has (`shutdown.Holder`)."""
        before = self.sink.stats.events
        stats = self.stop(timeout_s=max(1.0, deadline - time.monotonic()))
        return f"committed the last {stats.events - before:,} events to the lake at {self.sink.lake.root}"


class _Drain:
    """`run(until_idle_s=…)` short of the topic's end: keeps consuming while commits make progress,
    and gives up, naming the partitions behind and the group's state, after `timeout_s` without."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last: dict[int, tuple[int, int]] | None = None
        self.since = time.monotonic()

    def check(self, sink: DeltaSink, behind: dict[int, tuple[int, int]]) -> None:
        held = {p: h for p, (h, _) in behind.items()}
        if self.last is None or held != {p: h for p, (h, _) in self.last.items()}:
            if self.last is None:
                log.info("idle, but the lake is short of the end of %s: %s; consuming on", sink.bus.topic,
                         _describe(behind))  # fmt: skip
            self.last, self.since = behind, time.monotonic()
            return
        if time.monotonic() - self.since >= self.timeout_s:
            group = sink.bus.group_state()
            raise DrainIncomplete(
                f"the lake at {sink.lake.root} is still short of the end of topic {sink.bus.topic} after "
                f"{self.timeout_s:.0f} s without progress: {_describe(behind)}; consumer group: {group}",
                behind=behind,
                group=group,
            )


def _describe(behind: dict[int, tuple[int, int]]) -> str:
    return ", ".join(f"partition {p} holds up to offset {h} of {e}" for p, (h, e) in sorted(behind.items()))
