"""`trajlake ablate` and `trajlake select-overfit` on stored runs: a run its trainer recorded is replayed
through the run's own model and checkpoints, any other run through fresh tiny GRUs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import tampered_copy
from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
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
    assert lines[0].startswith("ablation of run lg: 2 batches") and "2 seeds" in lines[0]
    assert lines[1].startswith("model: a freshly initialised tiny GRU (no model recorded for the run)")
    assert [c.strip() for c in lines[2].split(" | ")][:4] == [
        "aggregation",
        "policy_loss",
        "loss",
        "grad_norm",
    ]
    assert len(lines) == 4 + 9 + 1  # title, model, header, rule, 3 aggregations × 3 losses, row count
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
    assert {"reward_proxy", "entropy_after", "kl_to_start", "drift"} <= set(result["metrics"])
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


def train_run(root: Path, sampler_seed: int = 0, flat_groups: int = 0) -> Path:
    """A run the reference trainer trained for 3 steps (tiny policy, ppo, token_mean): its consumed
    batches, checkpoints, trainer_steps and settings in the catalog. The rollouts come from the
    trainer's initial weights (seed 0) unless `sampler_seed` says other weights sampled them; the
    first `flat_groups` groups score alike (and the sampler hands them out all the same)."""
    import torch

    from trajlake.store.projections import catch_up
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.policy import TinyPolicy
    from trajlake.trainer.reference import ReferenceTrainer

    lake, bus = Lake(root), InProcessBus()
    policy, recorder = TinyPolicy(16, seed=sampler_seed), Recorder(bus, "tr", vocab_size=16)
    gen = torch.Generator().manual_seed(0)
    for g in range(6):
        for i in range(4):
            traj = recorder.start(task_id=f"t{g}", group_id=f"g{g}", sample_index=i)
            ids, lps = policy.generate([0, 1 + g], 6, generator=gen)
            traj.turn(ids, lps, 0, full_input_token_ids=[0, 1 + g])
            traj.reward(0.0 if g < flat_groups else float(5 in ids) if i else 1.0 - float(5 in ids))
            traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    config = TrainerConfig(
        run_id="tr", steps=3, seed=0, lr=0.01, advantage="drgrpo",
        sampler=SamplerConfig(groups_per_batch=2, drop_zero_variance=not flat_groups),
    )  # fmt: skip
    trainer = ReferenceTrainer(lake, config)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    catch_up(lake)  # policy_versions and batch_consumption from the trainer's events
    lake.close()
    return root


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """`train_run`, shared by the tests that only read it."""
    return train_run(tmp_path_factory.mktemp("trained") / "lake")


def test_the_runs_own_configuration_reproduces_its_recorded_steps(trained_run, tmp_path, capsys):
    lake = Lake(trained_run)
    recorded = lake.sql("select step, loss, grad_norm, entropy from trainer_steps order by step").to_pylist()
    path = tmp_path / "report.json"
    assert (
        main(["ablate", "--lake", str(trained_run), "--run", "tr", "--steps", "3", "--json", str(path)]) == 0
    )
    out = capsys.readouterr().out
    assert "model: the run's tiny GRU and its checkpoints" in out
    assert "the run trained with token_mean × ppo (drgrpo advantages)" in out and "it reproduces" in out
    report = json.loads(path.read_text())
    assert report["versions"] == [0, 1, 2] and report["seeds"] == 1
    replay = report["reproduction"]
    assert [s["step"] for s in replay["steps"]] == [0, 1, 2]
    assert replay["within_tolerance"] and replay["max_loss_diff"] <= 1e-5
    (own,) = [c for c in report["configs"] if c["run"]]
    assert (own["aggregation"], own["policy_loss"]) == ("token_mean", "ppo")
    for name in ("loss", "grad_norm", "entropy"):  # each step at the weights the run had: the run's figures
        replayed = own["metrics"][name]["mean"]
        assert replayed == pytest.approx(sum(r[name] for r in recorded) / 3, rel=1e-4), name
    mismatch = own["metrics"]["mismatch"]["mean"]
    assert mismatch is not None and mismatch < 1e-4  # the samples the run's weights generated, in float32


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, model_dir) -> Path:
    """A run of the tiny Hugging Face model: rollouts it sampled (float32, on CPU) and 3 steps of
    the HF trainer (checkpoints are model directories)."""
    import torch

    from trajlake.store.projections import catch_up
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.hf_policy import HFPolicy, HFTrainer

    root = tmp_path_factory.mktemp("hf-run") / "lake"
    lake, bus = Lake(root), InProcessBus()
    model = HFPolicy(model_dir).model.eval()
    recorder = Recorder(bus, "hf", vocab_size=model.config.vocab_size)
    gen = torch.Generator().manual_seed(0)
    for g in range(6):
        for i in range(4):
            ids, lps = [5, 9 + g], []
            with torch.no_grad():
                for _ in range(6):
                    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
                    token = int(torch.multinomial(logp.exp(), 1, generator=gen))
                    ids.append(token)
                    lps.append(float(logp[token]))
            traj = recorder.start(task_id=f"t{g}", group_id=f"g{g}", sample_index=i, model=str(model_dir))
            traj.turn(ids[2:], lps, 0, full_input_token_ids=ids[:2])
            traj.reward(float(i % 2))
            traj.finish("completed")
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    config = TrainerConfig(
        run_id="hf", steps=3, lr=1e-3, advantage="drgrpo", policy_loss="glm5",
        sampler=SamplerConfig(groups_per_batch=2),
    )  # fmt: skip
    trainer = HFTrainer(lake, config, model_dir=model_dir)
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    catch_up(lake)
    lake.close()
    return root


def test_a_run_of_a_hugging_face_model_is_replayed_through_that_model(hf_run, model_dir):
    lake = Lake(hf_run)
    report = run_ablation(lake, AblationConfig(run_id="hf", steps=3, policy_losses=["ppo", "glm5"]))
    assert report["model"]["kind"] == "hf" and report["model"]["base"] == str(model_dir)
    assert report["versions"] == [0, 1, 2] and report["notes"] == []
    replay = report["reproduction"]
    assert [s["step"] for s in replay["steps"]] == [0, 1, 2] and replay["within_tolerance"], replay
    (own,) = [c for c in report["configs"] if c["run"]]
    assert (own["aggregation"], own["policy_loss"]) == ("token_mean", "glm5")
    assert own["metrics"]["mismatch"]["mean"] < 1e-4  # float32 on CPU: the sampler's logprobs, recomputed


def test_a_missing_checkpoint_is_named_with_the_weights_that_stand_in(tmp_path):
    lake = Lake(train_run(tmp_path / "lake"))
    gone = lake.sql("select checkpoint from policy_versions where policy_version = 1").column(0)[0].as_py()
    Path(gone).unlink()
    report = run_ablation(lake, AblationConfig(run_id="tr", steps=3, policy_losses=["ppo"]))
    assert report["versions"] == [0, 0, 2]
    assert report["notes"] == [f"checkpoint of version 1 missing ({gone}): replayed with version 0's weights"]
    replay = {s["step"]: s for s in report["reproduction"]["steps"]}
    assert replay[0]["loss_diff"] <= 1e-5 and replay[1]["loss_diff"] > 1e-5  # other weights, other loss


def test_a_replay_whose_weights_did_not_sample_the_tokens_says_so(tmp_path):
    """Rollouts another policy sampled (as a sampling mask the run did not record would make them)."""
    report = run_ablation(Lake(train_run(tmp_path / "lake", sampler_seed=1)), AblationConfig(run_id="tr"))
    (note,) = report["notes"]
    assert note.startswith("engine mismatch ") and "is above 0.03: the replayed model does not give" in note
    assert report["reproduction"]["within_tolerance"]  # the trainer saw the same tokens: its loss replays


def test_batches_without_a_signal_are_passed_over_and_named(tmp_path):
    """A batch whose every group scored alike has zero advantages: every configuration's loss is 0."""
    lake = Lake(train_run(tmp_path / "lake", flat_groups=2))
    report = run_ablation(lake, AblationConfig(run_id="tr", steps=2, policy_losses=["ppo"]))
    assert [s["step"] for s in report["reproduction"]["steps"]] == [1, 2] and report["versions"] == [1, 2]
    assert report["notes"] == [
        "passed over 1 consumed batches without a signal (every group scored alike: every loss is 0 there): "
        "steps [0]"
    ]
    assert report["reproduction"]["within_tolerance"]


