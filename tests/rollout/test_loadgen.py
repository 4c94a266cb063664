"""Loadgen's column batches: the events it writes are the Recorder's, valid at ingest, fields from the model;
stopped by a signal, it flushes what it generated and says how much."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from tests.fixtures.kafka import sink_topic, wait_for_log
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


@pytest.mark.integration  # the CLI in a process of its own, stopped with a real signal
@pytest.mark.parametrize(
    ("bus", "sig"),
    [
        ("inprocess", signal.SIGINT),
        ("inprocess", signal.SIGTERM),
        ("kafka", signal.SIGINT),
        ("kafka", signal.SIGTERM),
    ],
    ids=["inprocess-SIGINT", "inprocess-SIGTERM", "kafka-SIGINT", "kafka-SIGTERM"],
)
def test_a_stopped_loadgen_stores_every_trajectory_it_reports(
    request, tmp_path, lake, trajlake_cli, bus, sig
):
    """Ctrl-C (or a pre-emption's SIGTERM) mid-run: what loadgen generated is flushed, and its report says how much."""
    args = ["loadgen", "--lake", str(lake.root), "--trajectories", "200000", "--json"]
    if bus == "kafka":
        kafka = request.getfixturevalue("kafka_topic")
        args += ["--kafka", kafka.bootstrap, "--topic", kafka.topic]
    proc = trajlake_cli(*args)
    wait_for_log(proc, "loadgen: ")  # a progress line: it is producing, a batch in hand
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    err = proc.log_path.read_text()
    assert proc.returncode == 128 + sig, err
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["stopped_by"] == sig.name and 0 < counts["trajectories"] < 200_000
    assert (
        f"stopped by {sig.name} after {counts['trajectories']:,} of 200,000 trajectories; flushed all" in err
    )
    if bus == "kafka":
        assert counts["undelivered_messages"] == 0
        sink_topic(lake, kafka)
    stored = lake.sql("select count(*) as n, count(*) filter (where finished) as done from trajectories")
    assert stored.to_pylist() == [{"n": counts["trajectories"], "done": counts["trajectories"]}]
    assert lake.sql("select count(*) as n from events").column("n")[0].as_py() == counts["events"]
