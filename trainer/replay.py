"""An ablation on the run's own model: its consumed batches, in order, through each loss configuration.

`consumed_batches` rebuilds each step's batch from its `batch_consumed` event (the trajectory ids
in the order the trainer had them, at the trainer version it took them), with the tokens from the
lake, passing over batches without a signal (every group scored alike: every loss is 0); `RunModel` (`trainer.run_model`) rebuilds the policy at that version. Evaluate-only, every
configuration is measured on each batch at the weights the run trained on it with, so the run's
own configuration reproduces the run's recorded loss and grad norm (`reproduction` says by how
much); with `train`, every configuration trains from the first batch's weights, one step a batch,
and reports what that did to the policy (reward-free: entropy, KL to the start, drift).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trajlake.store.rewards import check_version, with_rewards_of
from trajlake.trainer.ablate import _behaviour, _means, behaviour_change, configs_report
from trajlake.trainer.batch import Batch, TrajectorySample, pack_micro_batches
from trajlake.trainer.config import AblationConfig, SamplerConfig, TrainerConfig
from trajlake.trainer.sampler import TRUNCATED_STATUSES
from trajlake.trainer.step import evaluate_configs, policy_step
from trajlake.trainer.tokens import read_tokens

if TYPE_CHECKING:
    from trajlake.store.lake import Lake
    from trajlake.trainer.run_model import RunModel

LOSS_TOLERANCE = 1e-5
"""|replayed − recorded| loss within which the run's own configuration reproduces a step (float32, CPU)."""
RECORDED_SQL = """
select step, loss, grad_norm, mismatch, mismatch_tokens from trainer_steps
where run_id = $run and rank = 0 order by step
"""

CONSUMED_COLUMNS = ("step", "trainer_version", "consumed_trajectory_ids", "event_time")
SAMPLE_COLUMNS = (
    "trajectory_id",
    "group_id",
    "task_id",
    "reward",
    "policy_version_min",
    "status",
    "total_tokens",
)


@dataclass
class Consumed:
    """The consumed batches to replay, and what the replay leaves out."""

    batches: list[Batch]
    missing: list[str] = field(default_factory=list)
    """Consumed trajectories the lake no longer holds (left out of their batches)."""
    without_signal: list[int] = field(default_factory=list)
    """Steps passed over: every group of their batch scored alike, so every loss is 0 there."""


def consumed_batches(lake: Lake, run_id: str, steps: int, sampler: SamplerConfig) -> Consumed:
    """The run's first `steps` consumed batches with a signal (a group whose rewards differ), in step
    order, packed as `sampler` packs them."""
    if not lake.exists("events"):
        return Consumed([])
    check_version(lake, run_id, sampler.verifier_version)
    events = lake.read(
        "events", CONSUMED_COLUMNS, "run_id = ? and event_type = 'batch_consumed'", [run_id]
    ).to_pylist()
    events.sort(key=lambda e: (e["step"], e["event_time"]))
    chosen: list[dict[str, Any]] = []
    without: list[int] = []
    scalars: dict[str, dict[str, Any]] = {}
    chunk = max(steps, 8)
    for at in range(0, len(events), chunk):  # the scalars of a few batches at a time: a run may be long
        part = events[at : at + chunk]
        scalars |= consumed_scalars(
            lake, run_id, [tid for e in part for tid in e["consumed_trajectory_ids"]], sampler
        )
        for e in part:
            if len(chosen) < steps:
                if _has_signal(e["consumed_trajectory_ids"], scalars):
                    chosen.append(e)
                else:
                    without.append(e["step"])
        if len(chosen) == steps:
            break
    batches, missing = assemble_batches(lake, run_id, chosen, scalars, sampler)
    return Consumed([b for b in batches if b.samples], missing, without)


def consumed_scalars(
    lake: Lake, run_id: str, trajectory_ids: list[str], sampler: SamplerConfig
) -> dict[str, dict[str, Any]]:
    """Each trajectory's row (SAMPLE_COLUMNS) with its reward by `sampler.verifier_version`; unscored ones left out."""
    ids = sorted(set(trajectory_ids))
    rows = lake.read("trajectories", SAMPLE_COLUMNS, "run_id = ?", [run_id], among=("trajectory_id", ids))
    rows = with_rewards_of(lake, run_id, rows, sampler.verifier_version)
    return {r["trajectory_id"]: r for r in rows.to_pylist() if r["reward"] is not None}


