"""A replay that checks itself: recompute a stored trainer step and set it beside what the trainer recorded.

For step N of a run (`trajlake ablate --verify-step N`) the check rebuilds the policy at the version
the trainer held before the step (`RunModel`: the run's model and the checkpoint `policy_versions`
recorded for that version; a missing one is a failure, never stood in for), re-reads the batch the
step trained on (the `batch_consumed` record of its hand-out, `trainer_steps.batch_step`: the
trajectories in the trainer's order, their rewards and tokens as the sampler handed them out) and
recomputes the step with the run's own settings (`runs.config` in the catalog), without an update.
Each figure of `trainer_steps`, and the advantages `batch_consumption` kept, is set beside its
recomputation with a tolerance; the step reproduces when every one is within it.

When the step kept its per-token values (`trainer_tokens`, every `token_values_every`-th step), each
list (trainer logprobs, entropies, importance ratios, clipped and masked flags) is recomputed too and
its largest difference over every token checked. A step draws no random numbers on the tiny GRU or
on a model without dropout, so no RNG state is needed; a model with dropout is named in a note.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trajlake.trainer.config import SamplerConfig, TrainerConfig
from trajlake.trainer.replay import (
    CONSUMED_COLUMNS,
    LOSS_TOLERANCE,
    assemble_batches,
    consumed_scalars,
    run_trainer_config,
)

if TYPE_CHECKING:
    from trajlake.store.lake import Lake
    from trajlake.trainer.batch import Batch
    from trajlake.trainer.run_model import RunModel


@dataclass(frozen=True)
class Tolerance:
    """How far a recomputed value may be from the recorded one: absolute, or relative to the recorded."""

    value: float
    relative: bool = False

    def allowed(self, recorded: float) -> float:
        """The largest |recomputed − recorded| within tolerance."""
        return self.value * abs(recorded) if self.relative else self.value


EXACT = Tolerance(0.0)
TOLERANCES: dict[str, Tolerance] = {
    "loss": Tolerance(LOSS_TOLERANCE),
    "grad_norm": Tolerance(1e-4, relative=True),  # float32 sums over every parameter
    "entropy": Tolerance(1e-5),
    "clip_fraction": Tolerance(1e-6),  # shares of counted tokens: equal unless a token crosses a clip bound
    "masked_fraction": Tolerance(1e-6),
    "mismatch": Tolerance(1e-6),  # float32 logprobs recomputed: ~1e-7 apart at most
    "mismatch_tokens": EXACT,
    "drift": Tolerance(1e-5),
    "drift_kl": Tolerance(1e-5),
    "drift_tokens": EXACT,
    "n_trajectories": EXACT,
    "n_tokens": EXACT,
    "reward_mean": Tolerance(1e-6),
    "staleness_mean": Tolerance(1e-9),
    "advantage": Tolerance(1e-5),  # `batch_consumption`'s, of the trajectory where they differ most
}
"""Each checked value and its tolerance (float32 on CPU; exact where the value counts things)."""
TOKEN_TOLERANCES: dict[str, Tolerance] = {
    "trainer_logprobs": Tolerance(1e-5),
    "entropies": Tolerance(1e-5),
    "ratios": Tolerance(1e-5, relative=True),
    "clipped": EXACT,  # tokens whose flag differs
    "masked": EXACT,
}
"""The per-token lists of `trainer_tokens`, each checked by its largest difference over the step's tokens."""


