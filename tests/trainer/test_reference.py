"""The reference trainer: trains the tiny policy from the lake and records what it did."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake
from trajlake.store.projections import catch_up
from trajlake.trainer.config import SamplerConfig, TrainerConfig
from trajlake.trainer.losses import compute_advantages
from trajlake.trainer.policy import TinyPolicy
from trajlake.trainer.reference import ReferenceTrainer

VOCAB = 16


def rollouts(bus, run_id="run-r", groups=4, samples=4, seed=0):
    """Rollouts sampled from TinyPolicy(seed) at version 0; reward 1 when token 5 is sampled."""
    policy = TinyPolicy(VOCAB, seed=seed)
    recorder = Recorder(bus, run_id, vocab_size=VOCAB)
    gen = torch.Generator().manual_seed(seed)
    for g in range(groups):
        prompt = [0, 1 + g]
        for i in range(samples):
            traj = recorder.start(task_id=f"t{g}", group_id=f"g{g}", sample_index=i)
            ids, lps = policy.generate(prompt, 6, generator=gen)
            traj.turn(ids, lps, 0, full_input_token_ids=prompt)
            traj.reward(float(5 in ids) if i else 1.0 - float(5 in ids))  # never a zero-variance group
            traj.finish("completed")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A lake holding `rollouts()`, recorded once through the bus and the sink."""
    root = tmp_path_factory.mktemp("recorded") / "lake"
    lake, bus = Lake(root), InProcessBus()
    rollouts(bus)
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    lake.close()
    return root


@pytest.fixture
def lake(recorded, tmp_path):
    """This test's own copy of the recorded lake (the trainer writes to it)."""
    shutil.copytree(recorded, tmp_path / "lake")
    lake = Lake(tmp_path / "lake")
    yield lake
    lake.close()


@pytest.fixture
def config(tmp_path):
    return TrainerConfig(
        run_id="run-r", steps=2, seed=0, lr=0.01, checkpoint_dir=str(tmp_path / "ckpt"),
        sampler=SamplerConfig(groups_per_batch=2, micro_batch_tokens=24),
    )  # fmt: skip


def test_trains_from_the_lake_and_records_every_step(lake, config):
    trainer = ReferenceTrainer(lake, config)
    trainer.setup()
    assert trainer.policy.vocab_size == VOCAB and trainer.version == 0
    history = trainer.train()
    trainer.cleanup()
    assert [m["trainer_version"] for m in history] == [1, 2]
    first = history[0]
    assert first["mismatch"] < 1e-4 and first["mismatch_healthy"]  # the data came from these weights
    assert first["n_trajectories"] == 8 and first["grad_norm"] > 0
    catch_up(lake)
    steps = lake.sql(
        "select step, trainer_version, loss, mismatch, staleness_max from trainer_steps order by step"
    )
    assert steps.column("trainer_version").to_pylist() == [1, 2]
    assert steps.column("staleness_max").to_pylist() == [0, 1]
    used = lake.sql("select count(distinct trajectory_id) n, count(*) c from batch_consumption").to_pylist()[
        0
    ]
    assert used == {"n": 16, "c": 16}
    versions = lake.sql("select policy_version, checkpoint from policy_versions order by 1").to_pylist()
    assert [v["policy_version"] for v in versions] == [1, 2]
    assert TinyPolicy.load(versions[-1]["checkpoint"]).fingerprint() == trainer.policy.fingerprint()


def expected_advantages(lake, estimator: str) -> dict[tuple[int, str], float]:
    """What `compute_advantages` gives each consumed trajectory for the rewards of its step's groups."""
    rows = lake.sql(
        """select b.step, b.trajectory_id, t.group_id, t.reward from batch_consumption b
           join trajectories t using (run_id, trajectory_id) order by b.step, b.trajectory_id"""
    ).to_pylist()
    expected = {}
    for step in sorted({r["step"] for r in rows}):
        mine = [r for r in rows if r["step"] == step]
        groups = sorted({r["group_id"] for r in mine})
        rewards = torch.tensor([r["reward"] for r in mine])
        index = torch.tensor([groups.index(r["group_id"]) for r in mine])
        for r, a in zip(mine, compute_advantages(estimator, rewards, index).tolist(), strict=True):
            expected[(step, r["trajectory_id"])] = a
    return expected


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_every_consumed_trajectory_keeps_the_advantage_the_step_computed(lake, config, estimator):
    trainer = ReferenceTrainer(lake, config.model_copy(update={"advantage": estimator}))
    trainer.setup()
    trainer.train()
    trainer.cleanup()
    catch_up(lake)
    kept = lake.sql("select step, trajectory_id, advantage from batch_consumption").to_pylist()
    assert len(kept) == 16 and all(r["advantage"] is not None for r in kept)
    assert {(r["step"], r["trajectory_id"]): r["advantage"] for r in kept} == pytest.approx(
        expected_advantages(lake, estimator), abs=1e-6
    )


