"""Loadgen's column batches: the events it writes are the Recorder's, valid at ingest, fields from the model."""

from __future__ import annotations

import numpy as np
import pytest

from trajlake.rollout.loadgen import LoadgenConfig, _ColumnBatch, generate
from trajlake.schemas import EVENTS_SCHEMA


def test_a_small_workload_lands_whole_and_valid(lake, bus, drain) -> None:
    counts = generate(bus, LoadgenConfig(trajectories=12, group_size=4, seed=1))
    drain()
    assert lake.sql("select count(*) as n from events").column("n")[0].as_py() == counts.events
    assert lake.sql("select count(*) as n from dead_letters").column("n")[0].as_py() == 0
    assert lake.sql("select count(*) as n from trajectories").column("n")[0].as_py() == 12


def test_a_run_grown_by_two_calls_keeps_its_groups_apart_and_its_versions_rising(lake, bus, drain) -> None:
    generate(bus, LoadgenConfig(trajectories=8, group_size=4, policy_versions=2, seed=1))
    generate(
        bus,
        LoadgenConfig(
            trajectories=8, group_size=4, policy_versions=2, first_group=2, first_version=2, seed=2
        ),
    )
    drain()
    groups = lake.sql(
        "select group_id, count(*) as n, min(policy_version_min) as v from trajectories group by group_id order by group_id"
    ).to_pylist()
    assert [(g["n"], g["v"]) for g in groups] == [(4, 0), (4, 1), (4, 2), (4, 3)]
    assert len({g["group_id"] for g in groups}) == 4


def test_batches_hold_every_events_column_and_encode_json_fields() -> None:
    batch = _ColumnBatch("r", vocab_size=100)
    batch.start(task_id="t", group_id="g", sample_index=0, sampling_params={"temperature": 1.0})
    batch.finish("completed")
    table = batch.table()
    assert table.schema.equals(EVENTS_SCHEMA)
    assert table.column("sampling_params").to_pylist() == ['{"temperature":1.0}', None]


def test_a_field_the_event_type_does_not_carry_is_refused() -> None:
    batch = _ColumnBatch("r", vocab_size=100)
    with pytest.raises(TypeError, match="carries no field"):
        batch.start(task_id="t", group_id="g", sample_index=0, sampling_params={}, status="completed")


def test_a_batch_takes_a_turns_advantage() -> None:
    batch = _ColumnBatch("r", vocab_size=100)
    batch.start(task_id="t", group_id="g", sample_index=0, sampling_params={})
    ids = np.array([1, 2], dtype=np.int32)
    batch.turn(ids, np.array([-0.1, -0.2], dtype=np.float32), 0, input_token_ids=ids, advantage=-0.5)
    batch.turn(ids, np.array([-0.1, -0.2], dtype=np.float32), 0, input_token_ids=ids)
    batch.finish("completed")
    assert batch.table().column("advantage").to_pylist() == [None, -0.5, None, None]
