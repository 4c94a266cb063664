"""The sink commits while it consumes, in order, and a sink fenced off by another loses and duplicates nothing."""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import pytest
from deltalake.exceptions import DeltaError

from tests.helpers import started_event, turn_event
from trajlake.ingest.bus.base import BusUnreachable, Message, SourcePosition
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread
from trajlake.store.errors import LakeError


def trajectory(tid: str) -> list[dict]:
    return [started_event(trajectory_id=tid), turn_event(trajectory_id=tid, seq=1)]


def count(lake, table: str = "events") -> int:
    return lake.sql(f"select count(*) as n from {table}").to_pylist()[0]["n"]


def test_a_burst_is_committed_as_soon_as_it_is_read(lake, bus) -> None:
    for i in range(20):
        bus.publish(trajectory(f"t{i}"))
    sink = DeltaSink(lake, bus, SinkConfig(max_latency_s=60, min_commit_interval_s=0))
    sink.poll_once()  # takes all 20 messages; the bus has nothing more
    assert sink.should_flush()  # no need to wait for a poll to come back empty
    sink.flush()
    assert count(lake) == 40


def test_a_backlog_is_written_while_it_is_still_being_read(lake, bus) -> None:
    for i in range(40):
        bus.publish(trajectory(f"t{i}"))
    sink = DeltaSink(lake, bus, SinkConfig(poll_max_messages=10, min_flush_bytes=1024, max_latency_s=60))
    sink.poll_once()  # 10 of 40 messages: the bus still holds more
    assert sink.should_flush()  # the commit thread is free and a file's worth is buffered
    sink.run(until_idle_s=0)
    assert count(lake) == 80 and sink.stats.commits >= 2


def test_flushes_without_waiting_commit_in_the_background_in_order(lake, bus) -> None:
    sink = DeltaSink(lake, bus, SinkConfig(min_commit_interval_s=0))
    for i in range(5):
        bus.publish(trajectory(f"t{i}"))
        sink.poll_once()
        assert sink.flush(wait=False) is None  # returns at once; the commit thread writes
    version = sink.flush()  # waits for the last one
    assert not sink.committing()
    assert count(lake) == 10
    assert sink.stats.commits == 5 and version == lake.delta("events").version()
    for partition in bus.assigned_partitions():  # the last commit's offsets are the ones stored
        app_id = SourcePosition(bus.topic, partition, 0).app_id
        last = len(bus._logs[partition]) - 1
        assert lake.txn_version("events", app_id) == (last if last >= 0 else None)


def test_an_error_in_the_commit_thread_reaches_the_caller(lake, bus, monkeypatch) -> None:
    sink = DeltaSink(lake, bus)
    bus.publish(trajectory("t"))
    sink.poll_once()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lake, "commit", disk_full)
    assert sink.flush(wait=False) is None
    with pytest.raises(LakeError, match=r"No space left.*a directory this user can write"):
        sink.flush()


def _events_commits(lake, monkeypatch, fail, landed: bool = False) -> list[int]:
    """Count the sink's `events` commits; `fail(n)` may raise instead of the n-th (with `landed`,
    after it landed: its answer lost)."""
    commit, calls = lake.commit, []

    def counted(name, *args, **kwargs):
        if name != "events":
            return commit(name, *args, **kwargs)
        calls.append(1)
        if not landed:
            fail(len(calls))
        version = commit(name, *args, **kwargs)
        if landed:
            fail(len(calls))
        return version

    monkeypatch.setattr(lake, "commit", counted)
    return calls


RESTARTING = "Generic S3 error: error sending request: tcp connect error: Connection refused (os error 111)"
"""What delta-rs says while the S3 server restarts."""


@pytest.mark.parametrize(
    ("error", "landed"),
    [(OSError, False), (DeltaError, False), (DeltaError, True)],
    ids=["refused", "refused-by-delta-rs", "answer-lost"],
)
def test_a_commit_the_store_did_not_answer_is_tried_again_and_lands_once(
    lake, bus, monkeypatch, error, landed
):
    sink = DeltaSink(lake, bus)
    bus.publish(trajectory("t"))
    sink.poll_once()

    def restarting(n: int) -> None:
        if n == 1:
            raise error(RESTARTING)

    calls = _events_commits(lake, monkeypatch, restarting, landed)
    sink.flush()
    assert (
        len(calls) == 2
    )  # tried again; one that had landed unseen is fenced off (TxnFenced), not stored again
    assert count(lake) == 2  # the trajectory's two events, once


