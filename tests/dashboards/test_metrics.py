"""Metric queries against independent SQL over the public views, and their edge cases."""

from __future__ import annotations

import pytest

from tests.dashboards.conftest import THIN_RUN, THIN_SINGLES, THIN_V1_TASKS
from trajlake.dashboards import metrics
from trajlake.dashboards.passk import pass_at_k
from trajlake.ingest import codec
from trajlake.ingest.bus.base import Message
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig

RUN = "dash-run"
SIGNAL_RUN = "signal-run"
ZERO_SIGNAL_PER_STEP = [0, 1, 3]  # as tests/dashboards/conftest.py records them


def test_version_range_limits_every_figure_to_those_versions(dash_lake):
    assert metrics.policy_versions(dash_lake, RUN) == [0, 1, 2, 3]
    overview = metrics.overview_by_version(dash_lake, RUN, (1, 2))
    assert overview.column("policy_version").to_pylist() == [1, 2]
    behaviour = metrics.behaviour_by_version(dash_lake, RUN, (1, 2))
    assert behaviour.column("n_trajectories").to_pylist() == overview.column("n_trajectories").to_pylist()
    n_in_range = (
        dash_lake.sql(
            "select count(*) as n from trajectories where run_id = $run and finished and policy_version_min in (1, 2)",
            {"run": RUN},
        )
        .column("n")[0]
        .as_py()
    )
    assert (
        sum(metrics.turns_histogram(dash_lake, RUN, (1, 2)).column("n_trajectories").to_pylist())
        == n_in_range
    )


def test_pass_at_k_curve_averages_each_k_over_tasks_with_at_least_k_samples(dash_lake):
    curve = metrics.pass_at_k_curve(dash_lake, RUN).to_pylist()
    assert [r["k"] for r in curve] == list(range(1, 17))
    per_task = dash_lake.sql(
        """select task_id, count(*) as n, count(*) filter (where reward >= 1) as c from trajectories
            where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
            group by 1""",
        {"run": RUN},
    ).to_pylist()
    for row in curve:
        tasks = [(t["n"], t["c"]) for t in per_task if t["n"] >= row["k"]]
        assert (row["n_tasks"], row["n_tasks_total"]) == (len(tasks), len(per_task))
        if len(tasks) < metrics.MIN_TASKS:
            assert row["pass_at_k"] is None
        else:
            assert row["pass_at_k"] == pytest.approx(
                sum(pass_at_k(n, c, row["k"]) for n, c in tasks) / len(tasks)
            )
    assert curve[0]["pass_at_k"] == pytest.approx(sum(t["c"] / t["n"] for t in per_task) / len(per_task))


def test_pass_at_k_of_a_version_with_one_large_group_shows_its_coverage_not_that_groups_1(thin_lake):
    by_version = metrics.pass_at_k_by_version(thin_lake, THIN_RUN).to_pylist()
    v0 = {r["k"]: r for r in by_version if r["policy_version"] == 0}
    assert v0[1]["pass_at_k"] == pytest.approx(1 / 12) and v0[1]["n_tasks"] == THIN_SINGLES + 1
    assert v0[4] == {"policy_version": 0, "k": 4, "pass_at_k": None, "n_tasks": 1, "n_tasks_total": 12}
    assert not any(r["pass_at_k"] == 1.0 for r in v0.values())
    v1 = {r["k"]: r for r in by_version if r["policy_version"] == 1}
    assert sorted(v1) == [1, 2, 3, 4]  # no task of version 1 has a fifth sample
    assert (
        v1[4]["n_tasks"] == THIN_V1_TASKS and v1[4]["pass_at_k"] == 1.0
    )  # 2 of 4 pass: every 4 draws hold one
    assert v1[2]["pass_at_k"] == pytest.approx(1 - 1 / 6)  # C(2,2) / C(4,2) draws without a pass
    # over both versions: a k that only the large group and version 1's tasks reach says so
    curve = {r["k"]: r for r in metrics.pass_at_k_curve(thin_lake, THIN_RUN).to_pylist()}
    assert (curve[4]["n_tasks"], curve[4]["n_tasks_total"]) == (THIN_V1_TASKS + 1, 18)
    assert curve[5]["pass_at_k"] is None and curve[5]["n_tasks"] == 1


