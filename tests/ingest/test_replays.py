"""A message delivered twice is a replay: stored once, counted, never a dead letter; a different
event on a stored seq is still a conflict, and a dead letter."""

from __future__ import annotations

from tests.helpers import started_event, turn_event
from trajlake.ingest import codec
from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake


def message(events: list[dict]) -> Message:
    return Message(events[0]["trajectory_id"], codec.encode_arrow(events),
                   {codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE})  # fmt: skip


def drain(lake: Lake, bus: InProcessBus) -> DeltaSink:
    sink = DeltaSink(lake, bus, SinkConfig(update_projections=False))
    sink.run(until_idle_s=0)
    return sink


def test_a_message_delivered_again_later_or_in_the_same_batch_is_stored_once(lake: Lake) -> None:
    first = [started_event(trajectory_id="a"), turn_event(trajectory_id="a", seq=1)]
    bus = InProcessBus()
    bus.send(message(first))
    bus.send(message(first))  # a producer's retry of a batch the broker had appended
    sink = drain(lake, bus)
    assert sink.stats.replayed == 2 and sink.stats.dead_letters == 0
    bus.send(message(first))  # the spool's resend, after the first copies were committed
    sink = drain(lake, bus)
    assert sink.stats.replayed == 2 and sink.stats.dead_letters == 0
    assert lake.sql("select count(*) as n from events").to_pylist() == [{"n": 2}]
    assert lake.read("dead_letters").num_rows == 0


def test_another_event_on_a_stored_seq_is_still_a_dead_letter(lake: Lake) -> None:
    turn = turn_event(trajectory_id="a", seq=1)
    bus = InProcessBus()
    bus.send(message([started_event(trajectory_id="a"), turn]))
    drain(lake, bus)
    other = turn_event(trajectory_id="a", seq=1)  # a new event id on seq 1
    changed = {**turn, "output_token_ids": [7, 7], "output_logprobs": [-0.5, -0.5]}  # same id, other content
    bus.send(message([other]))
    bus.send(message([changed]))
    sink = drain(lake, bus)
    assert sink.stats.replayed == 0 and sink.stats.dead_letters == 2
    reasons = lake.read("dead_letters").column("reason").to_pylist()
    assert all("seq=1 is a duplicate within trajectory a" in r for r in reasons)
    assert lake.sql("select count(*) as n from events").to_pylist() == [{"n": 2}]


def test_a_replay_after_a_partition_came_back_from_another_sink_is_stored_once(lake: Lake) -> None:
    # one partition's log: a's start and turn 1, then turn 2, then the spool's resend of turn 2
    log = [message([started_event(trajectory_id="a"), turn_event(trajectory_id="a", seq=1)]),
           message([turn_event(trajectory_id="a", seq=2)])]  # fmt: skip
    log.append(log[1])
    mine, other = InProcessBus(), InProcessBus()
    mine.send(log[0])
    sink = DeltaSink(lake, mine, SinkConfig(update_projections=False))
    sink.run(until_idle_s=0)  # this sink knows a's seqs 0 and 1
    for m in log[:2]:
        other.send(m)
    drain(lake, other)  # the partition moved: another sink stored turn 2
    for m in log[1:]:
        mine.send(m)
    sink.on_assigned(mine.assigned_partitions())  # and came back
    sink.run(until_idle_s=0)
    assert sink.stats.replayed >= 1 and sink.stats.dead_letters == 0
    assert lake.sql("select count(*) as n from events").to_pylist() == [{"n": 3}]  # turn 2 once


def test_a_run_level_event_delivered_again_is_stored_once(lake: Lake) -> None:
    # a trainer's policy update and batch hand-out carry no trajectory and no seq: the event id tells
    bus = InProcessBus()
    recorder = Recorder(bus, "r", vocab_size=100, handle_signals=False)
    recorder.policy_updated(1, 0, metrics={"loss": 0.5})
    recorder.batch_consumed(0, 1, ["t1", "t2"], [0, 1])
    sent = [m for log in bus._logs for m in log]
    for m in sent:
        bus.send(m)  # a producer's retry of a batch the broker had appended
    sink = drain(lake, bus)
    assert sink.stats.replayed == 2 and sink.stats.dead_letters == 0
    for m in sent:
        bus.send(m)  # the spool's resend, after the first copies were committed
    sink = drain(lake, bus)
    assert sink.stats.replayed == 2
    counts = lake.sql("select event_type, count(*) as n from events group by 1 order by 1").to_pylist()
    assert counts == [{"event_type": "batch_consumed", "n": 1}, {"event_type": "policy_updated", "n": 1}]
