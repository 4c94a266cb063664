"""Offline loss ablations: replay a run's stored batches through each loss configuration.

Every configuration (aggregation × policy loss) sees the same batches in the same order,
and each seed gives every configuration the same initial weights, so differences come
from the loss alone. Evaluate-only mode measures each batch's loss and gradient at the
initial weights; `train` mode takes an optimiser step per batch and also reports what
training did to the policy. Each figure is a mean and a spread (std) over seeds.

Per configuration:
    loss, grad_norm, clip_fraction, masked_fraction (tokens whose gradient the trust
    region zeroed), weight_spread (coefficient of variation of the total loss weight per
    prompt: 0 means every prompt weighs the same);
    with training: reward_proxy (mean logprob of rewarded minus unrewarded sequences,
    change from the initial weights: > 0 means the policy moved toward rewarded
    behaviour), entropy (mean token entropy on the replayed data after training) and
    drift (mean |Δ logprob| per trained token, how far the behaviour moved).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from trajlake.trainer.batch import Batch
from trajlake.trainer.config import AblationConfig, SamplerConfig, TrainerConfig
from trajlake.trainer.policy import TinyPolicy
from trajlake.trainer.sampler import Sampler
from trajlake.trainer.step import evaluate_configs, policy_step

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

EVAL_METRICS = ("loss", "grad_norm", "weight_spread", "masked_fraction", "clip_fraction")
TRAIN_METRICS = ("reward_proxy", "entropy", "drift")


def replay_batches(lake: Lake, config: AblationConfig) -> list[Batch]:
    """The run's batches for replay: finished, non-system-failure groups with reward variance, oldest first."""
    sampler_config = SamplerConfig(
        run_id=config.run_id, max_staleness=10**9, group_wait_s=0, groups_per_batch=config.groups_per_batch,
        micro_batch_tokens=config.micro_batch_tokens,
    )  # fmt: skip
    return Sampler(lake, None, sampler_config).plan(trainer_version=0, n_batches=config.steps)


def _sequence_logprobs(
    policy: TinyPolicy, batches: list[Batch], fold: int | None
) -> tuple[list[float], list[float], float, int]:
    """Per-sequence mean trained-token logprob, per-sequence reward, token entropy sum, token count."""
    means, rewards, entropy, tokens = [], [], 0.0, 0
    with torch.no_grad():
        for batch in batches:
            for indices in batch.micro_batches:
                mb = batch.tensors(indices, vocab_size=fold)
                lps, ent = policy.logprobs_and_entropy(mb.input_ids, mb.attention_mask)
                mask = mb.loss_mask
                counts = mask.sum(dim=1).clamp(min=1)
                means += ((lps * mask).sum(dim=1) / counts).tolist()
                rewards += mb.rewards.tolist()
                entropy += float(ent[mask].sum())
                tokens += int(mask.sum())
    return means, rewards, entropy, tokens


def _preference(means: list[float], rewards: list[float]) -> float:
    good = [m for m, r in zip(means, rewards, strict=True) if r > 0.5]
    bad = [m for m, r in zip(means, rewards, strict=True) if r <= 0.5]
    return (statistics.fmean(good) if good else 0.0) - (statistics.fmean(bad) if bad else 0.0)


def run_one(batches: list[Batch], trainer_config: TrainerConfig, vocab: int, train: bool) -> dict[str, float]:
    """Replay `batches` through one configuration and seed; return the mean of each metric."""
    fold = trainer_config.max_vocab_size if vocab > trainer_config.max_vocab_size else None
    policy = TinyPolicy(
        min(vocab, trainer_config.max_vocab_size), trainer_config.d_model, seed=trainer_config.seed
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=trainer_config.lr) if train else None
    before = _sequence_logprobs(policy, batches, fold) if train else None
    out = _means([policy_step(policy, optimizer, batch, trainer_config, fold) for batch in batches])
    if before is not None:
        after = _sequence_logprobs(policy, batches, fold)
        out["reward_proxy"] = _preference(after[0], after[1]) - _preference(before[0], before[1])
        out["entropy"] = after[2] / max(after[3], 1)
        out["drift"] = (
            statistics.fmean(abs(a - b) for a, b in zip(after[0], before[0], strict=True))
            if after[0]
            else 0.0
        )
    return out


