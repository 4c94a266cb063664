"""Bad messages through a real broker: each lands in dead_letters with a reason; good ones in events."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.fixtures.kafka import sink_topic
from trajlake.ingest import chunking, codec
from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.kafka import KafkaBus, create_topic
from trajlake.ingest.config import KafkaConfig
from trajlake.schemas import make_event
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration

ARROW = {codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE}
JSON = {codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE}


def trajectory(n_turns: int = 2) -> list[dict]:
    tid = str(uuid.uuid4())
    events = [
        make_event(
            "trajectory_started", "run", trajectory_id=tid, seq=0, task_id="t", group_id="g", sample_index=0
        )
    ]
    for i in range(n_turns):
        events.append(
            make_event(
                "turn",
                "run",
                trajectory_id=tid,
                seq=i + 1,
                turn_index=i,
                policy_version=0,
                input_token_ids=[1, 2, 3],
                output_token_ids=[4, 5],
                output_logprobs=[-0.1, -0.2],
            )
        )
    return events


def turn(**overrides: object) -> dict:
    event = trajectory(1)[1]
    event.update(overrides)
    return event


def as_json(event: dict) -> bytes:
    return codec.encode_json([event])


def chunked(events: list[dict], drop: int | None = None, corrupt: int | None = None) -> list[Message]:
    value = codec.encode_arrow(events)
    parts = chunking.split(
        Message(key=events[0]["trajectory_id"], value=value * 1, headers=dict(ARROW)), 20_000, "identity"
    )
    assert len(parts) > 2
    if corrupt is not None:
        parts[corrupt].value = b"\x00" * len(parts[corrupt].value)
    return [p for i, p in enumerate(parts) if i != drop]


def big_trajectory() -> list[dict]:
    events = trajectory(1)
    events[1]["output_token_ids"] = list(range(20_000))
    events[1]["output_logprobs"] = [-0.5] * 20_000
    return events


BAD_MESSAGES = {
    "garbage bytes": lambda: [Message("k1", b"\x00\xffnot arrow at all" * 10, dict(ARROW))],
    "truncated arrow": lambda: [Message("k2", codec.encode_arrow(trajectory())[:300], dict(ARROW))],
    "invalid json": lambda: [Message("k3", b'{"event_id": "x", ', dict(JSON))],
    "json not an object": lambda: [Message("k4", b"[42]", dict(JSON))],
    "json missing fields": lambda: [
        Message("k5", json.dumps([{"event_type": "turn", "seq": 1}]).encode(), dict(JSON))
    ],
    "json wrong types": lambda: [
        Message("k6", as_json(turn(seq="not-a-number", output_token_ids="abc")), dict(JSON))
    ],
    "unknown event type": lambda: [Message("k7", as_json(turn(event_type="teleport")), dict(JSON))],
    "unknown schema version": lambda: [Message("k8", as_json(turn(schema_version=99)), dict(JSON))],
    "logprobs length mismatch": lambda: [
        Message("k9", codec.encode_arrow([turn(output_logprobs=[-0.1])]), dict(ARROW))
    ],
    "positive logprob": lambda: [Message("k10", as_json(turn(output_logprobs=[0.5, -0.1])), dict(JSON))],
    "negative token id": lambda: [Message("k11", as_json(turn(output_token_ids=[-3, 4])), dict(JSON))],
    "unknown content type": lambda: [
        Message("k12", b"<xml/>", {codec.CONTENT_TYPE_HEADER: "application/xml"})
    ],
    "chunk set missing a chunk": lambda: chunked(big_trajectory(), drop=1),
    "chunk set corrupted": lambda: chunked(big_trajectory(), corrupt=1),
}


def test_every_bad_message_is_a_dead_letter_with_a_reason_and_every_good_one_is_stored(
    lake: Lake, kafka_topic: KafkaConfig
) -> None:
    # one partition, so the incomplete chunk set is followed by enough later messages
    config = kafka_topic.model_copy(update={"topic": kafka_topic.topic + "-one", "partitions": 1})
    create_topic(config)
    good: list[dict] = []
    bad_keys: dict[str, str] = {}
    bus = KafkaBus(config)
    try:
        for kind, make in BAD_MESSAGES.items():
            events = trajectory()
            good.extend(events)
            bus.publish(events)  # good messages interleave with the bad ones
            for message in make():
                bad_keys[message.key] = kind
                bus.send(message)
            events = trajectory()
            good.extend(events)
            bus.send(Message(events[0]["trajectory_id"], codec.encode_json(events), dict(JSON)))
        big = big_trajectory()
        good.extend(big)
        for part in chunked(big):  # a complete chunk set is reassembled
            bus.send(part)
        for _ in range(30):  # later traffic lets the sink give up on the incomplete set
            events = trajectory(0)
            good.extend(events)
            bus.publish(events)
        bus.flush()
    finally:
        bus.close()

    sink_topic(lake, config, chunk_max_gap=20, max_latency_s=0.5)

    stored = lake.sql("select event_id from events").column("event_id").to_pylist()
    assert sorted(stored) == sorted(e["event_id"] for e in good)
    dead = lake.sql('select key, reason, raw, "offset" from dead_letters').to_pylist()
    assert all(row["reason"] and row["raw"] is not None and row["offset"] is not None for row in dead)
    missing = {kind for key, kind in bad_keys.items() if key not in {row["key"] for row in dead}}
    assert not missing, f"no dead letter for: {sorted(missing)}"
    reasons = " | ".join(row["reason"] for row in dead)
    expected = {
        "garbage bytes": "not a readable Arrow IPC stream",
        "invalid json": "not valid JSON",
        "json not an object": "not an event object",
        "unknown content type": "application/xml",
        "chunk set missing a chunk": "incomplete: missing chunk(s) [1]",
        "chunk set corrupted": "sha256",
        "unknown event type": "teleport",
    }
    for kind, needle in expected.items():
        assert needle in reasons, f"{kind}: no dead letter says {needle!r}"
    assert len(BAD_MESSAGES) >= 10
