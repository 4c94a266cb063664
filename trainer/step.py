"""One policy-gradient step over a batch, shared by the reference trainer, the Megatron adapter
and the ablation replay.

The batch's loss is aggregated over the whole batch (token/sequence/prompt mean) even
though it is computed micro-batch by micro-batch: each sequence's tokens are weighted by
`losses.sequence_weights` of the full batch, so the summed micro-batch gradients equal
the gradient of the whole-batch loss.

The step also measures how the trainer's logprobs differ from the rollouts', split by who
generated the tokens (`weights_version`): the weights it holds (the engine mismatch) or older
ones (the policy's drift, per staleness); see `trainer.mismatch`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from trajlake.trainer import losses, token_values
from trajlake.trainer.batch import Batch
from trajlake.trainer.config import TrainerConfig
from trajlake.trainer.mismatch import Mismatch, combine, logprob_mismatch


class TrainablePolicy(Protocol):
    """What a step needs from a model: per-token logprobs and entropy, and parameters."""

    def logprobs_and_entropy(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def parameters(self) -> Any: ...


def policy_step(
    model: TrainablePolicy,
    optimizer: torch.optim.Optimizer | None,
    batch: Batch,
    config: TrainerConfig,
    fold_vocab: int | None = None,
    *,
    weights_version: int | None = None,
    keep_token_values: bool = False,
) -> dict[str, Any]:
    """Forward, backward and (with an optimizer) update on `batch`; return the step's metrics.

    Without an optimizer the gradients are computed (for the grad norm) but not applied; a zero
    gradient (a batch without signal) leaves the weights and the optimizer's state as they are.
    Sets `batch.advantages` to the advantages the step used, for the commit to record.
    `weights_version` is the policy version the model's weights are: the tokens that version
    generated measure the engine mismatch, older ones the drift; None (weights no run published)
    measures drift only, by the samples' staleness at hand-out. `keep_token_values` sets
    `batch.token_values` to each token's trainer logprob, entropy, ratio and what the loss did to it.
    """
    return _step(model, optimizer, batch, [config], fold_vocab, weights_version, keep_token_values)[0]


def evaluate_configs(
    model: TrainablePolicy,
    batch: Batch,
    configs: list[TrainerConfig],
    fold_vocab: int | None = None,
    *,
    weights_version: int | None = None,
) -> list[dict[str, Any]]:
    """Each configuration's metrics at the current weights, without an update (`trajlake ablate`).

    The forward pass is shared: one per micro-batch, then one backward per configuration.
    The figures equal `policy_step(model, None, batch, config, weights_version=...)` for each config.
    """
    return _step(model, None, batch, configs, fold_vocab, weights_version)


@dataclass
class _Tally:
    loss: float = 0.0
    entropy: float = 0.0
    clipped: int = 0
    masked: int = 0
    tokens: int = 0
    grad: torch.Tensor | None = None


@dataclass
class _Gaps:
    """The micro-batches' logprob gaps per staleness against the weights the step holds."""

    weights_known: bool
    threshold: float
    parts: dict[int, list[Mismatch]] = field(default_factory=dict)

    def add(
        self, batch: Batch, indices: list[int], mb: Any, logprobs: torch.Tensor, version: int | None
    ) -> None:
        """Measure one micro-batch: each sample's tokens under the staleness of the weights that generated them."""
        lags = torch.tensor([_staleness(batch.samples[i], version) for i in indices], dtype=torch.long)
        for lag in lags.unique().tolist():
            rows = mb.loss_mask.bool() & (lags == lag).unsqueeze(1)
            self.parts.setdefault(lag, []).append(
                logprob_mismatch(mb.rollout_logprobs, logprobs, rows, self.threshold)
            )

    def metrics(self) -> dict[str, Any]:
        """The engine mismatch (staleness 0 of known weights) and the drift (every other staleness)."""
        engine = combine(self.parts.get(0, []) if self.weights_known else [])
        stale = {k: combine(v) for k, v in sorted(self.parts.items()) if not (self.weights_known and k == 0)}
        drift = combine(list(stale.values()))
        return {
            "mismatch": engine.mean_abs_diff,
            "mismatch_max": engine.max_abs_diff,
            "mismatch_healthy": engine.healthy,
            "mismatch_tokens": engine.n_tokens,
            "drift": drift.mean_abs_diff,
            "drift_kl": drift.kl,
            "drift_tokens": drift.n_tokens,
            "drift_by_staleness": [
                {"staleness": k, "n_tokens": g.n_tokens, "abs_diff": g.mean_abs_diff, "kl": g.kl}
                for k, g in stale.items()
                if g.n_tokens
            ],
        }


