"""Logprob gaps between the rollouts and the trainer: the engine mismatch, and the policy's drift.

The same figure, mean |rollout logprob − trainer logprob| over sampled tokens, means two things:
- on tokens the trainer's very weights generated (same policy version) it is the train/inference
  mismatch: numerics, kernels, re-tokenisation. The field's health threshold is 0.03; above it
  "on-policy" data is silently off-policy. `trainer_steps.mismatch`, with `mismatch_tokens`.
- on tokens older weights generated it is the policy's drift since then (what importance ratios
  correct), recorded apart as `trainer_steps.drift` / `drift_kl` / `drift_by_staleness`.
Each gap also carries an approximate KL(behaviour ‖ trainer) over its tokens (the k3 estimator,
E[r − 1 − log r] with r = π/μ, unbiased and non-negative on tokens sampled from μ).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trajlake.store.config import MISMATCH_THRESHOLD

if TYPE_CHECKING:
    from trajlake.store.lake import Lake


@dataclass
class Mismatch:
    """Mean absolute logprob difference over `n_tokens` tokens, its approximate KL, and whether it is healthy."""

    mean_abs_diff: float | None
    max_abs_diff: float | None
    n_tokens: int
    threshold: float = MISMATCH_THRESHOLD
    kl: float | None = None
    """Approximate KL(rollout policy ‖ trainer policy) per token (k3 estimator)."""

    @property
    def healthy(self) -> bool | None:
        """True when the mean difference is below the threshold; None when no token was measured."""
        return None if self.mean_abs_diff is None else self.mean_abs_diff < self.threshold


def logprob_mismatch(
    rollout_logprobs: torch.Tensor,
    trainer_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    threshold: float = MISMATCH_THRESHOLD,
) -> Mismatch:
    """Mismatch over the tokens where `loss_mask` is set (the sampled ones), [B, T] inputs.

    mismatch = Σ_t m_t · |logμ_t − logπ_t| / Σ_t m_t
    kl       = Σ_t m_t · (r_t − 1 − log r_t) / Σ_t m_t,   log r_t = logπ_t − logμ_t
    """
    mask = loss_mask.bool()
    log_ratio = (trainer_logprobs.detach().double() - rollout_logprobs.detach().double())[mask]
    if log_ratio.numel() == 0:
        return Mismatch(None, None, 0, threshold)
    diff = log_ratio.abs()
    kl = torch.expm1(log_ratio.clamp(max=20.0)) - log_ratio
    return Mismatch(float(diff.mean()), float(diff.max()), int(diff.numel()), threshold, float(kl.mean()))


def combine(parts: list[Mismatch]) -> Mismatch:
    """The mismatch of a whole batch from its micro-batches' (token-weighted)."""
    measured = [p for p in parts if p.n_tokens]
    n = sum(p.n_tokens for p in measured)
    threshold = parts[0].threshold if parts else MISMATCH_THRESHOLD
    if n == 0:
        return Mismatch(None, None, 0, threshold)
    mean = sum((p.mean_abs_diff or 0.0) * p.n_tokens for p in measured) / n
    worst = max(p.max_abs_diff or 0.0 for p in measured)
    kl = sum((p.kl or 0.0) * p.n_tokens for p in measured) / n
    return Mismatch(mean, worst, n, threshold, kl)


def write_trainer_steps(lake: Lake, rows: list[dict[str, Any]]) -> int:
    """Append per-step rows (TRAINER_STEPS_SCHEMA columns; missing ones null) to `trainer_steps`."""
    import datetime as dt

    import pyarrow as pa

    from trajlake.schemas.tables import TRAINER_STEPS_SCHEMA

    now = dt.datetime.now(dt.UTC)
    full = [
        {name: row.get(name) for name in TRAINER_STEPS_SCHEMA.names}
        | {"created_at": row.get("created_at") or now}
        for row in rows
    ]
    return lake.append("trainer_steps", pa.Table.from_pylist(full, schema=TRAINER_STEPS_SCHEMA))


def record_mismatch(
    lake: Lake, run_id: str, step: int, trainer_version: int, result: Mismatch, rank: int = 0
) -> int:
    """Write one `trainer_steps` row holding just the mismatch check of a step."""
    return write_trainer_steps(
        lake,
        [
            {
                "run_id": run_id,
                "step": step,
                "trainer_version": trainer_version,
                "rank": rank,
                "mismatch": result.mean_abs_diff,
                "mismatch_healthy": result.healthy,
                "mismatch_tokens": result.n_tokens,
            }
        ],
    )
