"""Publish the trainer's events (`policy_updated`, `batch_consumed`): through the bus when a
Recorder is given, else straight into the lake's `events` table (projections catch up)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.ingest.recorder import Recorder
    from trajlake.store.lake import Lake


def _append(lake: Lake, event_type: str, run_id: str, producer_id: str, **fields: Any) -> None:
    from trajlake.schemas import events as ev
    from trajlake.schemas.convert import events_to_table

    event = ev.make_event(event_type, run_id, producer_id=producer_id, **fields)
    lake.append("events", events_to_table([event]))


def publish_batch_consumed(
    lake: Lake,
    recorder: Recorder | None,
    run_id: str,
    producer_id: str,
    step: int,
    trainer_version: int,
    trajectory_ids: Sequence[str],
    staleness: Sequence[int],
    advantages: Sequence[float] | None = None,
) -> None:
    """Record which trajectories a step used, at which trainer version, with their staleness
    and (when the step computed them) their advantages."""
    if recorder is not None:
        recorder.batch_consumed(step, trainer_version, list(trajectory_ids), list(staleness), advantages)
        return
    if advantages is not None and len(advantages) != len(trajectory_ids):
        raise ValueError(f"{len(advantages)} advantages for {len(trajectory_ids)} consumed trajectories")
    _append(
        lake, "batch_consumed", run_id, producer_id, step=step, trainer_version=trainer_version,
        consumed_trajectory_ids=list(trajectory_ids), consumed_staleness=list(staleness),
        consumed_advantages=None if advantages is None else [float(a) for a in advantages],
    )  # fmt: skip


def publish_policy_updated(
    lake: Lake,
    recorder: Recorder | None,
    run_id: str,
    producer_id: str,
    version: int,
    step: int,
    checkpoint: str | None,
    metrics: Mapping[str, Any] | None,
) -> None:
    """Announce a new policy version (rollout workers pick it up)."""
    if recorder is not None:
        recorder.policy_updated(version, step, checkpoint, dict(metrics or {}))
        return
    _append(
        lake, "policy_updated", run_id, producer_id, policy_version=version, step=step,
        checkpoint=checkpoint, metrics=dict(metrics or {}),
    )  # fmt: skip