def _staleness(sample: Any, weights_version: int | None) -> int:
    """How many versions older than the weights the sample's tokens are (at hand-out, if the weights are no version)."""
    return int(sample.staleness if weights_version is None else weights_version - sample.policy_version_min)


def _step(
    model: TrainablePolicy,
    optimizer: torch.optim.Optimizer | None,
    batch: Batch,
    configs: list[TrainerConfig],
    fold_vocab: int | None,
    weights_version: int | None = None,
    keep_token_values: bool = False,
) -> list[dict[str, Any]]:
    started = time.perf_counter()
    if optimizer is not None and len(configs) != 1:
        raise ValueError("an update step takes exactly one configuration")
    if len({c.temperature for c in configs}) > 1:
        raise ValueError("configurations evaluated together must share the sampling temperature")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    prompt_index = torch.from_numpy(batch.prompt_index())
    rewards = torch.from_numpy(batch.rewards())
    counts = torch.tensor([int(s.loss_mask[1:].sum()) for s in batch.samples], dtype=torch.float64)
    advantages = [losses.compute_advantages(c.advantage, rewards, prompt_index) for c in configs]
    if len(configs) == 1:  # what this step trains with; the commit after it records them
        batch.advantages = advantages[0].tolist()
    seq_weights = [losses.sequence_weights(counts, prompt_index, c.aggregation) for c in configs]
    tallies = [_Tally() for _ in configs]
    gaps = _Gaps(weights_version is not None, configs[0].mismatch_threshold)
    separate = len(configs) > 1
    kept: dict[int, token_values.TokenValues] = {}
    for indices in batch.micro_batches:
        mb = batch.tensors(indices, vocab_size=fold_vocab)
        logprobs, entropy = model.logprobs_and_entropy(
            mb.input_ids, mb.attention_mask, configs[0].temperature, positions=mb.loss_mask
        )
        mask = mb.loss_mask
        gaps.add(batch, indices, mb, logprobs, weights_version)
        for k, (config, tally) in enumerate(zip(configs, tallies, strict=True)):
            out = losses.policy_loss(
                config.policy_loss,
                logprobs,
                mb.rollout_logprobs,
                advantages[k][indices],
                **config.loss_params(),
            )
            weights = seq_weights[k][indices].to(logprobs.dtype).unsqueeze(1) * mask
            loss = (out.token_loss * weights).sum()
            if keep_token_values and k == 0:
                kept.update(
                    zip(indices, token_values.of_micro_batch(mb, logprobs, entropy, out), strict=True)
                )
            if loss.requires_grad:
                loss.backward(retain_graph=k < len(configs) - 1)
            if separate:  # keep each configuration's gradient apart
                flat = torch.cat(
                    [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]
                )
                tally.grad = flat if tally.grad is None else tally.grad + flat
                for p in params:
                    p.grad = None
            tally.loss += float(loss.detach())
            tally.entropy += float(entropy.detach()[mask].sum())
            tally.clipped += int(out.clipped[mask].sum())
            tally.masked += int(out.masked[mask].sum())
            tally.tokens += int(mask.sum())
    if separate:
        norms = [float(t.grad.norm()) if t.grad is not None else 0.0 for t in tallies]
    else:
        norms = [float(torch.nn.utils.clip_grad_norm_(params, configs[0].max_grad_norm)) if params else 0.0]
    if optimizer is not None and norms[0] > 0:
        # a batch without signal (every group scored alike: zero advantages) has a zero gradient;
        # Adam would still move the weights along its momentum, repeating the last update
        optimizer.step()
    if keep_token_values:
        batch.token_values = [kept[i] for i in range(len(batch.samples))]
    duration = time.perf_counter() - started
    measured = gaps.metrics()
    return [
        _metrics(tally, norm, batch, rewards, losses.group_weight_spread(w * counts, prompt_index), duration)
        | measured
        for tally, norm, w in zip(tallies, norms, seq_weights, strict=True)
    ]


def _metrics(
    tally: _Tally, grad_norm: float, batch: Batch, rewards: torch.Tensor, spread: float, duration: float
) -> dict[str, Any]:
    n = max(tally.tokens, 1)
    staleness = batch.staleness or [0]
    return {
        "loss": tally.loss,
        "entropy": tally.entropy / n,
        "grad_norm": grad_norm,
        "clip_fraction": tally.clipped / n,
        "masked_fraction": tally.masked / n,
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "n_trajectories": len(batch.samples),
        "n_tokens": batch.n_tokens,
        "n_loss_tokens": tally.tokens,
        "reward_mean": float(rewards.mean()) if len(rewards) else 0.0,
        "prompt_weight_spread": spread,
        "duration_s": duration,
    }