def test_pass_at_1_by_version_is_hidden_where_too_few_tasks_were_scored(thin_lake):
    rows = metrics.overview_by_version(thin_lake, THIN_RUN, min_tasks=7).to_pylist()
    assert [(r["policy_version"], r["n_tasks"]) for r in rows] == [(0, 12), (1, THIN_V1_TASKS)]
    assert rows[0]["pass_at_1"] == pytest.approx(1 / 12)
    assert rows[1]["pass_at_1"] is None  # six tasks, fewer than seven
    assert metrics.overview_by_version(thin_lake, THIN_RUN, min_tasks=6).to_pylist()[1]["pass_at_1"] == 0.5


def test_the_report_gives_each_versions_pass_at_k_with_the_tasks_it_stands_on(thin_lake):
    report = metrics.metrics_report(thin_lake, THIN_RUN)
    assert report["min_tasks"] == metrics.MIN_TASKS
    expected = metrics.pass_at_k_by_version(thin_lake, THIN_RUN).to_pylist()
    for version in report["versions"]:
        want = [{k: v for k, v in r.items() if k != "policy_version"} for r in expected
                if r["policy_version"] == version["policy_version"]]  # fmt: skip
        assert version["pass_at_k"] == want
    assert report["pass_at_k"] == metrics.pass_at_k_curve(thin_lake, THIN_RUN).to_pylist()


def test_system_failures_are_never_scored_as_reward_zero(dash_lake):
    scored = metrics.overview_by_version(dash_lake, RUN).to_pylist()
    systems = (
        dash_lake.sql(
            "select count(*) as n from trajectories where run_id = $run and failure_origin = 'system'",
            {"run": RUN},
        )
        .column("n")[0]
        .as_py()
    )
    assert systems > 0
    assert sum(r["n_trajectories"] - r["n_scored"] for r in scored) == systems


ENTROPY_FROM_TURNS = """select policy_version, -sum(sum_logprob) / sum(n_output_tokens) as entropy,
    sum(n_output_tokens) as n_tokens, count(*) as n_turns from turns where run_id = $run
    group by policy_version order by policy_version"""


def assert_entropy_matches_turns(lake, run_id):
    got = metrics.rollout_entropy(lake, run_id).to_pylist()
    expected = lake.sql(ENTROPY_FROM_TURNS, {"run": run_id}).to_pylist()
    assert [(r["policy_version"], r["n_tokens"], r["n_turns"]) for r in got] == [
        (r["policy_version"], r["n_tokens"], r["n_turns"]) for r in expected
    ]
    assert [r["entropy"] for r in got] == pytest.approx([r["entropy"] for r in expected], rel=1e-9)


def test_rollout_entropy_counts_each_turn_at_its_own_version_when_trajectories_span_versions(dash_lake):
    spanning = dash_lake.sql(
        "select count(*) as n from trajectories where run_id = $run and policy_version_max > policy_version_min",
        {"run": RUN},
    )
    assert spanning.column("n")[0].as_py() > 0
    assert_entropy_matches_turns(dash_lake, RUN)
    few = metrics.rollout_entropy(dash_lake, RUN, (1, 2)).column("policy_version").to_pylist()
    assert few == [1, 2]


def test_rollout_entropy_of_a_lake_written_before_turns_by_version(tmp_path, monkeypatch):
    from trajlake.store import lake as lake_module
    from trajlake.store.lake import Lake
    from trajlake.store.projections import rebuild

    def record(root, trajectory_id, logprob):
        bus = InProcessBus()
        with Recorder(bus, "run").start("task", trajectory_id=trajectory_id) as t:
            t.turn([4, 5], [logprob, -0.5], 1, input_token_ids=[1])
            t.turn([6], [logprob], 2, input_token_ids=[2])
            t.finish("completed")
        DeltaSink(Lake(root), bus, SinkConfig()).run(until_idle_s=0.0)

    root = tmp_path / "lake"
    schema = lake_module.SCHEMAS["trajectories"]
    with monkeypatch.context() as m:
        m.setitem(
            lake_module.SCHEMAS, "trajectories", schema.remove(schema.get_field_index("turns_by_version"))
        )
        record(root, "t-old", -1.0)
    assert "turns_by_version" not in Lake(root).stored_columns("trajectories")
    assert_entropy_matches_turns(Lake(root), "run")
    record(root, "t-new", -2.0)  # the column is added; the old trajectory's stays null
    assert_entropy_matches_turns(Lake(root), "run")
    rebuild(Lake(root))
    lake = Lake(root)
    assert (
        lake.sql("select count(*) as n from trajectories where turns_by_version is null")
        .column("n")[0]
        .as_py()
        == 0
    )
    assert_entropy_matches_turns(lake, "run")
    assert [r["n_turns"] for r in metrics.rollout_entropy(lake, "run").to_pylist()] == [2, 2]


