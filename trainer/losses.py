"""The loss library: advantages, policy losses and loss aggregation, in torch.

Notation (per token t of sequence b; tensors are [B, T] unless said otherwise):
    logπ      trainer logprob of the sampled token under the weights being trained
    logμ      rollout logprob: what the inference engine reported when it sampled the token
    r = exp(logπ − logμ)       the trainer/rollout importance ratio
    A         the advantage of the token's sequence (broadcast from [B])
    sg(·)     stop-gradient

Every policy loss uses the rollout logprobs as the behaviour policy, so none needs an extra
forward pass to recompute "old" logprobs. Each returns a `PolicyLoss` holding the per-token
loss (to be reduced by `aggregate_loss`), a per-token `clipped` flag (the trust region
intervened: clipped, masked or truncated; the clip-fraction metric) and a per-token
`masked` flag (the token's gradient is zero; the masked-fraction metric).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trajlake.trainer.config import ADVANTAGE_ESTIMATORS, AGGREGATION_MODES, POLICY_LOSSES


@dataclass
class PolicyLoss:
    """Per-token loss [B, T]; where the trust region intervened, and where it zeroed the gradient."""

    token_loss: torch.Tensor
    clipped: torch.Tensor
    masked: torch.Tensor


# -- advantages -------------------------------------------------------------------------------
def _group_ids(group_index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Dense ids 0..G-1 for arbitrary group labels, and G."""
    _, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


def _group_sum(values: torch.Tensor, ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    return torch.zeros(n_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, scale: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO group-normalised advantages, [B].

        A_i = (R_i − mean_g R) / (std_g R + eps)     (scale=True, GRPO)
        A_i =  R_i − mean_g R                         (scale=False, Dr. GRPO)

    mean_g and std_g are over the sequences of i's prompt group g; std is the population
    standard deviation (divide by n), so a group with identical rewards gets A = 0.
    """
    rewards = rewards.double()
    ids, n_groups = _group_ids(group_index)
    counts = _group_sum(torch.ones_like(rewards), ids, n_groups)
    mean = _group_sum(rewards, ids, n_groups) / counts
    centred = rewards - mean[ids]
    if not scale:
        return centred.float()
    var = _group_sum(centred**2, ids, n_groups) / counts
    return (centred / (var.sqrt()[ids] + eps)).float()


def drgrpo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO advantages: A_i = R_i − mean_g R (no division by the group's std), [B]."""
    return grpo_advantages(rewards, group_index, scale=False)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO (leave-one-out) advantages, [B].

        A_i = R_i − (Σ_{j∈g, j≠i} R_j) / (n_g − 1)  =  n_g / (n_g − 1) · (R_i − mean_g R)

    A group of one sample has no baseline and gets A = 0.
    """
    rewards = rewards.double()
    ids, n_groups = _group_ids(group_index)
    counts = _group_sum(torch.ones_like(rewards), ids, n_groups)[ids]
    totals = _group_sum(rewards, ids, n_groups)[ids]
    baseline = (totals - rewards) / (counts - 1).clamp(min=1)
    return torch.where(counts > 1, rewards - baseline, torch.zeros_like(rewards)).float()


def compute_advantages(estimator: str, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Advantages [B] by estimator name: grpo, drgrpo or rloo."""
    if estimator == "grpo":
        return grpo_advantages(rewards, group_index)
    if estimator == "drgrpo":
        return drgrpo_advantages(rewards, group_index)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_index)
    raise ValueError(f"unknown advantage estimator {estimator!r}; choose one of {ADVANTAGE_ESTIMATORS}")


# -- policy losses ----------------------------------------------------------------------------
def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast sequence advantages [B] to [B, T]; pass [B, T] through."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def ppo_clip_loss(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> PolicyLoss:
    """PPO/GRPO clipped surrogate.

        loss_t = −min( r·A, clip(r, 1−ε_low, 1+ε_high)·A )

    A token is `clipped` when the clipped term is the smaller one and differs from r·A (its
    gradient is zero).
    """
    adv = _per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - rollout_logprobs).clamp(-20.0, 20.0))
    unclipped = ratio * adv
    clipped_term = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped_term)
    cut = (clipped_term < unclipped).detach()
    return PolicyLoss(loss, cut, cut)


