"""Per-token trainer values, kept: `trainer_tokens` holds what each kept step computed for every
output token it trained on, aligned with the turns' tokens, and SQL finds the tokens a loss masked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.docs import blocks as md
from trajlake.ingest.recorder import Recorder
from trajlake.store.sql import QueryEngine
from trajlake.trainer.config import SamplerConfig, TrainerConfig
from trajlake.trainer.reference import ReferenceTrainer

PAGE = md.ROOT / "docs" / "how-to" / "token-values.md"
PROMPT, ENV = [1, 2, 3], [6]
OUTPUTS = {1.0: [[4, 5], [7, 8, 9]], 0.0: [[10, 11], [12, 13, 14]]}
"""Each turn's output tokens, by the sample's reward."""


def record_run(bus, drain, run_id: str = "demo", drift_in: str | None = None) -> None:
    """Two prompt groups of two two-turn samples (rewards 1 and 0, `OUTPUTS`); engine logprob of output
    token k is -(k+1)/10. The `drift_in` group's first sample sends its second turn a full input that
    breaks the prefix invariant, so its trained sequence restarts at that turn."""
    recorder = Recorder(bus, run_id, vocab_size=100)
    for group in ("g0", "g1"):
        for index, reward in enumerate((1.0, 0.0)):
            traj = recorder.start(task_id=f"task-{group}", group_id=group, sample_index=index)
            first, second = OUTPUTS[reward]
            traj.turn(first, [-0.1, -0.2], 0, input_token_ids=PROMPT)
            if group == drift_in and index == 0:
                traj.turn(second, [-0.1, -0.2, -0.3], 0, full_input_token_ids=[1, 2, 9, 9])
            else:
                traj.turn(second, [-0.1, -0.2, -0.3], 0, input_token_ids=ENV)
            traj.reward(reward)
            traj.finish("completed")
    drain()


def train(lake, tmp_path: Path, steps: int, every: int, policy_loss: str = "dppo") -> ReferenceTrainer:
    """`steps` steps on the run's one batch (trained again, as the overfit check does)."""
    config = TrainerConfig(
        run_id="demo", steps=steps, policy_loss=policy_loss, token_values_every=every,
        checkpoint_dir=str(tmp_path / "ckpt"), sampler=SamplerConfig(run_id="demo", groups_per_batch=2),
    )  # fmt: skip
    trainer = ReferenceTrainer(lake, config)
    trainer.setup()
    batch = trainer.next_batch()
    assert batch is not None and len(batch.samples) == 4
    for step in range(steps):
        trainer.train_step(batch, commit=step == 0)
    trainer.cleanup()
    return trainer


def dppo_query() -> str:
    """The page's query of the tokens DPPO masked at step 30, as the page writes it."""
    (block,) = [b for b in md.blocks(PAGE) if b.kind == "sql" and "policy_loss like 'dppo%'" in b.code]
    return block.code


def test_the_documented_query_lists_the_tokens_dppo_masked_at_step_30(lake, bus, drain, tmp_path, model_dir):
    record_run(bus, drain)
    train(lake, tmp_path, steps=31, every=30)

    kept = lake.sql("select distinct step, trainer_version from trainer_tokens order by step").to_pylist()
    assert kept == [{"step": 0, "trainer_version": 1}, {"step": 30, "trainer_version": 31}]
    engine = QueryEngine(lake)
    engine.tokenizer = str(model_dir)
    rows = engine.sql(dppo_query()).to_pylist()
    # the engine gave every output token probability >= 0.74 and the tiny policy ~0.01: the tokens of
    # the samples with a negative advantage moved down by more than δ = 0.2, which DPPO masks
    rewards = {
        r["trajectory_id"]: r["reward"]
        for r in lake.sql("select trajectory_id, reward from trajectories").to_pylist()
    }
    losers = sorted(t for t, r in rewards.items() if r == 0.0)
    expected = sorted(
        (t, turn, pos, token)
        for t in losers
        for turn, out in enumerate(OUTPUTS[0.0])
        for pos, token in enumerate(out)
    )
    assert (
        sorted((r["trajectory_id"], r["turn_index"], r["position"], r["token_id"]) for r in rows) == expected
    )
    assert all(r["advantage"] < 0 and r["text"] for r in rows)
    assert all(
        math.isclose(r["ratio"], math.exp(r["trainer_logprob"] - r["engine_logprob"]), rel_tol=1e-4)
        for r in rows
    )

    # the per-token flags add up to the step's own masked fraction
    step = lake.sql(
        """select s.masked_fraction, v.masked, v.trained from trainer_steps s, (
             select sum(len(list_filter(masked, lambda x: x))) as masked, sum(len(list_filter(masked, lambda x: x is not null))) as trained
             from trainer_tokens where step = 30) v where s.step = 30"""
    ).to_pylist()[0]
    assert step["masked"] == len(expected) and step["masked_fraction"] == pytest.approx(
        step["masked"] / step["trained"]
    )


def test_each_turn_gets_values_for_its_own_output_tokens(lake, bus, drain, tmp_path):
    record_run(bus, drain, drift_in="g0")
    train(lake, tmp_path, steps=1, every=1, policy_loss="glm5")

    rows = lake.sql(
        """select v.trajectory_id, v.turn_index, v.policy_loss, t.output_token_ids, t.output_logprobs, t.tito_drift,
                  v.trainer_logprobs, v.entropies, v.ratios, v.clipped, v.masked
           from trainer_tokens v join turns t using (run_id, trajectory_id, seq) order by all"""
    ).to_pylist()
    drifted = {r["trajectory_id"] for r in rows if r["tito_drift"]}
    assert len(drifted) == 1  # its sequence restarts at the drifted turn: only that turn was trained
    assert sorted(r["turn_index"] for r in rows if r["trajectory_id"] in drifted) == [1]
    assert len(rows) == 7
    for r in rows:
        n = len(r["output_token_ids"])
        assert [len(r[c]) for c in ("trainer_logprobs", "entropies", "ratios", "clipped", "masked")] == [
            n
        ] * 5
        assert all(lp < 0 for lp in r["trainer_logprobs"]) and all(e > 0 for e in r["entropies"])
        for lp, engine, ratio in zip(r["trainer_logprobs"], r["output_logprobs"], r["ratios"], strict=True):
            assert ratio == pytest.approx(math.exp(lp - engine), rel=1e-4)
        # GLM-5 truncates each ratio to [0.8, 1.28] and never zeroes a gradient
        assert r["clipped"] == [not 0.8 <= x <= 1.28 for x in r["ratios"]] and not any(r["masked"])


def test_a_run_that_keeps_none_writes_no_token_values(lake, bus, drain, tmp_path):
    record_run(bus, drain)
    train(lake, tmp_path, steps=1, every=0)
    assert lake.exists("trainer_steps") and not lake.exists("trainer_tokens")