def assemble_batches(
    lake: Lake,
    run_id: str,
    events: list[dict[str, Any]],
    scalars: dict[str, dict[str, Any]],
    sampler: SamplerConfig,
) -> tuple[list[Batch], list[str]]:
    """The batch of each `batch_consumed` event, its trajectories in the order the trainer had them and
    packed as `sampler` packs them; and the consumed trajectories the lake no longer holds."""
    wanted = sorted({tid for e in events for tid in e["consumed_trajectory_ids"]})
    tokens = read_tokens(lake, run_id, wanted, sampler.token_reader)
    batches = []
    for e in events:
        samples = [
            _sample(scalars[tid], tokens[tid], e["trainer_version"], sampler)
            for tid in e["consumed_trajectory_ids"]
            if tid in scalars and tid in tokens
        ]
        micro = pack_micro_batches([s.n_tokens for s in samples], sampler.micro_batch_tokens)
        batches.append(Batch(run_id, e["step"], e["trainer_version"], samples, micro))
    return batches, [tid for tid in wanted if tid not in scalars or tid not in tokens]


def _has_signal(trajectory_ids: list[str], scalars: dict[str, dict[str, Any]]) -> bool:
    """True when some prompt group among the trajectories has rewards that differ."""
    rewards: dict[str, set[float]] = {}
    for tid in trajectory_ids:
        if tid in scalars:
            row = scalars[tid]
            rewards.setdefault(row["group_id"] or tid, set()).add(row["reward"])
    return any(len(r) > 1 for r in rewards.values())


def _sample(row: dict[str, Any], arrays: Any, version: int, sampler: SamplerConfig) -> TrajectorySample:
    ids, lps, mask = arrays
    too_long = (
        sampler.max_sequence_tokens is not None and (row["total_tokens"] or 0) > sampler.max_sequence_tokens
    )
    overlong = row["status"] in TRUNCATED_STATUSES or too_long
    if overlong and sampler.overlong == "mask":
        mask = np.zeros_like(mask)  # as the run's sampler handed it out: in the baseline, not trained on
    pv_min = int(row["policy_version_min"])
    return TrajectorySample(
        trajectory_id=row["trajectory_id"], group_id=row["group_id"] or row["trajectory_id"], task_id=row["task_id"],
        reward=float(row["reward"]), policy_version_min=pv_min, staleness=version - pv_min, token_ids=ids,
        logprobs=lps, loss_mask=mask, overlong=overlong,
    )  # fmt: skip


def run_trainer_config(lake: Lake, run_id: str, catalog_url: str | None) -> TrainerConfig | None:
    """The trainer settings the run recorded in the catalog (`runs.config`), if it has them."""
    from trajlake.store.catalog import Catalog

    if catalog_url is None and ("://" in str(lake.root) or not (Path(lake.root) / "catalog.db").exists()):
        return None  # no embedded catalog: opening one would create it
    catalog = Catalog.for_lake(lake.root, catalog_url)
    try:
        run = catalog.get_run(run_id)
    finally:
        catalog.close()
    config = (run or {}).get("config") or {}
    if "policy_loss" not in config:
        return None  # a run registered by something other than a trainer
    known = {k: v for k, v in config.items() if k in TrainerConfig.model_fields}
    return TrainerConfig.model_validate(known)


def replay_run(
    lake: Lake,
    config: AblationConfig,
    pairs: list[tuple[str, str]],
    model: RunModel,
    catalog_url: str | None = None,
) -> dict[str, Any]:
    """Replay the run's consumed batches through `model` for every configuration; the JSON-ready report."""
    run_config = run_trainer_config(lake, config.run_id, catalog_url)
    base = run_config or TrainerConfig(run_id=config.run_id)
    batches, notes = _batches(lake, config, base if run_config else None)
    variants = [
        base.model_copy(update={"aggregation": agg, "policy_loss": loss, "advantage": config.advantage or base.advantage,
                                "lr": config.lr or base.lr})
        for agg, loss in pairs
    ]  # fmt: skip
    run_pair = (
        (base.aggregation, base.policy_loss)
        if run_config and variants[0].advantage == base.advantage
        else None
    )
    policy = model.build()
    fold = policy.vocab_size if model.vocab_size and model.vocab_size > policy.vocab_size else None
    report: dict[str, Any] = {
        "run_id": config.run_id, "train": config.train, "steps": len(batches), "seeds": 1,
        "model": {"kind": model.kind, "describes": model.describes, "base": model.base},
        "run_config": {"aggregation": base.aggregation, "policy_loss": base.policy_loss, "advantage": base.advantage,
                       "lr": base.lr} if run_config else None,
        "trajectories": sum(len(b.samples) for b in batches), "tokens": sum(b.n_tokens for b in batches),
    }  # fmt: skip
    if config.train:
        per_pair = [[train_variant(model, batches, variant, fold)] for variant in variants]
    else:
        steps, report["versions"] = evaluate_at_checkpoints(model, policy, batches, variants, fold)
        per_pair = [[_means([step[k] for step in steps])] for k in range(len(variants))]
        if run_pair in pairs:
            report["reproduction"] = reproduction(lake, config.run_id, batches, steps, pairs.index(run_pair))
    report["notes"] = notes + model.notes + mismatch_note(per_pair[0][0], base.mismatch_threshold)
    report["configs"] = configs_report(pairs, per_pair, run_pair)
    return report


