"""The engine logprob mismatch against the 0.03 threshold, the policy drift kept apart, and their row in
`trainer_steps`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trajlake.trainer.batch import Batch, TrajectorySample, pack_micro_batches
from trajlake.trainer.config import TrainerConfig
from trajlake.trainer.mismatch import MISMATCH_THRESHOLD, combine, logprob_mismatch, record_mismatch
from trajlake.trainer.policy import TinyPolicy
from trajlake.trainer.step import policy_step


def test_mismatch_counts_only_masked_tokens():
    rollout = torch.tensor([[0.0, -1.0, -2.0, -9.0]])
    trainer = torch.tensor([[5.0, -1.015625, -2.046875, 0.0]])  # diffs 1/64 and 3/64: exact in float32
    mask = torch.tensor([[False, True, True, False]])
    result = logprob_mismatch(rollout, trainer, mask)
    assert result.mean_abs_diff == 2 / 64
    assert result.max_abs_diff == 3 / 64
    assert result.n_tokens == 2
    assert not result.healthy  # 0.03125 is above the 0.03 threshold
    assert logprob_mismatch(rollout, trainer, mask, threshold=0.04).healthy


def test_micro_batches_combine_token_weighted():
    a = logprob_mismatch(torch.zeros(1, 3), torch.full((1, 3), 0.01), torch.ones(1, 3, dtype=torch.bool))
    b = logprob_mismatch(torch.zeros(1, 1), torch.full((1, 1), 0.05), torch.ones(1, 1, dtype=torch.bool))
    total = combine([a, b])
    assert total.mean_abs_diff == pytest.approx((3 * 0.01 + 0.05) / 4)
    assert total.healthy and MISMATCH_THRESHOLD == 0.03


def test_tiny_policy_samples_are_healthy_and_a_changed_policy_is_not():
    policy = TinyPolicy(32, seed=0)
    prompt = [1, 2, 3]
    ids, lps = policy.generate(prompt, 40, generator=torch.Generator().manual_seed(0))
    seq = torch.tensor([prompt + ids])
    rollout = torch.zeros_like(seq, dtype=torch.float32)
    rollout[0, len(prompt) :] = torch.tensor(lps)
    mask = torch.zeros_like(seq, dtype=torch.bool)
    mask[0, len(prompt) :] = True
    assert logprob_mismatch(rollout, policy.token_logprobs(seq), mask).healthy
    other = TinyPolicy(32, seed=1)
    assert not logprob_mismatch(rollout, other.token_logprobs(seq), mask).healthy


def test_record_mismatch_writes_a_trainer_steps_row(lake):
    result = logprob_mismatch(torch.zeros(1, 2), torch.full((1, 2), -0.5), torch.ones(1, 2, dtype=torch.bool))
    record_mismatch(lake, "run-m", step=3, trainer_version=4, result=result, rank=1)
    row = lake.sql(
        "select step, trainer_version, rank, mismatch, mismatch_healthy, mismatch_tokens from trainer_steps"
    ).to_pylist()
    assert row == [
        {
            "step": 3,
            "trainer_version": 4,
            "rank": 1,
            "mismatch": 0.5,
            "mismatch_healthy": False,
            "mismatch_tokens": 2,
        }
    ]


def test_the_approximate_kl_is_the_k3_estimator():
    rollout = torch.log(torch.tensor([[0.5, 0.25]]))
    trainer = torch.log(torch.tensor([[0.25, 0.5]]))  # ratios 1/2 and 2
    result = logprob_mismatch(rollout, trainer, torch.ones(1, 2, dtype=torch.bool))
    expected = ((0.5 - 1 - math.log(0.5)) + (2 - 1 - math.log(2))) / 2
    assert result.kl == pytest.approx(expected) and result.mean_abs_diff == pytest.approx(math.log(2))


def _sample(
    tid: str, version: int, staleness: int, logprobs: np.ndarray, mask: np.ndarray
) -> TrajectorySample:
    ids = np.arange(8, dtype=np.int32) % 5
    return TrajectorySample(tid, "g0", None, float(version % 2), version, staleness, ids, logprobs, mask)


def test_only_tokens_of_the_weights_the_trainer_holds_measure_the_mismatch():
    """Older samples differ by the policy's own drift since they were generated, not by numerics:
    that gap is recorded apart, per staleness."""
    ids = np.arange(8, dtype=np.int32) % 5
    mask = np.arange(8) >= 2
    policy = TinyPolicy(5, d_model=8)
    exact = policy.token_logprobs(torch.tensor(ids, dtype=torch.long).unsqueeze(0))[0].detach().numpy()
    exact = (exact * mask).astype(np.float32)
    stale = _sample("t0", 0, 2, (-np.ones(8, np.float32) * mask).astype(np.float32), mask)
    fresh = _sample("t1", 2, 0, exact, mask)
    config = TrainerConfig(policy_loss="ppo")

    def step(samples: list[TrajectorySample], weights_version: int | None) -> dict:
        batch = Batch("r", 0, 2, samples, pack_micro_batches([8] * len(samples), 100))
        return policy_step(TinyPolicy(5, d_model=8), None, batch, config, weights_version=weights_version)

    only_stale = step([stale], 2)
    assert only_stale["mismatch"] is None and only_stale["mismatch_healthy"] is None
    assert only_stale["mismatch_tokens"] == 0 and only_stale["drift_tokens"] == 6
    assert only_stale["drift"] == pytest.approx(float(np.abs(exact[mask] + 1).mean()), rel=1e-5)
    assert [d["staleness"] for d in only_stale["drift_by_staleness"]] == [2]

    both = step([stale, fresh], 2)
    assert both["mismatch"] < 1e-4 and both["mismatch_healthy"] and both["mismatch_tokens"] == 6
    assert both["drift_tokens"] == 6 and both["drift_kl"] > 0

    # the same batch trained on again by weights two versions on (the overfit check): nothing in it
    # was generated by them, so it measures drift only, each sample at its own staleness
    again = step([stale, fresh], 4)
    assert again["mismatch"] is None and again["mismatch_tokens"] == 0 and again["drift_tokens"] == 12
    assert [(d["staleness"], d["n_tokens"]) for d in again["drift_by_staleness"]] == [(2, 6), (4, 6)]

    # weights that are no published version (an ablation's trained weights): drift only
    unknown = step([stale, fresh], None)
    assert unknown["mismatch"] is None and unknown["drift_tokens"] == 12
