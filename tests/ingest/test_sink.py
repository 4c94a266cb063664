"""The sink commits while it consumes, in order, and a sink fenced off by another loses and duplicates nothing."""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait

import pytest

from tests.helpers import started_event, turn_event
from trajlake.ingest.bus.base import BusUnreachable, SourcePosition
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig, SinkThread


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
    with pytest.raises(OSError, match="No space left"):
        sink.flush()


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
            assert self.on_assigned is not None  # the sink listens, whichever consumer it has
            self.on_assigned(self.assigned_partitions())
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