def dppo_loss(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    delta: float = 0.2,
    divergence: str = "tv",
    ratio_cap: float = 20.0,
) -> PolicyLoss:
    """DPPO (Qi et al., "Rethinking the Trust Region in LLM RL", arXiv 2602.04879), binary masks.

        loss_t = −A · sg(min(r, C)) · logπ · m_t

    With p = π(token), p_μ = μ(token) (rollout policy), the trust-region mask m_t drops a
    token whose probability has already moved more than δ in the direction its advantage
    pushes (up for A > 0, down for A < 0):
        binary-TV:  D = |p − p_μ|
        binary-KL:  D = p_μ·log(p_μ/p) + (1−p_μ)·log((1−p_μ)/(1−p))
        m_t = 0  iff  D > δ  and  sign(p − p_μ) = sign(A)
    The gradient of sg(r)·logπ equals that of r, so unmasked tokens get the plain
    importance-weighted policy gradient; C caps the weight of extreme ratios.
    """
    if divergence not in ("tv", "kl"):
        raise ValueError(f"divergence must be 'tv' or 'kl' (got {divergence!r})")
    adv = _per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - rollout_logprobs).clamp(-20.0, 20.0)).detach()
    prob = logprobs.detach().exp()
    old = rollout_logprobs.exp()
    if divergence == "tv":
        dist = (prob - old).abs()
    else:
        tiny = 1e-8
        dist = old * (rollout_logprobs - logprobs.detach()) + (1 - old) * torch.log(
            (1 - old + tiny) / (1 - prob + tiny)
        )
    pushed_up = (adv > 0) & (prob > old)
    pushed_down = (adv < 0) & (prob < old)
    masked = (dist > delta) & (pushed_up | pushed_down)
    loss = -adv * ratio.clamp(max=ratio_cap) * logprobs * (~masked)
    return PolicyLoss(loss, masked, masked)


def glm5_loss(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> PolicyLoss:
    """GLM-5-style truncated-IS policy gradient against the rollout policy.

        loss_t = −A · sg(clip(r, 1−ε_low, 1+ε_high)) · logπ

    The trainer/rollout ratio is truncated on both sides and detached, so every token keeps
    a gradient (nothing is zeroed as in PPO) but no token's update can exceed
    (1+ε_high)·|A|·|∇logπ|: a large off-policy step is bounded. `clipped` marks tokens
    whose ratio was truncated.
    """
    adv = _per_token(advantages, logprobs)
    ratio = torch.exp((logprobs - rollout_logprobs).clamp(-20.0, 20.0)).detach()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return PolicyLoss(-adv * weight * logprobs, weight != ratio, torch.zeros_like(ratio, dtype=torch.bool))


def tis_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float = 2.0) -> torch.Tensor:
    """Token-level truncated importance sampling weights (detached), [B, T].

        w_t = min( π_old(token) / μ(token), C )

    π_old are the trainer's logprobs of the weights that the batch is trained from (at the
    first step of a batch, the current logprobs, so no extra forward pass), μ the rollout's.
    Multiply any per-token loss by w_t to correct train/inference mismatch.
    """
    return torch.exp((old_logprobs - rollout_logprobs).clamp(-20.0, 20.0)).clamp(max=cap).detach()


def tis_pg_loss(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, advantages: torch.Tensor, cap: float = 2.0
) -> PolicyLoss:
    """Vanilla policy gradient with token-level TIS: loss_t = −A · min(sg(r), C) · logπ."""
    adv = _per_token(advantages, logprobs)
    weight = tis_weights(logprobs.detach(), rollout_logprobs, cap)
    raw = torch.exp((logprobs.detach() - rollout_logprobs).clamp(-20.0, 20.0))
    return PolicyLoss(-adv * weight * logprobs, raw > cap, torch.zeros_like(raw, dtype=torch.bool))