def test_a_commit_the_store_refused_stops_the_sink_at_once(lake, bus, monkeypatch) -> None:
    sink = DeltaSink(lake, bus)
    bus.publish(trajectory("t"))
    sink.poll_once()

    def revoked(n: int) -> None:
        raise OSError("Generic S3 error: 403 Forbidden: <Code>InvalidAccessKeyId</Code>")

    calls = _events_commits(lake, monkeypatch, revoked)
    with pytest.raises(LakeError, match=r"cannot use the lake at .*InvalidAccessKeyId"):
        sink.flush()
    assert len(calls) == 1


def test_a_fenced_off_sink_drops_its_buffer_and_resumes_from_the_delta_log(lake) -> None:
    """Two sinks read the same partitions (a rebalance they both missed): rows land once."""
    topic = "shared"
    slow, fast = InProcessBus(topic=topic), InProcessBus(topic=topic)
    for bus in (slow, fast):
        for i in range(10):
            bus.publish(trajectory(f"t{i}"))
    stale = DeltaSink(lake, slow, SinkConfig(min_commit_interval_s=0))
    stale.poll_once()  # buffered, not yet committed
    owner = DeltaSink(lake, fast, SinkConfig(min_commit_interval_s=0))
    owner.run(until_idle_s=0)
    assert count(lake) == 20
    assert stale.flush() is None  # fenced: the Delta log moved past what this sink built on
    for bus in (slow, fast):
        bus.publish(trajectory("later"))
    stale.run(until_idle_s=0)  # resumed after the owner's offsets: only the new message
    assert count(lake) == 22
    assert not lake.exists("dead_letters")  # nothing was even offered twice


def test_a_duplicate_is_caught_after_its_trajectory_left_the_seq_cache(lake, bus) -> None:
    sink = DeltaSink(lake, bus, SinkConfig(seq_cache_trajectories=1))
    for tid in ("a", "b"):  # the cache holds one trajectory: "a" is forgotten, read back later
        bus.publish(trajectory(tid))
        sink.run(until_idle_s=0)
    bus.publish([turn_event(trajectory_id="a", seq=1, turn_index=1)])
    sink.run(until_idle_s=0)
    assert count(lake) == 4
    (dead,) = lake.sql("select reason from dead_letters").to_pylist()
    assert "seq=1 is a duplicate within trajectory a" in dead["reason"]


class JoiningBus(InProcessBus):
    """An in-process bus whose first poll is a slow group join: partitions are assigned, nothing returned."""

    def __init__(self, join_s: float) -> None:
        super().__init__()
        self.join_s = join_s
        self.joined = False

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list:
        if not self.joined:
            self.joined = True
            time.sleep(self.join_s)
            assert self.listener is not None  # the sink listens, whichever consumer it has
            self.listener.on_assigned(self.assigned_partitions())
            return []
        return super().poll(max_messages, timeout_s)


def test_waiting_for_the_group_to_assign_partitions_is_not_idle_time(lake) -> None:
    bus = JoiningBus(join_s=0.3)
    bus.publish(trajectory("t"))
    stats = DeltaSink(lake, bus).run(until_idle_s=0.1)  # the join alone outlasts the idle limit
    assert stats.events == 2 and count(lake) == 2


def test_until_idle_counts_from_the_last_message_and_a_stop_commits_what_was_read(lake, bus) -> None:
    sink = DeltaSink(lake, bus, SinkConfig(max_latency_s=60, flush_when_idle=False))
    ticks: list[int] = []
    bus.publish(trajectory("a"))
    sink.run(until_idle_s=0.2, on_tick=lambda: ticks.append(sink.stats.messages))
    assert count(lake) == 2 and ticks[0] == 1  # the tick runs after each poll, on the loop's thread

    bus.publish(trajectory("b"))
    stop = threading.Event()
    stop.set()  # stop at once: no poll, and nothing buffered is lost
    sink.run(stop_event=stop)
    assert count(lake) == 2
    sink.poll_once()
    sink.run(stop_event=stop)
    assert count(lake) == 4


