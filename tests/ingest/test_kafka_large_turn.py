"""A 200K-token turn crosses a broker with default message limits (about 1 MB) intact."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tests.fixtures.kafka import sink_topic
from trajlake.ingest.bus.kafka_publisher import KafkaPublisher
from trajlake.ingest.config import KafkaConfig
from trajlake.schemas import make_event
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration


def test_a_200k_token_turn_is_split_and_stored_intact(lake: Lake, kafka_topic: KafkaConfig) -> None:
    rng = np.random.default_rng(7)
    n = 200_000
    ids = rng.integers(0, 151_936, n).astype(np.int32).tolist()
    logprobs = (-rng.exponential(0.3, n)).astype(np.float32).tolist()
    tid = str(uuid.uuid4())
    events = [
        make_event(
            "trajectory_started", "big", trajectory_id=tid, seq=0, task_id="t", group_id="g", sample_index=0
        ),
        make_event(
            "turn",
            "big",
            trajectory_id=tid,
            seq=1,
            turn_index=0,
            policy_version=3,
            input_token_ids=ids,
            output_token_ids=ids,
            output_logprobs=logprobs,
            loss_mask=[True] * n,
        ),
    ]
    bus = KafkaPublisher(kafka_topic)
    try:
        bus.publish(events)
        bus.flush()
        assert bus.chunked_total == 1  # it did not fit in one message
    finally:
        bus.close()
    sink_topic(lake, kafka_topic)
    row = lake.read("events", where="event_type = 'turn'").to_pylist()
    assert len(row) == 1
    assert row[0]["output_token_ids"] == ids
    assert row[0]["input_token_ids"] == ids
    assert row[0]["output_logprobs"] == logprobs
    assert row[0]["loss_mask"] == [True] * n
    assert lake.sql("select count(*) as n from dead_letters").to_pylist()[0]["n"] == 0
