"""Each loss and aggregation against a hand-computed example."""

from __future__ import annotations

import math

import pytest
import torch

from trajlake.trainer import losses as L


def t(values, **kw):
    return torch.tensor(values, dtype=torch.float32, **kw)


# -- advantages ---------------------------------------------------------------------------
def test_grpo_normalises_within_each_group_and_zeroes_uniform_groups():
    adv = L.grpo_advantages(t([1.0, 0.0, 1.0, 1.0]), torch.tensor([7, 7, 3, 3]))
    assert torch.allclose(adv, t([1.0, -1.0, 0.0, 0.0]), atol=1e-4)


def test_drgrpo_only_centres():
    adv = L.drgrpo_advantages(t([1.0, 0.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1, 1]))
    assert torch.allclose(adv, t([0.5, -0.5, -1 / 3, -1 / 3, 2 / 3]), atol=1e-6)


def test_rloo_uses_the_mean_of_the_other_samples():
    adv = L.rloo_advantages(t([1.0, 0.0, 0.0, 5.0]), torch.tensor([0, 0, 0, 1]))
    assert torch.allclose(adv, t([1.0, -0.5, -0.5, 0.0]))


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ValueError, match="grpo"):
        L.compute_advantages("ppo", t([1.0]), torch.tensor([0]))


# -- policy losses --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ratio", "adv", "expected", "clipped"),
    [(1.5, 1.0, -1.2, True), (0.5, 1.0, -0.5, False), (0.5, -1.0, 0.8, True), (1.5, -1.0, 1.5, False)],
    ids=["up-pos-clipped", "down-pos", "down-neg-clipped", "up-neg"],
)
def test_ppo_clip(ratio, adv, expected, clipped):
    rollout = t([[math.log(0.4)]])
    logp = rollout + math.log(ratio)
    out = L.ppo_clip_loss(logp, rollout, t([adv]))
    assert out.token_loss.item() == pytest.approx(expected, abs=1e-5)
    assert bool(out.clipped.item()) is clipped


def test_ppo_clipped_tokens_get_no_gradient():
    rollout = t([[math.log(0.4), math.log(0.4)]])
    logp = (rollout + t([[math.log(1.5), math.log(1.1)]])).requires_grad_()
    L.ppo_clip_loss(logp, rollout, t([1.0])).token_loss.sum().backward()
    assert logp.grad[0, 0] == 0
    out = L.ppo_clip_loss(logp, rollout, t([1.0]))
    assert out.masked.tolist() == out.clipped.tolist() == [[True, False]]
    assert logp.grad[0, 1].item() == pytest.approx(-1.1, abs=1e-5)  # d(-r·A)/dlogπ = -r·A


@pytest.mark.parametrize(
    ("p_new", "adv", "masked"),
    [(0.8, 1.0, True), (0.8, -1.0, False), (0.6, 1.0, False), (0.2, -1.0, True), (0.2, 1.0, False)],
    ids=[
        "up-by-0.3-pushed-up",
        "up-against-push",
        "up-by-0.1-within",
        "down-by-0.3-pushed-down",
        "down-against",
    ],
)
def test_dppo_binary_tv_mask(p_new, adv, masked):
    rollout = t([[math.log(0.5)]])
    logp = t([[math.log(p_new)]], requires_grad=True)
    out = L.dppo_loss(logp, rollout, t([adv]), delta=0.2, divergence="tv")
    assert bool(out.clipped.item()) is masked
    out.token_loss.sum().backward()
    ratio = p_new / 0.5
    assert logp.grad.item() == pytest.approx(0.0 if masked else -adv * ratio, abs=1e-5)


def test_dppo_binary_kl_mask_uses_the_bernoulli_kl():
    # KL(Bern(0.5) || Bern(0.8)) = 0.5·ln(0.5/0.8) + 0.5·ln(0.5/0.2) = 0.2231
    rollout = t([[math.log(0.5)]])
    logp = t([[math.log(0.8)]])
    assert L.dppo_loss(logp, rollout, t([1.0]), delta=0.22, divergence="kl").clipped.item()
    assert not L.dppo_loss(logp, rollout, t([1.0]), delta=0.23, divergence="kl").clipped.item()
    assert L.policy_loss("dppo_kl", logp, rollout, t([1.0]), delta=0.22).clipped.item()


