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
    row = lake.sql("select step, trainer_version, rank, mismatch, mismatch_healthy, n_tokens from trainer_steps").to_pylist()
    assert row == [{"step": 3, "trainer_version": 4, "rank": 1, "mismatch": 0.5, "mismatch_healthy": False, "n_tokens": 2}]