def verify_step(
    lake: Lake, run_id: str, step: int, catalog_url: str | None = None, verifier_version: str | None = None
) -> dict[str, Any]:
    """Recompute `step` of `run_id` and compare it with its record; the JSON-ready report.

    The batch's rewards are those of `verifier_version`, default the one the run's sampler trained on.

    Raises ValueError (naming the fix) when the step cannot be replayed at all: no record of the
    step or of its batch, no trainer settings, no model. A checkpoint that is gone is a failed check.
    """
    from trajlake.trainer.run_model import run_model

    config = run_trainer_config(lake, run_id, catalog_url)
    if config is None:
        raise ValueError(
            f"run {run_id!r} has no trainer settings in the catalog (runs.config), so its loss cannot be "
            "recomputed; pass --catalog (TRAJLAKE_CATALOG_URL) of the catalog its trainer used"
        )
    recorded = recorded_step(lake, run_id, step)
    version = verifier_version or config.sampler.verifier_version
    batch, advantages, missing = _step_batch(
        lake, run_id, recorded, config.sampler.model_copy(update={"verifier_version": version})
    )
    weights = int(recorded["trainer_version"]) - 1  # the step's trainer_version is the one it produced
    model = run_model(lake, run_id)
    if model.kind == "fresh":
        raise ValueError(
            f"run {run_id!r} recorded no model to replay (no checkpoint in policy_versions); only a trainer "
            "that publishes checkpoints can be checked"
        )
    report = _header(run_id, step, batch.step, weights, model, config, batch)
    report["notes"] = [f"{len(missing)} consumed trajectories are no longer in the lake (e.g. {missing[0]})"] if missing else []  # fmt: skip
    if model.nearest(weights) != weights:
        gone = model.checkpoints.get(weights, model.base)
        report |= {"values": [], "reproduces": False, "worst": None,
                   "failure": f"the checkpoint of version {weights} ({gone}) is gone: the step's weights cannot be rebuilt"}  # fmt: skip
        return report
    replayed, notes = _replay(model, weights, batch, config)
    recorded["advantage"], replayed["advantage"] = _furthest(advantages, batch.advantages)
    report["notes"] += notes
    checked = compare(recorded, replayed)
    tokens = token_values_check(lake, recorded, batch, config)
    if tokens is None:
        report["notes"].append("the step kept no per-token values (trainer_tokens): they are not checked")
        return report | checked
    return report | summed([*checked["values"], *tokens])


def _step_batch(
    lake: Lake, run_id: str, recorded: dict[str, Any], sampler: SamplerConfig
) -> tuple[Batch, list[float] | None, list[str]]:
    """`consumed_batch` of the hand-out the recorded step trained on (`batch_step`; a row without one: its own)."""
    if recorded.get("batch_step") is not None:
        return consumed_batch(lake, run_id, int(recorded["batch_step"]), sampler)
    try:
        return consumed_batch(lake, run_id, int(recorded["step"]), sampler)
    except ValueError as err:
        raise ValueError(
            f"{err}; the step's trainer_steps row predates batch_step, which names the hand-out a step "
            "trained on again (the overfit check's later steps train on step 0's batch)"
        ) from None


def _replay(
    model: RunModel, weights: int, batch: Batch, config: TrainerConfig
) -> tuple[dict[str, Any], list[str]]:
    """The step's figures recomputed at version `weights` without an update; and notes on what may differ."""
    from trajlake.trainer.step import policy_step

    policy = model.build(config.temperature)
    model.load(policy, weights)
    fold = policy.vocab_size if model.vocab_size and model.vocab_size > policy.vocab_size else None
    replayed = policy_step(policy, None, batch, config, fold, weights_version=weights, keep_token_values=True)
    return replayed, dropout_note(policy)


def token_values_check(
    lake: Lake, recorded: dict[str, Any], batch: Batch, config: TrainerConfig
) -> list[dict[str, Any]] | None:
    """The per-token values the step kept beside the replay's (`_replay` kept them on `batch`): for each
    list the tokens on each side and its largest |Δ| over them (flags: how many differ); None when the
    step kept none."""
    from trajlake.trainer.token_values import LISTS, StepInfo, token_values_table, turn_spans

    run_id, step = batch.run_id, int(recorded["step"])
    if not lake.exists("trainer_tokens"):
        return None
    where = "run_id = ? and step = ? and rank = 0"
    kept = lake.read("trainer_tokens", ["trajectory_id", "seq", "created_at", *LISTS], where, [run_id, step])
    if not kept.num_rows:
        return None
    info = StepInfo(step, int(recorded["trainer_version"]), 0, config.policy_loss)
    replayed = token_values_table(batch, turn_spans(lake, run_id, batch.trajectory_ids), info)
    mine = {(r["trajectory_id"], r["seq"]): r for r in replayed.to_pylist()}
    theirs = {
        (r["trajectory_id"], r["seq"]): r for r in kept.sort_by("created_at").to_pylist()
    }  # a rewrite: the last
    values = []
    for name, tolerance in TOKEN_TOLERANCES.items():
        diff = _largest_token_diff(
            [(theirs[k][name], mine.get(k, {}).get(name)) for k in theirs], tolerance is EXACT
        )
        if set(mine) != set(theirs):
            diff = None  # turns kept on one side only
        allowed = tolerance.allowed(1.0)
        counts = [
            sum(len(r[name] or ()) for r in side.values()) for side in (theirs, mine)
        ]  # tokens on each side
        values.append({"name": f"{name} (per token)", "recorded": counts[0], "replayed": counts[1], "diff": diff,
                       "tolerance": allowed, "within": diff is not None and diff <= allowed})  # fmt: skip
    return values