def test_glm5_truncates_the_ratio_but_keeps_every_gradient():
    rollout = t([[math.log(0.25), math.log(0.25), math.log(0.25)]])
    logp = (rollout + t([[math.log(2.0), math.log(0.5), math.log(1.1)]])).requires_grad_()
    out = L.glm5_loss(logp, rollout, t([1.0]), clip_low=0.2, clip_high=0.28)
    out.token_loss.sum().backward()
    assert torch.allclose(logp.grad, t([[-1.28, -0.8, -1.1]]), atol=1e-5)
    assert out.clipped.tolist() == [[True, True, False]]
    assert not out.masked.any()  # truncated, never zeroed


def test_tis_weights_are_capped_and_detached():
    rollout = t([[math.log(0.1), math.log(0.1)]])
    old = rollout + t([[math.log(3.0), math.log(0.5)]])
    assert torch.allclose(L.tis_weights(old, rollout, cap=2.0), t([[2.0, 0.5]]), atol=1e-5)
    logp = old.clone().requires_grad_()
    out = L.tis_pg_loss(logp, rollout, t([2.0]), cap=2.0)
    out.token_loss.sum().backward()
    assert torch.allclose(logp.grad, t([[-4.0, -1.0]]), atol=1e-5)
    assert out.clipped.tolist() == [[True, False]]


def test_unknown_policy_loss_names_the_choices():
    with pytest.raises(ValueError, match="dppo"):
        L.policy_loss("reinforce++", t([[0.0]]), t([[0.0]]), t([1.0]))


# -- aggregation ----------------------------------------------------------------------------
LOSS = t([[1, 2, 3, 99], [4, 99, 99, 99], [10, 20, 99, 99]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
PROMPTS = torch.tensor([5, 5, 9])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("token_mean", 40 / 6), ("sequence_mean", (2 + 4 + 15) / 3), ("prompt_mean", (10 / 4 + 15) / 2)],
    ids=["token_mean", "sequence_mean", "prompt_mean"],
)
def test_aggregate_loss_matches_hand_computation(mode, expected):
    assert L.aggregate_loss(LOSS, MASK, PROMPTS, mode).item() == pytest.approx(expected)


def test_sequence_mean_leaves_out_sequences_without_masked_tokens():
    mask = MASK.clone()
    mask[1] = False
    assert L.aggregate_loss(LOSS, mask, PROMPTS, "sequence_mean").item() == pytest.approx((2 + 15) / 2)


def test_prompt_mean_gives_each_prompt_equal_weight_whatever_the_lengths():
    # prompt 0: one 100-token trajectory; prompt 1: four 2-token trajectories
    mask = torch.zeros(5, 100, dtype=torch.bool)
    mask[0, :] = True
    mask[1:, :2] = True
    prompts = torch.tensor([0, 1, 1, 1, 1])
    weights = L.effective_weights(mask, prompts, "prompt_mean").sum(dim=1)
    assert weights[0].item() == pytest.approx(0.5)
    assert weights[1:].sum().item() == pytest.approx(0.5)
    assert L.prompt_weight_spread(mask, prompts, "prompt_mean") == pytest.approx(0.0)
    assert L.prompt_weight_spread(mask, prompts, "token_mean") > 0.8  # 100 vs 8 tokens
    loss = torch.zeros(5, 100)
    loss[0] = 1.0
    assert L.aggregate_loss(loss, mask, prompts, "prompt_mean").item() == pytest.approx(0.5)
    assert L.aggregate_loss(loss, mask, prompts, "token_mean").item() == pytest.approx(100 / 108)


def test_aggregate_loss_is_differentiable_and_ignores_unmasked_tokens():
    loss = LOSS.clone().requires_grad_()
    L.aggregate_loss(loss, MASK, PROMPTS, "prompt_mean").backward()
    assert (loss.grad[~MASK] == 0).all()
    assert loss.grad[2, 0].item() == pytest.approx(0.25)  # prompt 9: 2 tokens, half the weight


def test_unknown_aggregation_names_the_modes():
    with pytest.raises(ValueError, match="prompt_mean"):
        L.aggregate_loss(LOSS, MASK, PROMPTS, "seq_mean_token_sum")


@pytest.mark.parametrize("mode", L.AGGREGATION_MODES)
def test_micro_batches_weighted_by_sequence_weights_sum_to_the_whole_batch_loss(mode):
    counts = MASK.sum(dim=1)
    weights = L.sequence_weights(counts, PROMPTS, mode)
    parts = [(LOSS[rows] * MASK[rows] * weights[rows].unsqueeze(1).float()).sum() for rows in ([0], [1, 2])]
    assert sum(parts).item() == pytest.approx(L.aggregate_loss(LOSS, MASK, PROMPTS, mode).item())
