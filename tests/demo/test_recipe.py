"""`trajlake demo`: a shortened run learns, fills every table, and shows every failure label."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from trajlake.cli import main
from trajlake.dashboards.commands import APP
from trajlake.schemas.events import FAILURE_LABELS
from trajlake.store.lake import Lake

TABLES = ("events", "trajectories", "turns", "tool_calls", "dead_letters", "policy_versions", "trainer_steps",
          "batch_consumption")  # fmt: skip


def run_demo_cli(tmp_path: Path, run_id: str, *args: str) -> tuple[int, dict, Lake]:
    summary_path = tmp_path / "summary.json"
    code = main(
        ["demo", "--lake", str(tmp_path / "lake"), "--run-id", run_id, "--json", str(summary_path), *args]
    )
    return code, json.loads(summary_path.read_text()), Lake(tmp_path / "lake")


def reward_by_version(lake: Lake, run_id: str) -> list[float]:
    """Mean scored reward per policy version, read straight from the lake."""
    rows = lake.sql(
        """select policy_version_min as v, avg(reward) as r from trajectories
            where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
            group by v order by v""",
        {"run": run_id},
    )
    return rows.column("r").to_pylist()


def rows_of_run(lake: Lake, table: str, run_id: str) -> int:
    return lake.sql(f"select count(*) from {table} where run_id = $run", {"run": run_id}).column(0)[0].as_py()


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory) -> tuple[int, dict, Lake]:
    """One shortened demo (threads, 24 steps, doubled fault rates) shared by the tests below."""
    tmp_path = tmp_path_factory.mktemp("demo")
    return run_demo_cli(
        tmp_path, "short", "--engine", "tiny", "--no-ray", "--steps", "24", "--fault-rate", "2"
    )


@pytest.mark.integration
@pytest.mark.slow
def test_a_short_demo_learns_and_fills_every_table(short_demo):
    code, summary, lake = short_demo

    assert code == 0, "the demo exits 1 when it did not learn"
    rewards = reward_by_version(lake, "short")
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    assert last >= first + 0.2, f"reward by version did not rise enough: {rewards}"
    assert summary["learned"] and summary["steps"] == 24

    empty = [t for t in TABLES if rows_of_run(lake, t, "short") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    labels = (
        lake.sql("select distinct failure_label from trajectories where run_id = 'short'")
        .column(0)
        .to_pylist()
    )
    assert set(FAILURE_LABELS) <= set(labels)
    spanning = (
        lake.sql(
            "select count(*) from trajectories where run_id = 'short' and policy_version_max > policy_version_min"
        )
        .column(0)[0]
        .as_py()
    )
    assert spanning > 0, "no trajectory picked up a new policy version mid-episode"
    stale = (
        lake.sql("select max(staleness) from batch_consumption where run_id = 'short'").column(0)[0].as_py()
    )
    assert stale <= 2  # the default max_staleness

    overfit = summary["overfit"]
    assert overfit["tasks"] == 32 and overfit["reward_after"] > overfit["reward_before"]
    assert rows_of_run(lake, "trajectories", "short-overfit") >= 32 * 8


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("run_id", ["short", "short-overfit"])
def test_every_consumed_trajectory_keeps_the_advantage_the_trainer_computed(short_demo, run_id):
    import torch

    from trajlake.dashboards import metrics
    from trajlake.trainer.losses import compute_advantages

    _, _, lake = short_demo
    rows = lake.sql(
        """select b.step, b.advantage, t.group_id, t.reward from batch_consumption b
           join trajectories t using (run_id, trajectory_id) where b.run_id = $run order by b.step""",
        {"run": run_id},
    ).to_pylist()
    assert rows and all(r["advantage"] is not None for r in rows)
    zero_signal = []
    for step in sorted({r["step"] for r in rows}):
        mine = [r for r in rows if r["step"] == step]
        groups = sorted({r["group_id"] for r in mine})
        index = torch.tensor([groups.index(r["group_id"]) for r in mine])
        expected = compute_advantages("drgrpo", torch.tensor([r["reward"] for r in mine]), index)
        assert [r["advantage"] for r in mine] == pytest.approx(expected.tolist(), abs=1e-6)
        zero_signal.append(sum(all(r["advantage"] == 0 for r in mine if r["group_id"] == g) for g in groups))
    counted = metrics.zero_signal_groups(lake, run_id).column("n_zero_signal_groups").to_pylist()
    assert counted == zero_signal  # the groups the figure counts are exactly those the trainer gave no signal


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "page", ["overview", "entropy", "behaviour", "failures", "async", "health", "browser", "sql"]
)
def test_every_dashboard_page_shows_the_demo_run(short_demo, monkeypatch, page):
    from streamlit.testing.v1 import AppTest

    _, _, lake = short_demo
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = page
    at.query_params["run"] = "short"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page in ("overview", "entropy", "behaviour", "failures", "async"):
        assert list(at.get("vega_lite_chart")), f"the {page} page drew no chart of the demo run"


@pytest.mark.integration
@pytest.mark.slow
def test_doctor_raises_no_health_alert_on_the_demo(short_demo, capsys):
    _, _, lake = short_demo
    main(["doctor", "--lake", lake.root, "--run", "short", "--format", "json"])
    health = json.loads(capsys.readouterr().out)["health"]
    assert health["alerts"] == []
    status = {s["name"]: s["status"] for s in health["signals"]}
    judged = ("entropy_collapse", "reward_length", "advantage_drift", "tool_error_spike")
    assert {name: status[name] for name in judged} == dict.fromkeys(judged, "ok")  # computed, and calm


@pytest.mark.integration
@pytest.mark.slow
def test_ablate_replays_the_demo_run(short_demo, capsys):
    _, _, lake = short_demo
    capsys.readouterr()
    assert main(["ablate", "--lake", lake.root, "--run", "short"]) == 0
    table = capsys.readouterr().out
    assert "ablation of run short" in table and "token_mean" in table and "prompt_mean" in table


def test_demo_rejects_bad_settings_with_the_option_to_fix(tmp_path, capsys):
    code = main(["demo", "--lake", str(tmp_path / "lake"), "--steps", "1"])
    assert code == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_over_kafka_fills_the_same_tables(tmp_path, kafka_topic, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_KAFKA_SPOOL_DIR", str(tmp_path / "spool"))
    code, summary, lake = run_demo_cli(
        tmp_path, "kafka", "--engine", "tiny", "--no-ray", "--steps", "6", "--overfit-tasks", "0", "--fault-rate", "3",
        "--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic,
    )  # fmt: skip

    assert code in (0, 1)  # six steps are too few to judge learning; the path through Kafka is under test
    assert summary["steps"] == 6
    empty = [t for t in TABLES if rows_of_run(lake, t, "kafka") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    sources = lake.sql("select distinct topic from dead_letters where run_id = 'kafka'").column(0).to_pylist()
    assert sources == [kafka_topic.topic]
    assert rows_of_run(lake, "trajectories", "kafka") == summary["trajectories"]


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_on_local_ray_workers_fills_the_same_tables(tmp_path):
    code, _, lake = run_demo_cli(
        tmp_path, "ray", "--engine", "tiny", "--steps", "8", "--overfit-tasks", "0", "--fault-rate", "3"
    )

    assert code in (0, 1)  # eight steps are too few to judge learning; the Ray path is under test
    empty = [t for t in TABLES if rows_of_run(lake, t, "ray") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    producers = lake.sql(
        "select distinct producer_id from events where run_id = 'ray' and event_type = 'turn'"
    )
    this_process = f"{socket.gethostname()}:{os.getpid()}"
    assert this_process not in producers.column(0).to_pylist()  # episodes ran in Ray worker processes
    versions = lake.sql("select max(policy_version) from turns where run_id = 'ray'").column(0)[0].as_py()
    assert versions >= 4  # the workers picked up the weights the trainer published


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_on_vllm_learns_and_turns_carry_the_servers_weight_versions(
    tmp_path, vllm_server, monkeypatch
):
    code, summary, lake = run_demo_cli(
        tmp_path, "engine", "--engine", "vllm", "--vllm-url", vllm_server.url, "--model-dir", str(vllm_server.model_dir),
        "--no-ray", "--steps", "24", "--overfit-tasks", "0",
    )  # fmt: skip

    rewards = reward_by_version(lake, "engine")
    # a failure shows each step's (grad norm, entropy) as well: CI keeps no lake to look into
    steps = lake.sql(
        "select round(grad_norm, 2) as grad, round(entropy, 3) as entropy from trainer_steps where run_id = 'engine' order by step"
    ).to_pylist()
    assert code == 0 and summary["learned"], (
        f"reward by version did not rise enough: {rewards}; steps: {steps}"
    )
    # every turn names the weights the server had when it sampled it (its weight_versions spans)
    versions = (
        lake.sql("select distinct policy_version from turns where run_id = 'engine'").column(0).to_pylist()
    )
    assert 0 in versions and max(versions) >= 20
    models = lake.sql("select distinct model from trajectories where run_id = 'engine'").column(0).to_pylist()
    assert models == [str(vllm_server.model_dir.resolve())]  # the tokenizer that decodes them
    assert (
        lake.sql("select count(*) from trajectories where run_id = 'engine' and tito_drift")
        .column(0)[0]
        .as_py()
        == 0
    )
    # the mismatch is the engine's against the trainer's: real, and healthy in float32
    mismatch = (
        lake.sql(
            "select mismatch from trainer_steps where run_id = 'engine' and mismatch is not null order by step"
        )
        .column(0)
        .to_pylist()
    )
    assert mismatch and all(m < 0.03 for m in mismatch) and any(m > 0 for m in mismatch)

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "async"
    at.query_params["run"] = "engine"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = {m.label: m.value for m in at.metric}["Logprob mismatch (latest step)"]
    latest = mismatch[-1]
    assert float(shown) == pytest.approx(latest, rel=0.01, abs=1e-12) and float(shown) < 0.03, shown


@pytest.mark.integration
@pytest.mark.slow
def test_the_vllm_demo_on_ray_workers_samples_from_the_server_in_worker_processes(tmp_path, vllm_server):
    code, _, lake = run_demo_cli(
        tmp_path, "ray-engine", "--engine", "vllm", "--vllm-url", vllm_server.url,
        "--model-dir", str(vllm_server.model_dir), "--workers", "4", "--steps", "5", "--overfit-tasks", "0",
    )  # fmt: skip

    assert code in (0, 1)  # four steps are too few to judge learning; the Ray path is under test
    producers = (
        lake.sql(
            "select distinct producer_id from events where run_id = 'ray-engine' and event_type = 'turn'"
        )
        .column(0)
        .to_pylist()
    )
    assert f"{socket.gethostname()}:{os.getpid()}" not in producers  # episodes ran in Ray worker processes
    versions = (
        lake.sql("select max(policy_version) from turns where run_id = 'ray-engine'").column(0)[0].as_py()
    )
    assert versions >= 2  # the server's weights changed under the running workers