def test_a_new_trainer_resumes_from_the_last_checkpoint(lake, config):
    first = ReferenceTrainer(lake, config)
    first.setup()
    first.train(steps=1)
    first.cleanup()
    second = ReferenceTrainer(lake, config)
    second.setup()
    assert second.version == 1 and second.step == 1
    assert second.policy.fingerprint() == first.policy.fingerprint()
    second.cleanup()


@pytest.mark.parametrize("loss", ["ppo", "dppo", "glm5", "tis"])
def test_repeated_steps_raise_the_likelihood_of_rewarded_samples(lake, config, loss):
    trainer = ReferenceTrainer(lake, config.model_copy(update={"policy_loss": loss, "lr": 0.05}))
    trainer.setup()
    batch = trainer.next_batch()
    good = [i for i, s in enumerate(batch.samples) if s.reward > 0.5]

    def rewarded_logprob():
        mb = batch.tensors(good)
        with torch.no_grad():
            return float(
                (trainer.policy.token_logprobs(mb.input_ids, mb.attention_mask) * mb.loss_mask).sum()
            )

    before = rewarded_logprob()
    for _ in range(3):
        trainer.train_step(batch, commit=False)
    assert rewarded_logprob() > before
    trainer.cleanup()


def test_steps_again_on_one_batch_record_its_drift_not_an_engine_mismatch(lake, config):
    """The overfit check trains repeatedly on samples of version 0: from the second step on, the
    weights are newer than every token, so the gap is the policy's drift, kept apart by staleness."""
    trainer = ReferenceTrainer(lake, config.model_copy(update={"lr": 0.05}))
    trainer.setup()
    batch = trainer.next_batch()
    for step in range(3):
        trainer.train_step(batch, commit=step == 0)
    trainer.cleanup()
    rows = lake.sql(
        """select step, mismatch, mismatch_healthy, mismatch_tokens, drift, drift_kl, drift_tokens,
                  drift_by_staleness from trainer_steps order by step"""
    ).to_pylist()
    trained = sum(int(s.loss_mask[1:].sum()) for s in batch.samples)
    first, *later = rows
    assert first["mismatch"] < 1e-4 and first["mismatch_healthy"] and first["mismatch_tokens"] == trained
    assert first["drift_tokens"] == 0 and first["drift"] is None
    for row in later:
        assert row["mismatch"] is None and row["mismatch_healthy"] is None and row["mismatch_tokens"] == 0
        assert row["drift"] > 1e-3 and row["drift_kl"] > 0 and row["drift_tokens"] == trained
        assert [(d["staleness"], d["n_tokens"]) for d in row["drift_by_staleness"]] == [
            (row["step"], trained)
        ]
    assert later[1]["drift"] > later[0]["drift"]  # the weights move further from the samples each step


def test_trajlake_train_command_runs_the_reference_trainer(lake, capsys, tmp_path):
    from trajlake.cli import main as cli

    extra = json.dumps({"sampler": {"groups_per_batch": 1}, "checkpoint_dir": str(tmp_path / "c")})
    assert cli(["train", "--lake", lake.root, "--run", "run-r", "--steps", "2", "--config", extra]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["trainer_version"] for line in lines] == [1, 2]
    assert cli(["train", "--lake", lake.root, "--run", "run-r", "--config", '{"policy_loss": "nope"}']) == 2
    assert "policy_loss must be one of" in capsys.readouterr().err


@pytest.mark.integration  # runs the smoke script in a process
def test_gpu_smoke_script_says_what_it_needs_without_a_gpu():
    import subprocess
    import sys

    from trajlake.trainer.megatron import megatron_available

    if megatron_available() is None:
        pytest.skip("a GPU is present: the smoke script runs for real there")
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_smoke_megatron.py", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "CUDA GPU" in proc.stderr or "megatron-core" in proc.stderr