def _largest_token_diff(pairs: list[tuple[list | None, list | None]], flags: bool) -> float | None:
    """The largest |recorded − replayed| over aligned token lists (flags: the number that differ);
    None where a list is missing, a length differs or a token was trained on one side only."""
    worst = 0.0
    for recorded, replayed in pairs:
        if recorded is None or replayed is None or len(recorded) != len(replayed):
            return None
        a = np.array([math.nan if v is None else float(v) for v in recorded])
        b = np.array([math.nan if v is None else float(v) for v in replayed])
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            return None
        gap = np.abs(a - b)[~np.isnan(a)]
        if gap.size:
            worst = worst + float(np.count_nonzero(gap)) if flags else max(worst, float(gap.max()))
    return worst


def _header(
    run_id: str,
    step: int,
    batch_step: int,
    weights: int,
    model: RunModel,
    config: TrainerConfig,
    batch: Batch,
) -> dict[str, Any]:
    return {
        "run_id": run_id, "step": step, "batch_step": batch_step, "weights_version": weights,
        "checkpoint": model.checkpoints.get(weights) or (model.base if model.kind == "hf" else None), "model": model.describes,
        "settings": {"policy_loss": config.policy_loss, "aggregation": config.aggregation, "advantage": config.advantage},
        "trajectories": len(batch.samples), "tokens": batch.n_tokens,
    }  # fmt: skip


def recorded_step(lake: Lake, run_id: str, step: int) -> dict[str, Any]:
    """The trainer's row of `step` (rank 0; the last written if a resumed run wrote it twice)."""
    if not lake.exists("trainer_steps"):
        raise ValueError(
            f"the lake holds no trainer_steps: run {run_id!r} was not trained with a trainer that records them"
        )
    rows = lake.sql(
        "select * from trainer_steps where run_id = $run and rank = 0 and loss is not null order by step, created_at",
        {"run": run_id},
    ).to_pylist()
    mine = [r for r in rows if r["step"] == step]
    if not mine:
        known = sorted({r["step"] for r in rows})
        there = f"its recorded steps are {known[0]}..{known[-1]}" if known else "it recorded none"
        raise ValueError(f"run {run_id!r} has no trainer step {step}: {there}; pick one of them")
    return mine[-1]


def consumed_batch(
    lake: Lake, run_id: str, step: int, sampler: SamplerConfig
) -> tuple[Batch, list[float] | None, list[str]]:
    """The batch handed out at `step` as the trainer had it, the advantages the step recorded (in the
    batch's order; None if none), and the consumed trajectories the lake no longer holds."""
    events = lake.read(
        "events", [*CONSUMED_COLUMNS, "consumed_advantages"],
        "run_id = ? and event_type = 'batch_consumed' and step = ?", [run_id, step],
    ).to_pylist()  # fmt: skip
    if len(events) != 1:
        what = "no record of the batch" if not events else f"{len(events)} batches (one per rank)"
        raise ValueError(
            f"run {run_id!r} has {what} handed out at step {step}; only a step whose batch one trainer "
            "committed (batch_consumed) can be replayed"
        )
    (event,) = events
    ids = event["consumed_trajectory_ids"]
    scalars = consumed_scalars(lake, run_id, ids, sampler)
    (batch,), missing = assemble_batches(lake, run_id, [event], scalars, sampler)
    kept = event["consumed_advantages"]
    advantages = (
        None if kept is None else [dict(zip(ids, kept, strict=True))[s.trajectory_id] for s in batch.samples]
    )
    return batch, advantages, missing


def _furthest(
    recorded: list[float] | None, replayed: list[float] | None
) -> tuple[float | None, float | None]:
    """The recorded and recomputed advantage of the trajectory where they differ most (None: none recorded)."""
    if recorded is None or replayed is None or not recorded:
        return None, None
    return max(zip(recorded, replayed, strict=True), key=lambda pair: abs(pair[0] - pair[1]))


