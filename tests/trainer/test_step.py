"""One policy step: micro-batching does not change the result; shared-forward evaluation is exact."""

from __future__ import annotations

import numpy as np
import pytest

from trajlake.trainer.batch import Batch, TrajectorySample, pack_micro_batches
from trajlake.trainer.config import TrainerConfig
from trajlake.trainer.policy import TinyPolicy
from trajlake.trainer.step import evaluate_configs, policy_step


def make_batch(budget: int, reward=lambda i: float(i % 2)) -> Batch:
    rng = np.random.default_rng(0)
    samples = []
    for i, length in enumerate([5, 9, 14, 6, 11, 7]):
        ids = rng.integers(0, 20, length).astype(np.int32)
        lps = -rng.random(length).astype(np.float32)
        mask = np.arange(length) >= 2
        samples.append(TrajectorySample(f"t{i}", f"g{i // 3}", None, reward(i), 1, 0, ids, lps * mask, mask))
    return Batch("r", 0, 1, samples, pack_micro_batches([s.n_tokens for s in samples], budget))


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "prompt_mean"])
def test_micro_batching_gives_the_whole_batch_loss_and_gradient(aggregation):
    config = TrainerConfig(aggregation=aggregation, policy_loss="ppo", max_grad_norm=1e9)
    whole, split = make_batch(budget=10_000), make_batch(budget=20)
    assert len(whole.micro_batches) == 1 and len(split.micro_batches) > 2
    a = policy_step(TinyPolicy(20, d_model=8), None, whole, config, weights_version=1)
    b = policy_step(TinyPolicy(20, d_model=8), None, split, config, weights_version=1)
    assert (
        a["mismatch_tokens"] == b["mismatch_tokens"] == sum(int(s.loss_mask[1:].sum()) for s in whole.samples)
    )
    for key in ("loss", "grad_norm", "clip_fraction", "mismatch", "prompt_weight_spread"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key


def test_shared_forward_evaluation_equals_separate_steps():
    configs = [
        TrainerConfig(aggregation=agg, policy_loss=loss, max_grad_norm=1e9)
        for agg in ("token_mean", "prompt_mean")
        for loss in ("ppo", "dppo", "glm5")
    ]
    batch = make_batch(budget=20)
    together = evaluate_configs(TinyPolicy(20, d_model=8), batch, configs)
    for config, metrics in zip(configs, together, strict=True):
        alone = policy_step(TinyPolicy(20, d_model=8), None, batch, config)
        for key in ("loss", "grad_norm", "masked_fraction", "clip_fraction"):
            assert metrics[key] == pytest.approx(alone[key], rel=1e-5, abs=1e-7), (config.policy_loss, key)


def test_an_update_takes_exactly_one_configuration():
    import torch

    policy = TinyPolicy(20, d_model=8)
    with pytest.raises(ValueError, match="exactly one"):
        from trajlake.trainer.step import _step

        _step(
            policy, torch.optim.SGD(policy.parameters(), lr=0.1), make_batch(50), [TrainerConfig()] * 2, None
        )


def test_a_batch_without_signal_leaves_the_weights_as_they_are():
    """Every sample of a group scored alike: zero advantages, a zero gradient, and no update,
    though Adam's momentum from the step before would move the weights on its own."""
    import torch

    config = TrainerConfig(advantage="drgrpo", policy_loss="ppo")
    policy = TinyPolicy(20, d_model=8)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def weights() -> list[torch.Tensor]:
        return [p.detach().clone() for p in policy.parameters()]

    start = weights()
    policy_step(policy, optimizer, make_batch(50), config)
    after_signal = weights()
    assert not all(torch.equal(a, b) for a, b in zip(start, after_signal, strict=True))

    metrics = policy_step(policy, optimizer, make_batch(50, reward=lambda i: float(i // 3)), config)
    assert metrics["grad_norm"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(after_signal, weights(), strict=True))
