"""One policy-gradient step over a batch, shared by the reference trainer, the Megatron adapter
and the ablation replay.

The batch's loss is aggregated over the whole batch (token/sequence/prompt mean) even
though it is computed micro-batch by micro-batch: each sequence's tokens are weighted by
`losses.sequence_weights` of the full batch, so the summed micro-batch gradients equal
the gradient of the whole-batch loss.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from trajlake.trainer import losses
from trajlake.trainer.batch import Batch
from trajlake.trainer.config import TrainerConfig
from trajlake.trainer.mismatch import combine, logprob_mismatch


class TrainablePolicy(Protocol):
    """What a step needs from a model: per-token logprobs and entropy, and parameters."""

    def logprobs_and_entropy(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def parameters(self) -> Any: ...


def policy_step(
    model: TrainablePolicy,
    optimizer: torch.optim.Optimizer | None,
    batch: Batch,
    config: TrainerConfig,
    fold_vocab: int | None = None,
) -> dict[str, Any]:
    """Forward, backward and (with an optimizer) update on `batch`; return the step's metrics.

    Without an optimizer the gradients are computed (for the grad norm) but not applied:
    the evaluate-only mode of `trajlake ablate`.
    """
    started = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    prompt_index = torch.from_numpy(batch.prompt_index())
    rewards = torch.from_numpy(batch.rewards())
    advantages = losses.compute_advantages(config.advantage, rewards, prompt_index)
    counts = torch.tensor([int(s.loss_mask[1:].sum()) for s in batch.samples], dtype=torch.float64)
    seq_weights = losses.sequence_weights(counts, prompt_index, config.aggregation)
    total = {"loss": 0.0, "entropy": 0.0, "clipped": 0, "masked": 0, "tokens": 0}
    parts = []
    for indices in batch.micro_batches:
        mb = batch.tensors(indices, vocab_size=fold_vocab)
        logprobs, entropy = model.logprobs_and_entropy(mb.input_ids, mb.attention_mask, config.temperature)
        out = losses.policy_loss(
            config.policy_loss, logprobs, mb.rollout_logprobs, advantages[indices], **config.loss_params()
        )
        mask = mb.loss_mask
        weights = seq_weights[indices].to(logprobs.dtype).unsqueeze(1) * mask
        loss = (out.token_loss * weights).sum()
        if loss.requires_grad:
            loss.backward()
        total["loss"] += float(loss.detach())
        total["entropy"] += float(entropy.detach()[mask].sum())
        total["clipped"] += int(out.clipped[mask].sum())
        total["masked"] += int(out.masked[mask].sum())
        total["tokens"] += int(mask.sum())
        parts.append(logprob_mismatch(mb.rollout_logprobs, logprobs, mask, config.mismatch_threshold))
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)) if params else 0.0
    if optimizer is not None:
        optimizer.step()
    mismatch = combine(parts)
    n = max(total["tokens"], 1)
    staleness = batch.staleness or [0]
    return {
        "loss": total["loss"],
        "entropy": total["entropy"] / n,
        "grad_norm": grad_norm,
        "clip_fraction": total["clipped"] / n,
        "masked_fraction": total["masked"] / n,
        "mismatch": mismatch.mean_abs_diff,
        "mismatch_max": mismatch.max_abs_diff,
        "mismatch_healthy": mismatch.healthy,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "n_trajectories": len(batch.samples),
        "n_tokens": batch.n_tokens,
        "n_loss_tokens": total["tokens"],
        "reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
        "prompt_weight_spread": losses.group_weight_spread(seq_weights * counts, prompt_index),
        "duration_s": time.perf_counter() - started,
    }

