"""Invalid events land in `dead_letters` with their raw bytes, position and reason; good ones are stored."""

from __future__ import annotations

import math

import pyarrow as pa

from tests.helpers import started_event, turn_event
from trajlake.ingest import codec
from trajlake.ingest.bus.base import Message
from trajlake.schemas import make_event

BAD = {
    "length-mismatch": turn_event(trajectory_id="bad1", output_token_ids=[1, 2, 3]),
    "nan-logprob": turn_event(trajectory_id="bad2", output_logprobs=[math.nan, -0.1]),
    "positive-logprob": turn_event(trajectory_id="bad3", output_logprobs=[0.5, -0.1]),
    "negative-id": turn_event(trajectory_id="bad4", output_token_ids=[-5, 1]),
    "unknown-type": make_event("vibes", "r", trajectory_id="bad5", seq=0),
}
REASONS = {
    "length-mismatch": "output_token_ids has 3 ids but output_logprobs has 2 values",
    "nan-logprob": "contains nan; logprobs must be finite and <= 0",
    "positive-logprob": "contains 0.5; logprobs must be finite and <= 0",
    "negative-id": "contains -5; token ids must be >= 0",
    "unknown-type": "event_type='vibes' is unknown",
    "duplicate-seq": "seq=1 is a duplicate within trajectory good",
}


def test_bad_events_go_to_dead_letters_and_good_ones_are_stored(lake, bus, drain) -> None:
    good = [started_event(trajectory_id="good"), turn_event(trajectory_id="good", seq=1)]
    duplicate = turn_event(trajectory_id="good", seq=1, turn_index=1)
    bus.publish([*good, *BAD.values()])
    bus.publish([duplicate])  # a second message: the duplicate is caught against the first
    drain()
    stored = lake.sql("select trajectory_id, seq from events order by seq").to_pylist()
    assert stored == [{"trajectory_id": "good", "seq": 0}, {"trajectory_id": "good", "seq": 1}]
    dead = lake.sql("select trajectory_id, reason, source, raw, content_type from dead_letters").to_pylist()
    by_traj = {d["trajectory_id"]: d for d in dead}
    assert len(dead) == 6
    for kind, event in BAD.items():
        assert REASONS[kind] in by_traj[event["trajectory_id"]]["reason"], kind
    assert REASONS["duplicate-seq"] in by_traj["good"]["reason"]
    raw = by_traj["bad4"]["raw"]  # the raw bytes hold the event as it came, readable again
    table, _ = codec.decode(raw, {"content-type": by_traj["bad4"]["content_type"]})
    assert table.column("output_token_ids").to_pylist() == [[-5, 1]]
    assert all(d["source"].startswith(f"{bus.topic}/") for d in dead)


def test_an_unreadable_message_is_kept_whole(lake, bus, drain) -> None:
    bus.send(Message(key="k", value=b"\x00garbage", headers={"content-type": codec.ARROW_CONTENT_TYPE}))
    bus.send(
        Message(key="k", value=b'{"event_type": "turn"', headers={"content-type": codec.JSON_CONTENT_TYPE})
    )
    bus.send(Message(key="k", value=codec.encode_json([started_event(trajectory_id="j")]),
                     headers={"content-type": codec.JSON_CONTENT_TYPE}))  # fmt: skip
    drain()
    dead = lake.read("dead_letters").sort_by("offset").to_pylist()
    assert [d["raw"] for d in dead] == [b"\x00garbage", b'{"event_type": "turn"']
    assert "not a readable Arrow IPC stream" in dead[0]["reason"]
    assert "not valid JSON" in dead[1]["reason"]
    assert lake.sql("select trajectory_id from events").to_pylist() == [{"trajectory_id": "j"}]


def test_a_json_event_missing_fields_is_rejected_alone(lake, bus, drain) -> None:
    ok = started_event(trajectory_id="ok")
    broken = {"event_type": "turn", "run_id": "r", "trajectory_id": "x", "seq": 1, "output_token_ids": "oops"}
    bus.send(
        Message(
            key="x", value=codec.encode_json([ok, broken]), headers={"content-type": codec.JSON_CONTENT_TYPE}
        )
    )
    drain()
    assert lake.sql("select count(*) from events").column(0)[0].as_py() == 1
    (reason,) = lake.sql("select reason from dead_letters").column(0).to_pylist()
    assert "output_token_ids='oops' does not fit type list<item: int32>" in reason


def test_the_dead_letters_table_has_its_contract_columns(lake, bus, drain) -> None:
    bus.publish([BAD["unknown-type"]])
    drain()
    schema = lake.sql("select * from dead_letters").schema
    for name in ("raw", "reason", "topic", "partition", "offset"):
        assert name in schema.names
    assert schema.field("raw").type == pa.binary()
