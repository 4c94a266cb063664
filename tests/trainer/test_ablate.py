"""`trajlake ablate` and `trajlake select-overfit` on stored runs."""

from __future__ import annotations

import json

import pytest

from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.lake import Lake
from trajlake.trainer.ablate import AblationConfig, run_ablation

SMALL = dict(
    run_id="lg", trajectories=32, group_size=4, turns=2, prompt_tokens=16, output_tokens=8, env_tokens=4,
    vocab_size=300, policy_versions=2, seed=1,
)  # fmt: skip


@pytest.fixture(scope="module")
def loadgen_run(tmp_path_factory):
    """A small loadgen run, shared by the module's tests (ablations only read the lake)."""
    lake, bus = Lake(tmp_path_factory.mktemp("ablate") / "lake"), InProcessBus()
    generate(bus, LoadgenConfig(**SMALL))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def test_ablate_on_a_loadgen_run_prints_its_table_and_writes_json(loadgen_run, tmp_path, capsys):
    path = tmp_path / "ablate.json"
    code = main(["ablate", "--lake", loadgen_run.root, "--run", "lg", "--steps", "2", "--seeds", "2",
                 "--groups-per-batch", "2", "--json", str(path)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("ablation of run lg: 2 batches")
    assert [c.strip() for c in lines[1].split(" | ")][:4] == [
        "aggregation",
        "policy_loss",
        "loss",
        "grad_norm",
    ]
    assert len(lines) == 3 + 9 + 1  # title, header, rule, 3 aggregations × 3 losses, row count
    assert lines[-1] == "(9 rows)"
    report = json.loads(path.read_text())
    assert {(c["aggregation"], c["policy_loss"]) for c in report["configs"]} == {
        (a, p) for a in ("token_mean", "sequence_mean", "prompt_mean") for p in ("ppo", "dppo", "glm5")
    }
    for config in report["configs"]:
        for name in ("loss", "grad_norm", "weight_spread", "masked_fraction"):
            assert len(config["metrics"][name]["values"]) == 2
    spread = {
        c["aggregation"]: c["metrics"]["weight_spread"]["mean"]
        for c in report["configs"]
        if c["policy_loss"] == "ppo"
    }
    assert spread["prompt_mean"] == pytest.approx(0.0, abs=1e-9)  # every prompt weighs the same
    assert spread["token_mean"] > 0  # long trajectories weigh more


def test_ablate_as_csv_gives_each_mean_and_std_a_column(loadgen_run, capsys):
    import csv
    import io

    args = [
        "--lake",
        loadgen_run.root,
        "--run",
        "lg",
        "--steps",
        "1",
        "--policy-loss",
        "ppo",
        "--format",
        "csv",
    ]
    assert main(["ablate", *args]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["aggregation"] for r in rows] == ["token_mean", "sequence_mean", "prompt_mean"]
    assert float(rows[0]["loss_mean"]) != 0 and float(rows[0]["loss_std"]) >= 0


def test_replays_are_identical_for_the_same_data_and_seeds(loadgen_run):
    config = AblationConfig(
        run_id="lg", aggregations=["token_mean"], policy_losses=["ppo", "dppo"], seeds=2, groups_per_batch=2
    )
    first, second = run_ablation(loadgen_run, config), run_ablation(loadgen_run, config)
    assert first == second
    ppo, dppo = first["configs"]
    assert ppo["metrics"]["loss"]["values"] != dppo["metrics"]["loss"]["values"]


def test_training_mode_reports_reward_proxy_and_behaviour(loadgen_run):
    config = AblationConfig(
        run_id="lg", aggregations=["prompt_mean"], policy_losses=["glm5"], seeds=2, train=True, lr=0.01
    )
    (result,) = run_ablation(loadgen_run, config)["configs"]
    assert {"reward_proxy", "entropy", "drift"} <= set(result["metrics"])
    assert result["metrics"]["drift"]["mean"] > 0


def test_bad_names_and_unknown_runs_are_usage_errors(loadgen_run, capsys):
    assert main(["ablate", "--lake", loadgen_run.root, "--run", "lg", "--policy-loss", "ppo,reinforce"]) == 2
    assert "policy_loss must be one of" in capsys.readouterr().err
    assert main(["ablate", "--lake", loadgen_run.root, "--run", "nope"]) == 2
    assert "no finished groups" in capsys.readouterr().err


def test_select_overfit_picks_tasks_with_reward_variance(lake, make_run, spec, capsys):
    specs = [spec("mixed1", r) for r in (1.0, 0.0, 1.0)] + [spec("mixed2", r) for r in (0.0, 0.0, 1.0)]
    specs += [spec("solved", 1.0), spec("solved", 1.0)]
    specs += [spec("broken", 1.0), spec("broken", None, status="error", origin="system")]
    make_run(specs)
    assert (
        main(["select-overfit", "--lake", lake.root, "--run", "run-t", "--n", "2", "--format", "json"]) == 0
    )
    tasks = json.loads(capsys.readouterr().out)
    assert [t["task_id"] for t in tasks] == ["task-mixed1", "task-mixed2"]
    assert tasks[0]["n_samples"] == 3
    assert main(["select-overfit", "--lake", lake.root, "--run", "run-t", "--n", "32"]) == 1
    captured = capsys.readouterr()
    assert "only 2 of 32 tasks" in captured.err and "task-mixed1" in captured.out
