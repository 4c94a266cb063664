"""Offline loss ablations: replay a run's stored batches through each loss configuration.

Every configuration (aggregation × policy loss) sees the same batches in the same order from the
same weights, so differences come from the loss alone. A run whose trainer recorded its model is
replayed through that model (`trainer.replay`): each batch it consumed, at the checkpoint of the
version it consumed it at. A run without one (loadgen, imports) is replayed through fresh tiny
GRUs, one per seed, on its groups with reward variance: figures of each loss at random weights.
Evaluate-only mode measures each batch's loss and gradient at those weights; `train` mode takes
an optimiser step per batch and also reports what training did to the policy.

Per configuration:
    loss, grad_norm, entropy (of the policy on the batch's trained tokens), clip_fraction,
    masked_fraction (tokens whose gradient the trust region zeroed), weight_spread (coefficient of
    variation of the total loss weight per prompt: 0 means every prompt weighs the same), mismatch
    (the engine mismatch, on tokens the replayed weights generated; - where none did);
    with training, reward-free behaviour on the replayed data: entropy_after (mean token entropy
    after training), kl_to_start (approximate KL(start ‖ trained) per token), drift (mean |Δ| of
    each sequence's mean logprob), and reward_proxy (mean logprob of rewarded minus unrewarded
    sequences, change from the start: > 0 means the policy moved toward rewarded behaviour).
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

EVAL_METRICS = (
    "loss",
    "grad_norm",
    "entropy",
    "weight_spread",
    "masked_fraction",
    "clip_fraction",
    "mismatch",
)
TRAIN_METRICS = ("reward_proxy", "entropy_after", "kl_to_start", "drift")


def replay_batches(lake: Lake, config: AblationConfig) -> list[Batch]:
    """The run's batches for replay: finished, non-system-failure groups with reward variance, oldest first."""
    sampler_config = SamplerConfig(
        run_id=config.run_id, max_staleness=10**9, group_wait_s=0, groups_per_batch=config.groups_per_batch,
        micro_batch_tokens=config.micro_batch_tokens, verifier_version=config.verifier_version,
    )  # fmt: skip
    return Sampler(lake, None, sampler_config).plan(trainer_version=0, n_batches=config.steps)


def _behaviour(
    policy: Any, batches: list[Batch], fold: int | None, temperature: float = 1.0
) -> dict[str, Any]:
    """Per-sequence mean trained-token logprob and reward, every trained token's logprob, and the entropy sum."""
    means, rewards, tokens, entropy = [], [], [], 0.0
    with torch.no_grad():
        for batch in batches:
            for indices in batch.micro_batches:
                mb = batch.tensors(indices, vocab_size=fold)
                mask = mb.loss_mask
                lps, ent = policy.logprobs_and_entropy(
                    mb.input_ids, mb.attention_mask, temperature, positions=mask
                )
                counts = mask.sum(dim=1).clamp(min=1)
                means += ((lps * mask).sum(dim=1) / counts).tolist()
                rewards += mb.rewards.tolist()
                tokens.append(lps[mask].double())
                entropy += float(ent[mask].sum())
    flat = torch.cat(tokens) if tokens else torch.zeros(0, dtype=torch.float64)
    return {"means": means, "rewards": rewards, "tokens": flat, "entropy": entropy}


def _preference(means: list[float], rewards: list[float]) -> float:
    good = [m for m, r in zip(means, rewards, strict=True) if r > 0.5]
    bad = [m for m, r in zip(means, rewards, strict=True) if r <= 0.5]
    return (statistics.fmean(good) if good else 0.0) - (statistics.fmean(bad) if bad else 0.0)


def behaviour_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """What training did to the policy on the replayed data, from `_behaviour` before and after.

    kl_to_start: KL(start ‖ trained) per trained token, the k3 estimator E[r − 1 − log r] with
    r = π_trained / π_start on the replayed tokens (sampled by the run's policy near the start).
    """
    log_ratio = after["tokens"] - before["tokens"]
    n = max(len(log_ratio), 1)
    return {
        "reward_proxy": _preference(after["means"], after["rewards"])
        - _preference(before["means"], before["rewards"]),
        "entropy_after": after["entropy"] / n,
        "kl_to_start": float((torch.expm1(log_ratio.clamp(max=20.0)) - log_ratio).sum()) / n,
        "drift": statistics.fmean(abs(a - b) for a, b in zip(after["means"], before["means"], strict=True))
        if after["means"]
        else 0.0,
    }