def _batches(
    lake: Lake, config: AblationConfig, run_config: TrainerConfig | None
) -> tuple[list[Batch], list[str]]:
    """The batches to replay, packed as the run's sampler packed them; and notes on what the replay lacks."""
    sampler = (
        run_config.sampler if run_config else SamplerConfig(micro_batch_tokens=config.micro_batch_tokens)
    ).model_copy(update={"verifier_version": config.verifier_version})
    consumed = consumed_batches(lake, config.run_id, config.steps, sampler)
    batches, missing, without = consumed.batches, consumed.missing, consumed.without_signal
    if not batches:
        raise ValueError(
            f"run {config.run_id!r} recorded a trainer but no consumed batch with a signal to replay "
            f"({len(without)} without one); check the run id "
            '(trajlake sql "select distinct run_id from batch_consumption")'
        )
    notes = [] if run_config else [
        "the run recorded no trainer settings in the catalog: the replay uses TrainerConfig's defaults"
    ]  # fmt: skip
    if without:
        notes.append(f"passed over {len(without)} consumed batches without a signal (every group scored alike: "
                     f"every loss is 0 there): steps {without}")  # fmt: skip
    if missing:
        notes.append(f"{len(missing)} consumed trajectories are no longer in the lake (e.g. {missing[0]}): "
                     "their batches are replayed without them")  # fmt: skip
    return batches, notes


def mismatch_note(figures: dict[str, Any], threshold: float) -> list[str]:
    """A warning when the replayed weights do not give the engine's logprobs on the tokens they generated."""
    mismatch = figures.get("mismatch")
    if mismatch is None or mismatch < threshold:
        return []
    return [
        f"engine mismatch {mismatch:.3g} is above {threshold:g}: the replayed model does not give the logprobs "
        "the engine sampled with (a sampling mask the run did not record, another precision or model), so "
        "ratios, clip and mask fractions describe that difference too"
    ]


def evaluate_at_checkpoints(
    model: RunModel, policy: Any, batches: list[Batch], variants: list[TrainerConfig], fold: int | None
) -> tuple[list[list[dict[str, Any]]], list[int]]:
    """Every variant's figures on each batch at the version the run consumed it at; and the versions loaded."""
    steps: list[list[dict[str, Any]]] = []
    versions: list[int] = []
    loaded: int | None = None
    for batch in batches:
        wanted = model.resolve(batch.trainer_version)
        if wanted != loaded:
            loaded = model.load(policy, wanted)
        steps.append(evaluate_configs(policy, batch, variants, fold, weights_version=wanted))
        versions.append(wanted)
    return steps, versions


def train_variant(
    model: RunModel, batches: list[Batch], variant: TrainerConfig, fold: int | None
) -> dict[str, Any]:
    """Train a copy of the run's policy on `batches` with one variant, from the first batch's weights."""
    import torch

    policy = model.build()
    start = model.load(policy, batches[0].trainer_version)
    before = _behaviour(policy, batches, fold, variant.temperature)
    optimizer = torch.optim.Adam(policy.parameters(), lr=variant.lr)
    # after its first step the weights are no version the run published: no token measures the engine there
    steps = [
        policy_step(policy, optimizer, batch, variant, fold, weights_version=start if i == 0 else None)
        for i, batch in enumerate(batches)
    ]
    return _means(steps) | behaviour_change(before, _behaviour(policy, batches, fold, variant.temperature))


def reproduction(
    lake: Lake, run_id: str, batches: list[Batch], steps: list[list[dict[str, Any]]], k: int
) -> dict[str, Any]:
    """The run's own configuration replayed against what its trainer recorded, per step and at the first."""
    recorded = {r["step"]: r for r in lake.sql(RECORDED_SQL, {"run": run_id}).to_pylist()}
    compared = []
    for batch, step in zip(batches, steps, strict=True):
        row = recorded.get(batch.step)
        if row is None or row["loss"] is None:
            continue
        mine = step[k]
        compared.append({
            "step": batch.step, "recorded_loss": row["loss"], "replayed_loss": mine["loss"],
            "loss_diff": abs(mine["loss"] - row["loss"]), "recorded_grad_norm": row["grad_norm"],
            "replayed_grad_norm": mine["grad_norm"], "recorded_mismatch": row["mismatch"], "replayed_mismatch": mine["mismatch"],
        })  # fmt: skip
    worst = max((c["loss_diff"] for c in compared), default=None)
    norms = [
        abs(c["replayed_grad_norm"] - c["recorded_grad_norm"]) / c["recorded_grad_norm"]
        for c in compared
        if c["recorded_grad_norm"]
    ]
    return {
        "tolerance": LOSS_TOLERANCE,
        "steps": compared,
        "first_loss_diff": compared[0]["loss_diff"] if compared else None,
        "max_loss_diff": worst,
        "max_grad_norm_rel_diff": max(norms, default=None),
        "within_tolerance": worst is not None and worst <= LOSS_TOLERANCE,
    }
