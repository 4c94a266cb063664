"""The logprob mismatch check against the 0.03 threshold, and its row in `trainer_steps`."""

from __future__ import annotations

import pytest
import torch

from trajlake.trainer.mismatch import MISMATCH_THRESHOLD, combine, logprob_mismatch, record_mismatch
from trajlake.trainer.policy import TinyPolicy


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
        "select step, trainer_version, rank, mismatch, mismatch_healthy, n_tokens from trainer_steps"
    ).to_pylist()
    assert row == [
        {
            "step": 3,
            "trainer_version": 4,
            "rank": 1,
            "mismatch": 0.5,
            "mismatch_healthy": False,
            "n_tokens": 2,
        }
    ]


def test_only_samples_from_the_current_weights_measure_the_mismatch():
    """A stale sample's logprobs differ by the policy's own drift, not by a numerics mismatch."""
    import numpy as np

    from trajlake.trainer.batch import Batch, TrajectorySample, pack_micro_batches
    from trajlake.trainer.config import TrainerConfig
    from trajlake.trainer.step import policy_step

    ids = np.arange(8, dtype=np.int32) % 5
    mask = np.arange(8) >= 2
    stale = TrajectorySample("t0", "g0", None, 1.0, 0, 2, ids, -np.ones(8, np.float32) * mask, mask)
    fresh_policy = TinyPolicy(5, d_model=8)
    exact = fresh_policy.token_logprobs(torch.tensor(ids, dtype=torch.long).unsqueeze(0))[0].detach().numpy()
    fresh = TrajectorySample("t1", "g0", None, 0.0, 2, 0, ids, (exact * mask).astype(np.float32), mask)
    config = TrainerConfig(policy_loss="ppo")
    only_stale = policy_step(
        TinyPolicy(5, d_model=8), None, Batch("r", 0, 2, [stale], pack_micro_batches([8], 100)), config
    )
    assert only_stale["mismatch"] is None and only_stale["mismatch_healthy"] is None
    both = Batch("r", 0, 2, [stale, fresh], pack_micro_batches([8, 8], 100))
    measured = policy_step(TinyPolicy(5, d_model=8), None, both, config)
    assert measured["mismatch"] < 1e-4 and measured["mismatch_healthy"]