def run_one(batches: list[Batch], trainer_config: TrainerConfig, vocab: int, train: bool) -> dict[str, Any]:
    """Replay `batches` through one configuration and seed of a fresh tiny GRU; return the mean of each metric."""
    fold = trainer_config.max_vocab_size if vocab > trainer_config.max_vocab_size else None
    policy = TinyPolicy(
        min(vocab, trainer_config.max_vocab_size), trainer_config.d_model, seed=trainer_config.seed
    )
    optimizer = torch.optim.Adam(policy.parameters(), lr=trainer_config.lr) if train else None
    before = _behaviour(policy, batches, fold) if train else None
    out = _means([policy_step(policy, optimizer, batch, trainer_config, fold) for batch in batches])
    if before is not None:
        out |= behaviour_change(before, _behaviour(policy, batches, fold))
    return out


def run_ablation(
    lake: Lake, config: AblationConfig, vocab_size: int | None = None, catalog_url: str | None = None
) -> dict[str, Any]:
    """Replay the run through every configuration; return the JSON-ready report.

    A run that recorded its trainer's model (`policy_versions`, the trajectories' model) is replayed
    through that model at the versions it consumed each batch at (`trainer.replay`; its settings from
    the catalog at `catalog_url`, default the lake's); any other through fresh tiny GRUs.
    """
    from trajlake.trainer.reference import run_vocab_size
    from trajlake.trainer.run_model import run_model

    pairs = [(agg, loss) for agg in config.aggregations for loss in config.policy_losses]
    for agg, loss in pairs:
        config.trainer_config(agg, loss, 0)  # fail on a bad name before any work
    model = run_model(lake, config.run_id)
    if model.kind != "fresh":
        from trajlake.trainer.replay import replay_run

        return replay_run(lake, config, pairs, model, catalog_url)
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
    return {
        "run_id": config.run_id, "train": config.train, "steps": len(batches), "seeds": config.seeds,
        "model": {"kind": model.kind, "describes": model.describes}, "notes": [],
        "trajectories": sum(len(b.samples) for b in batches), "tokens": sum(b.n_tokens for b in batches),
        "configs": configs_report(pairs, per_pair),
    }  # fmt: skip