def test_a_sink_thread_stops_after_draining_the_bus_and_hands_back_its_error(lake, bus, monkeypatch) -> None:
    running = SinkThread(DeltaSink(lake, bus, SinkConfig(max_latency_s=60)))
    for i in range(10):
        bus.publish(trajectory(f"t{i}"))
    stats = running.stop(drain=True)  # whatever the thread had not polled yet is committed too
    assert stats.events == 20 and count(lake) == 20 and running.job.done()

    def broker_gone(*args, **kwargs):
        raise BusUnreachable("no Kafka broker answered at 127.0.0.1:9092")

    failing = SinkThread(DeltaSink(lake, bus))
    monkeypatch.setattr(bus, "poll", broker_gone)
    wait([failing.job], timeout=30)
    with pytest.raises(BusUnreachable):  # its own type, raised in the caller's thread: the CLI names the fix
        failing.check()
    with pytest.raises(BusUnreachable):
        failing.stop()


class LaggingBus(InProcessBus):
    """A bus whose group hands this sink its partitions only after `hold_polls` empty polls: as a
    Kafka group does while dead members keep their sessions, and a poll meanwhile returns nothing."""

    def __init__(self, hold_polls: int) -> None:
        super().__init__()
        self.hold_polls = hold_polls

    def poll(self, max_messages: int = 1000, timeout_s: float = 0.1) -> list:
        if self.hold_polls:
            self.hold_polls -= 1
            return []
        return super().poll(max_messages, timeout_s)


def test_until_idle_stops_only_once_the_lake_holds_the_topics_end(lake) -> None:
    bus = LaggingBus(hold_polls=5)  # five empty polls: an idle limit of 0 used to stop at the first
    for i in range(10):
        bus.publish(trajectory(f"t{i}"))
    sink = DeltaSink(lake, bus)
    stats = sink.run(until_idle_s=0)
    assert stats.events == 20 and count(lake) == 20 and sink.behind() == {}


def test_a_drain_that_cannot_reach_the_end_names_the_partitions_behind(lake) -> None:
    from trajlake.ingest import chunking, codec
    from trajlake.ingest.sink import DrainIncomplete

    bus = InProcessBus()
    bus.publish(trajectory("done"))
    value = codec.encode_json([turn_event(trajectory_id="late", output_token_ids=list(range(50_000)))])
    chunks = chunking.split(
        Message("late", value, {codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE}), 20_000
    )
    assert len(chunks) > 1
    bus.send(chunks[0])  # the first chunk of a set whose others never come (its producer died)
    with pytest.raises(DrainIncomplete) as raised:
        DeltaSink(lake, bus, SinkConfig(chunk_max_gap=1000)).run(until_idle_s=0, drain_timeout_s=0.5)
    partition = bus.end_offsets()
    behind = raised.value.behind
    assert behind and all(end == partition[p] for p, (_, end) in behind.items())
    assert "short of the end of topic" in str(raised.value) and "no group" in raised.value.group


def test_a_rebalance_goes_on_while_the_store_holds_a_commit_and_nothing_is_lost_or_doubled(
    lake, bus, monkeypatch
) -> None:
    from trajlake.ingest import sink as sink_module

    monkeypatch.setattr(sink_module, "REBALANCE_WAIT_S", 0.2)
    sink = DeltaSink(lake, bus, SinkConfig(update_projections=False, max_latency_s=60))
    release, commit = threading.Event(), lake.commit

    def held(*args, **kwargs):  # a store that does not answer until released
        assert release.wait(20)
        return commit(*args, **kwargs)

    monkeypatch.setattr(lake, "commit", held)
    bus.publish(trajectory("a"))
    sink.poll_once()
    sink.flush(wait=False)  # the commit the store holds
    bus.publish(trajectory("b"))
    sink.poll_once()  # buffered behind it
    started = time.monotonic()
    sink.on_revoked(bus.assigned_partitions())  # Kafka's client thread, which also heartbeats
    assert time.monotonic() - started < 5  # the group's rebalance is not held up by the store
    release.set()
    sink.on_assigned(bus.assigned_partitions())  # the partitions come back to this sink
    sink.run(until_idle_s=0)
    assert lake.sql(
        "select trajectory_id, count(*) as n from events group by all order by 1"
    ).to_pylist() == [
        {"trajectory_id": "a", "n": 2},
        {"trajectory_id": "b", "n": 2},
    ]
    assert not lake.exists("dead_letters")