def policy_loss(
    name: str,
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    **params: float,
) -> PolicyLoss:
    """A policy loss by name: ppo, dppo (binary-TV), dppo_kl (binary-KL), glm5 or tis."""
    if name == "ppo":
        return ppo_clip_loss(logprobs, rollout_logprobs, advantages, **params)
    if name == "dppo":
        return dppo_loss(logprobs, rollout_logprobs, advantages, divergence="tv", **params)
    if name == "dppo_kl":
        return dppo_loss(logprobs, rollout_logprobs, advantages, divergence="kl", **params)
    if name == "glm5":
        return glm5_loss(logprobs, rollout_logprobs, advantages, **params)
    if name == "tis":
        return tis_pg_loss(logprobs, rollout_logprobs, advantages, **params)
    raise ValueError(f"unknown policy loss {name!r}; choose one of {POLICY_LOSSES}")


# -- aggregation ------------------------------------------------------------------------------
def sequence_weights(token_counts: torch.Tensor, prompt_index: torch.Tensor, mode: str) -> torch.Tensor:
    """The weight of each masked token of sequence b, [B]: `effective_weights` is w_b · m_bt.

    Depends only on each sequence's masked-token count n_b and prompt group, so a trainer
    that splits a batch into micro-batches can weight each micro-batch's tokens exactly as
    the whole batch would, and the summed gradients equal the whole-batch gradient.
    """
    counts = token_counts.to(torch.float64)
    if mode == "token_mean":
        return torch.full_like(counts, 1.0) / counts.sum().clamp(min=1.0)
    if mode == "sequence_mean":
        n_seqs = (counts > 0).sum().clamp(min=1)
        return 1.0 / (counts.clamp(min=1.0) * n_seqs)
    if mode == "prompt_mean":
        ids, n_groups = _group_ids(prompt_index.to(counts.device))
        per_group = _group_sum(counts, ids, n_groups)
        n_live = (per_group > 0).sum().clamp(min=1)
        return 1.0 / (per_group.clamp(min=1.0)[ids] * n_live)
    raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {AGGREGATION_MODES}")


def effective_weights(loss_mask: torch.Tensor, prompt_index: torch.Tensor, mode: str) -> torch.Tensor:
    """The weight each token gets in `aggregate_loss`, [B, T]; they sum to 1 (0 with no masked token).

    token_mean:    w_bt = m_bt / Σ m
    sequence_mean: w_bt = m_bt / (n_b · S),   n_b = Σ_t m_bt, S = #sequences with n_b > 0
    prompt_mean:   w_bt = m_bt / (N_g · G),   N_g = Σ over g's sequences of n_b, G = #groups with N_g > 0
    """
    mask = loss_mask.to(torch.float64)
    return mask * sequence_weights(mask.sum(dim=1), prompt_index, mode).unsqueeze(1)


def aggregate_loss(
    token_loss: torch.Tensor, loss_mask: torch.Tensor, prompt_index: torch.Tensor, mode: str
) -> torch.Tensor:
    """Reduce a per-token loss [B, T] to a scalar over the tokens where `loss_mask` is set.

    Args:
        token_loss: [B, T] per-token loss.
        loss_mask: [B, T], 1/True for tokens that count.
        prompt_index: [B], the prompt group of each sequence (any integer labels).
        mode: `token_mean` — Σ of all masked tokens' loss / their count;
            `sequence_mean` — each sequence's masked token-mean, then the mean over
            sequences (sequences with no masked token are left out);
            `prompt_mean` — the token-mean over all masked tokens of each prompt group's
            sequences, then the mean over groups (SkyRL's definition): every prompt gets the
            same total weight whatever the lengths of its trajectories.
    """
    weights = effective_weights(loss_mask, prompt_index, mode).to(token_loss.dtype)
    return (token_loss * weights).sum()


def prompt_weight_spread(loss_mask: torch.Tensor, prompt_index: torch.Tensor, mode: str) -> float:
    """Coefficient of variation (std/mean) of the total effective weight per prompt group; 0 = equal."""
    return group_weight_spread(effective_weights(loss_mask, prompt_index, mode).sum(dim=1), prompt_index)


def group_weight_spread(sample_weight: torch.Tensor, prompt_index: torch.Tensor) -> float:
    """Coefficient of variation of per-group sums of `sample_weight` [B] (0 with fewer than 2 groups)."""
    ids, n_groups = _group_ids(prompt_index.to(sample_weight.device))
    per_group = _group_sum(sample_weight.to(torch.float64), ids, n_groups)
    if n_groups < 2 or float(per_group.mean()) == 0.0:
        return 0.0
    return float(per_group.std(unbiased=False) / per_group.mean())