def configs_report(
    pairs: list[tuple[str, str]],
    per_pair: list[list[dict[str, Any]]],
    run_pair: tuple[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One entry per configuration: its names, whether it is the run's own, and each metric's summary over seeds."""
    return [
        {
            "aggregation": agg,
            "policy_loss": loss,
            "run": (agg, loss) == run_pair,
            "metrics": {name: _summary([seed[name] for seed in seeds]) for name in seeds[0]},
        }
        for (agg, loss), seeds in zip(pairs, per_pair, strict=True)
    ]


def evaluate_all(
    batches: list[Batch], trainer_configs: list[TrainerConfig], vocab: int
) -> list[dict[str, float]]:
    """Evaluate-only replay of one seed for all configurations, sharing each batch's forward pass."""
    first = trainer_configs[0]
    fold = first.max_vocab_size if vocab > first.max_vocab_size else None
    policy = TinyPolicy(min(vocab, first.max_vocab_size), first.d_model, seed=first.seed)
    steps = [evaluate_configs(policy, batch, trainer_configs, fold) for batch in batches]
    return [_means([step[k] for step in steps]) for k in range(len(trainer_configs))]


def _means(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of each step figure over `steps`; the engine mismatch weighted by its tokens (None: none measured)."""
    measured = [s for s in steps if s.get("mismatch_tokens")]
    tokens = sum(s["mismatch_tokens"] for s in measured)
    return {
        "loss": statistics.fmean(s["loss"] for s in steps),
        "grad_norm": statistics.fmean(s["grad_norm"] for s in steps),
        "entropy": statistics.fmean(s["entropy"] for s in steps),
        "weight_spread": statistics.fmean(s["prompt_weight_spread"] for s in steps),
        "masked_fraction": statistics.fmean(s["masked_fraction"] for s in steps),
        "clip_fraction": statistics.fmean(s["clip_fraction"] for s in steps),
        "mismatch": sum(s["mismatch"] * s["mismatch_tokens"] for s in measured) / tokens if tokens else None,
    }


def _summary(values: Sequence[float | None]) -> dict[str, Any]:
    """Mean and spread over seeds (of the seeds that measured the figure; None when none did)."""
    known = [v for v in values if v is not None]
    return {
        "mean": statistics.fmean(known) if known else None,
        "std": statistics.pstdev(known) if len(known) > 1 else 0.0 if known else None,
        "values": list(values),
    }


def _tidy(value: float | None) -> float | None:
    """Round float noise (e.g. 5.6e-17 for an exact 0) to 0 for display."""
    return None if value is None else 0.0 if abs(value) < 1e-12 else value


def title(report: dict[str, Any]) -> str:
    """One line saying what the ablation replayed."""
    seeds = f"{report['seeds']} seeds, " if report["model"]["kind"] == "fresh" else ""
    return (
        f"ablation of run {report['run_id']}: {report['steps']} batches, {report['trajectories']} trajectories, "
        f"{report['tokens']} tokens, {seeds}{'trained' if report['train'] else 'evaluated only'}"
    )


def notes(report: dict[str, Any]) -> list[str]:
    """Lines under the title: the model replayed, at which versions, what stood in for what, and
    whether the run's own configuration reproduced the run."""
    lines = [f"model: {report['model']['describes']}"]
    if report.get("versions"):
        lines.append(f"weights: the version each batch was consumed at: {report['versions']}")
    elif report["train"] and report["model"]["kind"] != "fresh":
        lines.append("weights: trained from the version the first batch was consumed at, a step per batch")
    if report.get("run_config"):
        rc = report["run_config"]
        lines.append(f"the run trained with {rc['aggregation']} × {rc['policy_loss']} ({rc['advantage']} advantages): "
                     "its row is marked `run`")  # fmt: skip
    lines += [f"note: {n}" for n in report.get("notes", [])]
    rep = report.get("reproduction")
    if rep and rep["steps"]:
        first = rep["steps"][0]
        verdict = "reproduces" if rep["within_tolerance"] else "does NOT reproduce"
        lines.append(
            f"replayed as the run trained, it {verdict} the run's recorded loss: step {first['step']} "
            f"{first['replayed_loss']:.6g} against {first['recorded_loss']:.6g} (|Δ| {rep['first_loss_diff']:.2g}), "
            f"max |Δ| {rep['max_loss_diff']:.2g} over {len(rep['steps'])} steps (tolerance {rep['tolerance']:g})"
        )
    return lines


def summary(report: dict[str, Any], text: bool) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows): one row per configuration; each metric as "mean ± std" text (the mean alone
    for one seed), or (not `text`) as `<metric>_mean` and `<metric>_std` numbers; then `run`."""
    names = list(EVAL_METRICS) + (list(TRAIN_METRICS) if report["train"] else [])
    columns = ["aggregation", "policy_loss"]
    columns += names if text else [f"{n}_{stat}" for n in names for stat in ("mean", "std")]
    rows = []
    for c in report["configs"]:
        stats = [(_tidy(c["metrics"][n]["mean"]), _tidy(c["metrics"][n]["std"])) for n in names]
        if text:
            values: list[Any] = [_shown(m, sd, report["seeds"]) for m, sd in stats]
        else:
            values = [x for pair in stats for x in pair]
        rows.append([c["aggregation"], c["policy_loss"], *values, "yes" if c.get("run") else ""])
    return [*columns, "run"], rows


def _shown(mean: float | None, std: float | None, seeds: int) -> str:
    if mean is None:
        return "-"
    return f"{mean:.4g}" if seeds == 1 else f"{mean:.4g} ± {std:.2g}"