def test_ingest_lag_covers_every_event_of_the_run(dash_lake):
    lag = metrics.ingest_lag(dash_lake, RUN).to_pylist()
    n_events = (
        dash_lake.sql("select count(*) as n from events where run_id = $run", {"run": RUN})
        .column("n")[0]
        .as_py()
    )
    assert sum(r["n_events"] for r in lag) == n_events
    assert all(0 <= r["lag_p50_s"] <= r["lag_p95_s"] <= r["lag_max_s"] < 600 for r in lag)


def test_event_time_extent_and_lag_of_runs_alone_in_their_files_or_sharing_one(tmp_path):
    """A run alone in its files is read from the Delta statistics, runs sharing a file from a scan:
    both give the run's first and last event, and the lag counts each of its events once."""
    import time

    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    for runs in (["shared-a", "shared-b"], ["alone"]):
        bus = InProcessBus(partitions=1)
        for i, run in enumerate(runs * 2):
            with Recorder(bus, run).start(f"task-{i}") as t:
                t.turn([4, 5], [-0.1, -0.5], 1, input_token_ids=[1])
                t.finish("completed")
        DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    files = lake.file_stats("events").select(["min.run_id", "max.run_id"]).to_pylist()
    assert sorted(tuple(f.values()) for f in files) == [("alone", "alone"), ("shared-a", "shared-b")]
    for run in ("shared-a", "shared-b", "alone"):
        expected = lake.sql(
            "select min(event_time) as lo, max(event_time) as hi, count(*) as n from events where run_id = $run",
            {"run": run},
        ).to_pylist()[0]
        assert metrics.event_time_extent(lake, run) == (expected["lo"], expected["hi"])
        since = metrics.freshness_s(lake, run)
        assert 0 <= since <= time.time() - expected["hi"].timestamp()
        assert sum(metrics.ingest_lag(lake, run).column("n_events").to_pylist()) == expected["n"]
    assert metrics.event_time_extent(lake, "no-such-run") is None
    assert metrics.freshness_s(lake, "no-such-run") is None


def test_buffer_composition_counts_each_arrival_and_each_consumed_trajectory_once(dash_lake):
    finished = dash_lake.sql(
        "select count(*) as n from trajectories where run_id = $run and finished", {"run": RUN}
    )
    for by in ("difficulty", "length"):
        arrivals = metrics.buffer_composition(dash_lake, RUN, by, "arrivals")
        assert sum(arrivals.column("n_trajectories").to_pylist()) == finished.column("n")[0].as_py()
        consumed = metrics.buffer_composition(dash_lake, RUN, by, "consumption")
        assert sorted(set(consumed.column("step").to_pylist())) == [0, 1, 2]
        assert sum(consumed.column("n_trajectories").to_pylist()) == 48


def test_zero_signal_groups_are_counted_per_trainer_step(signal_lake):
    counted = metrics.zero_signal_groups(signal_lake, SIGNAL_RUN).to_pylist()
    assert [(r["step"], r["n_groups"], r["n_zero_signal_groups"]) for r in counted] == [
        (step, 3, n) for step, n in enumerate(ZERO_SIGNAL_PER_STEP)
    ]
    assert [r["zero_signal_share"] for r in counted] == pytest.approx([n / 3 for n in ZERO_SIGNAL_PER_STEP])
    # the same groups, found from the advantages the trainer kept: all of them 0
    by_advantage = signal_lake.sql(
        """select step, count(*) filter (where zero) as n from (
               select b.step, t.group_id, max(abs(b.advantage)) = 0 as zero
               from batch_consumption b join trajectories t using (run_id, trajectory_id)
               where b.run_id = $run group by all)
           group by step order by step""",
        {"run": SIGNAL_RUN},
    )
    assert by_advantage.column("n").to_pylist() == ZERO_SIGNAL_PER_STEP


def test_a_run_without_consumed_batches_has_no_zero_signal_steps(bare_lake):
    assert metrics.zero_signal_groups(bare_lake, RUN).num_rows == 0


def test_browser_turns_hold_the_tokens_of_the_trajectory_view(dash_lake):
    tid = metrics.find_trajectories(dash_lake, RUN, limit=1).column("trajectory_id")[0].as_py()
    turns = metrics.trajectory_turns(dash_lake, RUN, tid).to_pylist()
    whole = (
        dash_lake.sql("select token_ids from trajectories where trajectory_id = $id", {"id": tid})
        .column(0)[0]
        .as_py()
    )
    assert [t for turn in turns for t in (turn["input_token_ids"] or []) + turn["output_token_ids"]] == whole