def run_ablation(lake: Lake, config: AblationConfig, vocab_size: int | None = None) -> dict[str, Any]:
    """Replay the run through every configuration and seed; return the JSON-ready report."""
    from trajlake.trainer.reference import run_vocab_size

    pairs = [(agg, loss) for agg in config.aggregations for loss in config.policy_losses]
    for agg, loss in pairs:
        config.trainer_config(agg, loss, 0)  # fail on a bad name before any work
    batches = replay_batches(lake, config)
    if not batches:
        raise ValueError(
            f"run {config.run_id!r} has no finished groups with reward variance to replay; "
            'check the run id (trajlake sql "select distinct run_id from trajectories")'
        )
    vocab = vocab_size or run_vocab_size(lake, config.run_id) or config.max_vocab_size
    per_pair: list[list[dict[str, float]]] = [[] for _ in pairs]
    for seed in range(config.seeds):
        trainer_configs = [config.trainer_config(agg, loss, seed) for agg, loss in pairs]
        if config.train:
            runs = [run_one(batches, tc, vocab, train=True) for tc in trainer_configs]
        else:
            runs = evaluate_all(batches, trainer_configs, vocab)
        for results, run in zip(per_pair, runs, strict=True):
            results.append(run)
    configs = [
        {
            "aggregation": agg,
            "policy_loss": loss,
            "metrics": {name: _summary([seed[name] for seed in seeds]) for name in seeds[0]},
        }
        for (agg, loss), seeds in zip(pairs, per_pair, strict=True)
    ]
    return {
        "run_id": config.run_id,
        "train": config.train,
        "steps": len(batches),
        "seeds": config.seeds,
        "trajectories": sum(len(b.samples) for b in batches),
        "tokens": sum(b.n_tokens for b in batches),
        "configs": configs,
    }


def evaluate_all(
    batches: list[Batch], trainer_configs: list[TrainerConfig], vocab: int
) -> list[dict[str, float]]:
    """Evaluate-only replay of one seed for all configurations, sharing each batch's forward pass."""
    first = trainer_configs[0]
    fold = first.max_vocab_size if vocab > first.max_vocab_size else None
    policy = TinyPolicy(min(vocab, first.max_vocab_size), first.d_model, seed=first.seed)
    steps = [evaluate_configs(policy, batch, trainer_configs, fold) for batch in batches]
    return [_means([step[k] for step in steps]) for k in range(len(trainer_configs))]


def _means(steps: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "loss": statistics.fmean(s["loss"] for s in steps),
        "grad_norm": statistics.fmean(s["grad_norm"] for s in steps),
        "weight_spread": statistics.fmean(s["prompt_weight_spread"] for s in steps),
        "masked_fraction": statistics.fmean(s["masked_fraction"] for s in steps),
        "clip_fraction": statistics.fmean(s["clip_fraction"] for s in steps),
    }


def _summary(values: Sequence[float]) -> dict[str, Any]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        "values": list(values),
    }


def _tidy(value: float) -> float:
    """Round float noise (e.g. 5.6e-17 for an exact 0) to 0 for display."""
    return 0.0 if abs(value) < 1e-12 else value


def title(report: dict[str, Any]) -> str:
    """One line saying what the ablation replayed."""
    return (
        f"ablation of run {report['run_id']}: {report['steps']} batches, {report['trajectories']} trajectories, "
        f"{report['tokens']} tokens, {report['seeds']} seeds, {'trained' if report['train'] else 'evaluated only'}"
    )


def summary(report: dict[str, Any], text: bool) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows): one row per configuration; each metric as "mean ± std" text, or (not
    `text`) as `<metric>_mean` and `<metric>_std` numbers."""
    names = list(EVAL_METRICS) + (list(TRAIN_METRICS) if report["train"] else [])
    columns = ["aggregation", "policy_loss"]
    columns += names if text else [f"{n}_{stat}" for n in names for stat in ("mean", "std")]
    rows = []
    for c in report["configs"]:
        stats = [(_tidy(c["metrics"][n]["mean"]), _tidy(c["metrics"][n]["std"])) for n in names]
        values = [f"{m:.4g} ± {sd:.2g}" for m, sd in stats] if text else [x for pair in stats for x in pair]
        rows.append([c["aggregation"], c["policy_loss"], *values])
    return columns, rows
