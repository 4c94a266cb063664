"""Queries of the trajectory browser: find trajectories, then read one (the only token reads)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from trajlake.dashboards.query import (
    EVENTS,
    TOOL_CALLS,
    TRAJECTORIES,
    TURNS,
    VersionRange,
    query,
    versions_clause,
)
from trajlake.schemas.events import EVENT_FIELDS

PER_TOKEN_FIELDS = {"trainer_logprob": "trainer_logprobs", "entropy": "output_entropy"}
"""Per-token figures a producer may record on a turn beside the sampled logprobs (overlay →
event field); the browser reads those the event model declares and says the rest are not recorded."""

BROWSER_COLUMNS = (
    "trajectory_id, task_id, sample_index, environment, policy_version_min, policy_version_max, reward, "
    "status, failure_origin, failure_label, n_turns, n_tool_calls, n_tool_errors, assistant_tokens, "
    "tito_drift, started_at, finished_at"
)


def find_trajectories(
    lake: Any,
    run_id: str,
    versions: VersionRange = None,
    status: Sequence[str] = (),
    failure_origin: Sequence[str] = (),
    task_contains: str = "",
    reward_range: tuple[float, float] | None = None,
    limit: int = 200,
) -> pa.Table:
    """Trajectories of a run matching the filters, newest first (scalar columns only)."""
    clauses = ["run_id = $run", versions_clause(versions)]
    params: dict[str, Any] = {"run": run_id}
    if status:
        clauses.append("list_contains($status, status)")
        params["status"] = list(status)
    if failure_origin:
        origins = [o for o in failure_origin if o != "none"]
        parts = (["list_contains($origins, failure_origin)"] if origins else []) + (
            ["failure_origin IS NULL"] if "none" in failure_origin else []
        )
        if origins:
            params["origins"] = origins
        clauses.append("(" + " OR ".join(parts) + ")")
    if task_contains:
        clauses.append("contains(task_id, $task)")
        params["task"] = task_contains
    if reward_range is not None:
        clauses.append("reward BETWEEN $reward_low AND $reward_high")
        params.update(reward_low=float(reward_range[0]), reward_high=float(reward_range[1]))
    return query(
        lake,
        f"""SELECT {BROWSER_COLUMNS} FROM {TRAJECTORIES} WHERE {" AND ".join(clauses)}
            ORDER BY started_at DESC NULLS LAST, trajectory_id LIMIT {int(limit)}""",
        **params,
    )


def trajectory_summary(lake: Any, run_id: str, trajectory_id: str) -> dict[str, Any] | None:
    """Every scalar column of one trajectory, or None if it is not in the lake."""
    table = query(
        lake,
        f"SELECT * FROM {TRAJECTORIES} WHERE run_id = $run AND trajectory_id = $traj",
        run=run_id,
        traj=trajectory_id,
    )
    return table.to_pylist()[0] if table.num_rows else None


def recorded_token_fields() -> dict[str, str]:
    """The per-token overlays the event model has a field for (overlay → field)."""
    return {overlay: name for overlay, name in PER_TOKEN_FIELDS.items() if name in EVENT_FIELDS}


def trajectory_turns(lake: Any, run_id: str, trajectory_id: str) -> pa.Table:
    """The turns of one trajectory in order, with their token ids, logprobs, loss masks, advantage
    and any per-token figure recorded (`recorded_token_fields`)."""
    extra = "".join(f", e.{name} AS {overlay}" for overlay, name in recorded_token_fields().items())
    return query(
        lake,
        f"""SELECT t.turn_index, t.policy_version, t.n_input_tokens, t.n_output_tokens, t.finish_reason,
                   t.context_used_fraction, t.nudged, t.tito_drift, t.latency_s, t.sum_logprob, t.advantage,
                   e.input_token_ids, e.output_token_ids, e.output_logprobs, e.loss_mask{extra}
            FROM {TURNS} t JOIN {EVENTS} e ON e.event_id = t.event_id
                 AND e.trajectory_id = $traj AND e.event_type = 'turn'
            WHERE t.run_id = $run AND t.trajectory_id = $traj ORDER BY t.seq""",
        run=run_id,
        traj=trajectory_id,
    )


def trajectory_advantage(lake: Any, run_id: str, trajectory_id: str) -> dict[str, Any] | None:
    """The advantage the trainer gave the trajectory at the last step that consumed it with one
    (`{"step", "advantage"}`), or None when no trainer recorded one."""
    table = query(
        lake,
        """SELECT step, advantage FROM batch_consumption
            WHERE run_id = $run AND trajectory_id = $traj AND advantage IS NOT NULL
            ORDER BY step DESC LIMIT 1""",
        run=run_id,
        traj=trajectory_id,
    )
    return table.to_pylist()[0] if table.num_rows else None


def trajectory_token_values(lake: Any, run_id: str, trajectory_id: str) -> pa.Table:
    """The per-token values the trainer kept for one trajectory (`trainer_tokens`), per step and turn."""
    return query(
        lake,
        """SELECT step, turn_index, policy_loss, trainer_logprobs, entropies, ratios, clipped, masked
            FROM trainer_tokens WHERE run_id = $run AND trajectory_id = $traj ORDER BY step, turn_index""",
        run=run_id,
        traj=trajectory_id,
    )


def trajectory_tool_calls(lake: Any, run_id: str, trajectory_id: str) -> pa.Table:
    """The tool calls of one trajectory in order, with their outcome."""
    return query(
        lake,
        f"""SELECT call_seq, tool_name, arguments, is_code_execution, ok, error_type, timed_out, truncated,
                   retries, output_tokens, latency_s
            FROM {TOOL_CALLS} WHERE run_id = $run AND trajectory_id = $traj ORDER BY call_seq""",
        run=run_id,
        traj=trajectory_id,
    )


def trajectory_labels(lake: Any, run_id: str, trajectory_id: str) -> pa.Table:
    """The labels in force on one trajectory and its turns (`current_labels`), oldest first."""
    return query(
        lake,
        """SELECT key, value, turn_index, author, created_at FROM current_labels
            WHERE run_id = $run AND trajectory_id = $traj ORDER BY created_at, key""",
        run=run_id,
        traj=trajectory_id,
    )


def labels_by_outcome(lake: Any, run_id: str) -> pa.Table:
    """Per label key in force on the run and outcome (ok, model or system failure): the trajectories it marks."""
    return query(
        lake,
        f"""SELECT l.key AS label, coalesce(t.failure_origin, 'ok') AS origin,
                   count(DISTINCT l.trajectory_id) AS n_trajectories
            FROM current_labels l JOIN {TRAJECTORIES} t USING (run_id, trajectory_id)
            WHERE l.run_id = $run GROUP BY ALL ORDER BY n_trajectories DESC, label, origin""",
        run=run_id,
    )