def compare(recorded: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """Each value beside its recomputation: |Δ|, the tolerance, within or not; the worst by |Δ| / tolerance."""
    values: list[dict[str, Any]] = []
    for name, tolerance in TOLERANCES.items():
        mine, theirs = replayed.get(name), recorded.get(name)
        diff: float | None = None  # measured on one side only: out of any tolerance
        if mine is None and theirs is None:
            diff = 0.0
        elif mine is not None and theirs is not None:
            diff = abs(float(mine) - float(theirs))
        allowed = tolerance.allowed(theirs or 0.0)
        values.append({"name": name, "recorded": theirs, "replayed": mine, "diff": diff, "tolerance": allowed,
                       "within": diff is not None and diff <= allowed})  # fmt: skip
    return summed(values)


def summed(values: list[dict[str, Any]]) -> dict[str, Any]:
    """The checked values, the worst of them by |Δ| / tolerance, and whether every one is within."""
    worst = max(values, key=lambda v: (not v["within"], _share(v["diff"], v["tolerance"])))
    return {"values": values, "worst": worst, "reproduces": all(v["within"] for v in values)}


def _share(diff: float | None, tolerance: float) -> float:
    """How much of its tolerance a difference uses (an exact value: 0 or infinite; one side unmeasured: infinite)."""
    if diff is None:
        return math.inf
    return diff / tolerance if tolerance else (math.inf if diff else 0.0)


def dropout_note(policy: Any) -> list[str]:
    """A note when the model declares dropout: the trainer's RNG state is not recorded, so its masks are not replayed."""
    config = getattr(getattr(policy, "model", None), "config", None)
    rates = {
        k: v
        for k, v in (config.to_dict() if config is not None else {}).items()
        if "dropout" in k and isinstance(v, float) and v > 0
    }
    if not rates:
        return []
    return [
        f"the model declares dropout {rates}: the trainer's random masks are not recorded, so values may differ by them"
    ]


def failures(report: dict[str, Any]) -> list[str]:
    """One phrase per value out of tolerance (or the reason the step could not be rebuilt)."""
    if report.get("failure"):
        return [report["failure"]]
    return [
        f"{v['name']} recorded {_shown(v['recorded'])}, replayed {_shown(v['replayed'])} "
        f"({_gap(v['diff'], v['tolerance'])})"
        for v in report["values"]
        if not v["within"]
    ]


def title(report: dict[str, Any]) -> str:
    """What the check replayed: the step, its batch, the weights and the run's settings."""
    settings = report["settings"]
    again = (
        ""
        if report["batch_step"] == report["step"]
        else f" (trained on again from step {report['batch_step']})"
    )
    weights = report["checkpoint"] or "the run's initial weights"
    return (
        f"step {report['step']} of run {report['run_id']}: {report['trajectories']} trajectories, {report['tokens']} "
        f"tokens{again}, at version {report['weights_version']} ({weights}), with the run's "
        f"{settings['aggregation']} × {settings['policy_loss']} ({settings['advantage']} advantages)"
    )


def table(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """(columns, rows): each checked value, recorded and recomputed, their |Δ| and tolerance, and whether within."""
    rows = [[v["name"], v["recorded"], v["replayed"], v["diff"], v["tolerance"], "yes" if v["within"] else "NO"]
            for v in report["values"]]  # fmt: skip
    return ["value", "recorded", "replayed", "diff", "tolerance", "within"], rows


def _gap(diff: float | None, tolerance: float, within: bool = False) -> str:
    if diff is None:
        return "measured on one side only"
    return f"|Δ| {diff:.3g} {'within' if within else '>'} tolerance {tolerance:.3g}"


def _shown(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"


def verdict(report: dict[str, Any]) -> str:
    """One line: reproduces or not, with the largest difference against its tolerance."""
    where = f"step {report['step']} of run {report['run_id']}"
    if report["reproduces"]:
        w = report["worst"]
        if not w["diff"]:
            return f"{where} reproduces: every value exactly as recorded"
        return f"{where} reproduces: largest difference {w['name']} {_gap(w['diff'], w['tolerance'], within=True)}"
    return f"{where} does NOT reproduce: " + "; ".join(failures(report))