def test_training_the_runs_configuration_from_its_weights_retraces_the_run(trained_run):
    config = AblationConfig(
        run_id="tr", steps=3, aggregations=["token_mean"], policy_losses=["ppo", "glm5"], train=True
    )
    report = run_ablation(Lake(trained_run), config)
    assert report["model"]["kind"] == "tiny" and "versions" not in report
    recorded = Lake(trained_run).sql("select avg(loss) from trainer_steps").column(0)[0].as_py()
    ppo, glm5 = ({name: v["mean"] for name, v in c["metrics"].items()} for c in report["configs"])
    assert ppo["loss"] == pytest.approx(recorded, rel=1e-4)  # the run's loss, lr and batches: the run's steps
    assert glm5["loss"] != pytest.approx(recorded, rel=1e-2)
    for m in (ppo, glm5):
        assert m["kl_to_start"] > 0 and m["drift"] > 0 and 0 < m["entropy_after"] < m["entropy"] + 0.5
        assert m["mismatch"] is not None and m["mismatch"] < 1e-4  # its first step, at the run's weights


@pytest.mark.integration
def test_ablate_reproduces_the_loss_of_a_run_on_vllm_with_weights_reloaded_in_place(
    lake, bus, drain, vllm_server, tiny_tokenizer, capsys
):
    """A real run, as the vLLM demo runs one but without its warm start (minutes on two cores): vLLM
    samples each step's groups with the weights it serves, the HF trainer takes a step on them and its
    checkpoint is reloaded into the server as the next version. Replayed, the run's own configuration at
    the checkpoint each batch was consumed at gives the loss the trainer recorded."""
    from trajlake.rollout.engine.weights import WeightSync
    from trajlake.rollout.tito import TitoClient
    from trajlake.store.projections import catch_up
    from trajlake.trainer.config import SamplerConfig, TrainerConfig
    from trajlake.trainer.hf_policy import HFTrainer
    from trajlake.trainer.replay import LOSS_TOLERANCE

    model_dir = vllm_server.model_dir
    recorder = Recorder(bus, "eng", vocab_size=len(tiny_tokenizer))
    config = TrainerConfig(
        run_id="eng", vocab_size=len(tiny_tokenizer), lr=1e-3, advantage="drgrpo", policy_loss="ppo",
        sampler=SamplerConfig(groups_per_batch=2, group_size=4, max_staleness=0, group_wait_s=0),
    )  # fmt: skip
    trainer = HFTrainer(lake, config, model_dir=model_dir)
    trainer.setup()
    weights = WeightSync(vllm_server.url, serving=(model_dir, 0))
    with TitoClient(vllm_server.tito_config("generate")) as client:
        for step in range(3):
            for g, text in enumerate(["calc 3 + 4", "python print(2 * 21)"]):
                prompt = tiny_tokenizer.encode(text)
                # outputs of different lengths: a token-mean loss of centred advantages is then not 0
                samples = [
                    client.complete(prompt, max_tokens=4 + 3 * i, seed=100 * step + g) for i in range(4)
                ]
                ranked = sorted(range(4), key=lambda i: sum(samples[i].output_token_ids))
                for i, done in enumerate(samples):
                    traj = recorder.start(f"t{g}", f"s{step}-g{g}", i, model=str(model_dir))
                    done.record(traj, done.policy_version)
                    traj.reward(float(ranked.index(i) >= 2))  # two of four rewarded: every group has a signal
                    traj.finish("completed")
            drain()
            trainer.train_step(trainer.next_batch())
            weights.push(trainer.last_checkpoint, trainer.version)  # the next step samples with it
    weights.close()
    trainer.cleanup()
    catch_up(lake)
    served = lake.sql("select distinct policy_version from turns where run_id = 'eng' order by 1").column(0)
    assert served.to_pylist() == [0, 1, 2]  # every step sampled with the weights the trainer had then

    path = lake.root + "/ablate.json"
    assert main(["ablate", "--lake", lake.root, "--run", "eng", "--steps", "3", "--json", path]) == 0
    assert "it reproduces the run's recorded loss" in capsys.readouterr().out
    report = json.loads(Path(path).read_text())
    assert report["model"] == {"kind": "hf", "describes": f"the run's model {model_dir} and its checkpoints",
                               "base": str(model_dir)}  # fmt: skip
    assert report["versions"] == [0, 1, 2] and report["notes"] == []
    replay = report["reproduction"]
    assert [s["step"] for s in replay["steps"]] == [0, 1, 2]
    assert replay["first_loss_diff"] <= LOSS_TOLERANCE and replay["max_loss_diff"] <= LOSS_TOLERANCE, replay
    assert all(abs(s["recorded_loss"]) > 1e-3 for s in replay["steps"]), (
        replay
    )  # a loss well above the tolerance
    assert replay["max_grad_norm_rel_diff"] <= 1e-3, replay
    (own,) = [c for c in report["configs"] if c["run"]]
    assert (own["aggregation"], own["policy_loss"]) == ("token_mean", "ppo")
    mismatch = own["metrics"]["mismatch"]["mean"]
    assert 0 < mismatch < 0.03  # vLLM's logprobs against the run's weights in transformers: float32 on CPU
    for c in report["configs"]:  # at the run's own weights every ratio is ~1: no trust region acts
        assert c["metrics"]["clip_fraction"]["mean"] == 0 and c["metrics"]["masked_fraction"]["mean"] == 0, c