def test_browser_filters_by_status_origin_task_and_reward(dash_lake):
    failed = metrics.find_trajectories(dash_lake, RUN, failure_origin=("system",)).to_pylist()
    assert failed and all(r["failure_origin"] == "system" for r in failed)
    ok = metrics.find_trajectories(
        dash_lake, RUN, failure_origin=("none",), reward_range=(1.0, 1.0)
    ).to_pylist()
    assert ok and all(r["failure_origin"] is None and r["reward"] == 1.0 for r in ok)
    task = failed[0]["task_id"]
    assert {
        r["task_id"] for r in metrics.find_trajectories(dash_lake, RUN, task_contains=task[-3:]).to_pylist()
    } >= {task}


def test_dead_letters_are_counted_by_reason(tmp_path):
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    bus = InProcessBus(partitions=1)
    with Recorder(bus, "dl-run").start("task-1") as traj:
        traj.turn([1, 2], [-0.1, -0.2], 0, input_token_ids=[3])
        traj.reward(1.0)
        traj.finish("completed")
    bad = codec.encode_json([{"event_type": "turn", "run_id": "dl-run", "trajectory_id": "t-bad", "seq": 0,
                              "output_token_ids": [1], "output_logprobs": [0.5]}])  # fmt: skip
    bus.send(Message(key="t-bad", value=bad, headers={codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE}))
    bus.send(
        Message(
            key="t-junk", value=b"\x00not json", headers={codec.CONTENT_TYPE_HEADER: codec.JSON_CONTENT_TYPE}
        )
    )
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    reasons = metrics.dead_letter_reasons(lake, "dl-run").to_pylist()
    assert sum(r["n_dead_letters"] for r in reasons) == 2
    recent = metrics.recent_dead_letters(lake, "dl-run").to_pylist()
    assert len(recent) == 2 and all(r["raw_bytes"] > 0 for r in recent)


RUNS_SQL = "select run_id from trajectories group by run_id order by max(started_at) desc nulls last"


def test_the_run_list_comes_from_the_delta_log_when_each_file_holds_one_run(two_runs_lake, monkeypatch):
    expected = two_runs_lake.sql(RUNS_SQL).column(0).to_pylist()
    assert len(expected) == 2
    monkeypatch.setattr(metrics, "query", lambda *a, **k: pytest.fail("the run list scanned the files"))
    assert metrics.runs(two_runs_lake) == expected


def test_the_run_list_scans_when_a_file_holds_several_runs(lake, bus, drain):
    from trajlake.ingest.recorder import Recorder

    for run in ("run-old", "run-new"):  # one sink batch, so one file of each table holds both
        with Recorder(bus, run, vocab_size=100).start(task_id="t") as traj:
            traj.turn([4, 5], [-0.1, -0.2], 0, input_token_ids=[1])
            traj.finish("completed")
    drain()
    files = lake.file_stats("trajectories")
    assert files.num_rows == 1 and files.column("min.run_id")[0] != files.column("max.run_id")[0]
    assert metrics.runs(lake) == ["run-new", "run-old"] == lake.sql(RUNS_SQL).column(0).to_pylist()


def test_an_empty_lake_has_no_runs(tmp_path):
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "empty")
    assert metrics.runs(lake) == []
    assert metrics.trainer_entropy(lake, "x").num_rows == 0
    assert metrics.ingest_lag(lake, "x").num_rows == 0


def test_a_trajectory_of_unknown_version_counts_for_the_run_but_has_no_place_on_the_version_axis(tmp_path):
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    bus = InProcessBus()
    recorder = Recorder(bus, "unknown-version", vocab_size=100)
    for i, version in enumerate([0, 0, None, None]):
        t = recorder.start("task", "g", i)
        t.turn([1, 2], [-0.5, -1.0], version, input_token_ids=[3])
        t.reward(float(i % 2))
        t.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0)
    outcomes = metrics.task_outcomes(lake, "unknown-version").to_pylist()
    assert [(r["policy_version"], r["n"]) for r in outcomes] == [(0, 2)]  # no version "None"
    entropy = metrics.rollout_entropy(lake, "unknown-version").to_pylist()
    assert [(r["policy_version"], r["n_turns"]) for r in entropy] == [(0, 2)]
    curve = metrics.pass_at_k_curve(lake, "unknown-version").to_pylist()
    assert [r["n_tasks"] for r in curve if r["k"] == 4] == [
        1
    ]  # the run's figure: all four samples of the task
    lake.close()