def test_a_recorded_step_replayed_from_its_checkpoint_and_batch_reproduces(trained_run, tmp_path, capsys):
    path = tmp_path / "check.json"
    code = main(
        ["ablate", "--lake", str(trained_run), "--run", "tr", "--verify-step", "1", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "step 1 of run tr: 8 trajectories" in out and "step-000001.pt" in out
    assert "step 1 of run tr reproduces: " in out
    report = json.loads(path.read_text())
    values = {v["name"]: v for v in report["values"]}
    assert report["weights_version"] == 1 and report["batch_step"] == 1 and report["reproduces"]
    recorded = (
        Lake(trained_run)
        .sql("select loss, grad_norm, drift from trainer_steps where step = 1")
        .to_pylist()[0]
    )
    for name in ("loss", "grad_norm", "drift"):  # the trainer's own figures, each recomputed
        assert (
            values[name]["recorded"] == recorded[name] and values[name]["diff"] <= values[name]["tolerance"]
        )
    assert values["advantage"]["recorded"] is not None  # batch_consumption's advantages, recomputed too
    for name in ("trainer_logprobs", "entropies", "ratios", "clipped", "masked"):  # and every kept token
        assert values[f"{name} (per token)"]["within"], values[f"{name} (per token)"]


def _other_checkpoint(row: dict) -> str:
    """Version 1's checkpoint replaced by version 2's."""
    return row["checkpoint"].replace("step-000001", "step-000002")


@pytest.mark.parametrize(
    ("table", "column", "change", "named"),
    [
        (
            "trainer_steps",
            "grad_norm",
            lambda r: r["grad_norm"] * (1.01 if r["step"] == 1 else 1),
            "grad_norm",
        ),
        ("policy_versions", "checkpoint", _other_checkpoint, "loss recorded 0.0583"),
        (
            "policy_versions",
            "checkpoint",
            lambda r: r["checkpoint"] + (".gone" if r["policy_version"] == 1 else ""),
            "the checkpoint of version 1",
        ),
        (
            "trainer_tokens",
            "trainer_logprobs",
            lambda r: [None if v is None else v - 0.01 * (r["step"] == 1) for v in r["trainer_logprobs"]],
            "trainer_logprobs (per token) recorded 48, replayed 48 (|Δ| 0.01",
        ),
    ],
    ids=[
        "a-recorded-value-changed",
        "another-versions-checkpoint",
        "checkpoint-gone",
        "a-token-value-changed",
    ],
)
def test_a_doctored_record_fails_the_check_naming_the_value(
    trained_run, tmp_path, capsys, table, column, change, named
):
    copy = tampered_copy(trained_run, tmp_path / "copy", table, column, change)
    assert main(["ablate", "--lake", str(copy), "--run", "tr", "--verify-step", "1", "--format", "csv"]) == 1
    err = capsys.readouterr().err
    assert "trajlake ablate: step 1 of run tr does NOT reproduce: " in err and named in err, err


def test_a_step_the_run_did_not_record_is_a_usage_error_naming_the_steps(trained_run, capsys):
    assert main(["ablate", "--lake", str(trained_run), "--run", "tr", "--verify-step", "7"]) == 2
    assert "run 'tr' has no trainer step 7: its recorded steps are 0..2" in capsys.readouterr().err


def test_a_step_of_a_hugging_face_model_run_reproduces_from_its_model_directory(hf_run, model_dir, capsys):
    for step, weights in ((0, str(model_dir)), (2, str(hf_run / "checkpoints" / "hf" / "step-000002"))):
        assert (
            main(
                [
                    "ablate",
                    "--lake",
                    str(hf_run),
                    "--run",
                    "hf",
                    "--verify-step",
                    str(step),
                    "--format",
                    "json",
                ]
            )
            == 0
        )
        report = json.loads(capsys.readouterr().out)
        assert report["checkpoint"] == weights and report["settings"]["policy_loss"] == "glm5"
        assert report["reproduces"], report["values"]


def test_a_run_without_its_trainer_settings_is_a_usage_error_naming_the_catalog_option(
    trained_run, tmp_path, capsys
):
    copy = tmp_path / "lake"
    shutil.copytree(trained_run, copy, ignore=shutil.ignore_patterns("catalog.db*"))
    assert main(["ablate", "--lake", str(copy), "--run", "tr", "--verify-step", "1"]) == 2
    err = capsys.readouterr().err
    assert (
        "run 'tr' has no trainer settings in the catalog (runs.config)" in err
        and "--catalog (TRAJLAKE_CATALOG_URL)" in err
    )
