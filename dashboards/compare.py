"""Runs side by side: the dashboards' figures of several runs, by policy version and by trainer step.

By policy version, a run's rows are its single-run figures (`metrics.figures_by_version`,
`metrics.pass_at_k_curve`) with a `run_id` column. By trainer step, one query over all the runs
joins what the trainer reported per step (`trainer_steps`: entropy, logprob mismatch) with what
it consumed at that step (`batch_consumption`: staleness; the consumed trajectories: reward,
pass@1, turns, tool success, failures). Rows keep the order the runs are given in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from trajlake.dashboards import metrics
from trajlake.dashboards.config import DEFAULT_SUCCESS_THRESHOLD
from trajlake.dashboards.passk import MIN_TASKS
from trajlake.dashboards.query import SCORED, TRAJECTORIES, query, rows

_F = pa.float64()
VERSION_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("policy_version", pa.int64()), ("n_trajectories", pa.int64()),
     ("n_scored", pa.int64()), ("reward_mean", _F), ("n_tasks", pa.int64()), ("pass_at_1", _F), ("rollout_entropy", _F),
     ("turns_per_trajectory", _F), ("tool_success_rate", _F), ("system_failure_rate", _F),
     ("model_failure_rate", _F)]
)  # fmt: skip
"""`by_version`: one row per run and policy version."""

STEP_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("step", pa.int64()), ("trainer_version", pa.int64()), ("n_consumed", pa.int64()),
     ("reward_mean", _F), ("n_tasks", pa.int64()), ("pass_at_1", _F), ("entropy", _F), ("mismatch", _F),
     ("staleness_mean", _F),
     ("staleness_max", pa.int64()), ("turns_per_trajectory", _F), ("tool_success_rate", _F),
     ("system_failure_rate", _F), ("model_failure_rate", _F)]
)  # fmt: skip
"""`by_step`: one row per run and trainer step (the consumed trajectories' figures, the trainer's)."""

CURVE_SCHEMA = pa.schema([("run_id", pa.string()), *metrics.PASS_AT_K_FIELDS])
"""`pass_at_k_curves`: one row per run and k, with the tasks each value stands on."""

SUMMARY_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("n_trajectories", pa.int64()), ("n_scored", pa.int64()),
     ("policy_versions", pa.int64()), ("trainer_steps", pa.int64()), ("reward_mean", _F), ("n_tasks", pa.int64()),
     ("pass_at_1", _F), ("k", pa.int64()), ("pass_at_k", _F), ("n_tasks_at_k", pa.int64()),
     ("mismatch_latest", _F), ("staleness_mean", _F),
     ("system_failure_rate", _F), ("model_failure_rate", _F)]
)  # fmt: skip
"""`summary`: one row per run; `pass_at_k` is at `k`, the largest k that every compared run shows (enough tasks
have k samples), over `n_tasks_at_k` of its `n_tasks` tasks."""


def by_version(
    lake: Any,
    run_ids: Sequence[str],
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """Per run and policy version: reward, pass@1, rollout entropy, turns, tool success, failure rates.

    The runs are read together (one scan per table, not one per run)."""
    if not run_ids:
        return VERSION_SCHEMA.empty_table()
    order = {run_id: i for i, run_id in enumerate(run_ids)}
    out = []
    for row in metrics.figures_by_version(lake, list(run_ids), None, success_threshold, min_tasks):
        n = row["n_trajectories"]
        rates = {f"{o}_failure_rate": row[f"n_{o}_failures"] / n for o in ("system", "model")}
        out.append({name: row.get(name) for name in VERSION_SCHEMA.names} | rates)
    out.sort(key=lambda r: (order[r["run_id"]], r["policy_version"]))
    return pa.Table.from_pylist(out, schema=VERSION_SCHEMA)


def pass_at_k_curves(
    lake: Any,
    run_ids: Sequence[str],
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """Per run: pass@k for k = 1..16 over all its scored trajectories (the overview page's curve)."""
    if not run_ids:
        return CURVE_SCHEMA.empty_table()
    curves = metrics.pass_at_k_curve(lake, list(run_ids), None, success_threshold, metrics.MAX_K, min_tasks)
    return curves.cast(CURVE_SCHEMA)


def by_step(
    lake: Any,
    run_ids: Sequence[str],
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """Per run and trainer step: what the trainer consumed (reward, pass@1, staleness, turns, tool
    success, failure rates) next to what it reported (entropy and logprob mismatch, mean over ranks).

    pass@1 of a step averages, over the step's `n_tasks` consumed tasks, the share of a task's scored
    samples that pass; below `min_tasks` tasks it is hidden, as everywhere.
    """
    if not run_ids:
        return STEP_SCHEMA.empty_table()
    table = query(
        lake,
        f"""WITH t AS (
                SELECT trajectory_id, task_id, reward, n_turns, n_tool_calls, n_tool_errors, failure_origin,
                       {SCORED} AS is_scored, reward >= $threshold AS passed
                FROM {TRAJECTORIES} WHERE list_contains($run, run_id)),
            consumed AS (
                SELECT b.run_id, b.step, b.trainer_version, b.staleness, t.*
                FROM batch_consumption b LEFT JOIN t ON t.trajectory_id = b.trajectory_id
                WHERE list_contains($run, b.run_id)),
            batches AS (
                SELECT run_id, step, max(trainer_version) AS trainer_version, count(*) AS n_consumed,
                       avg(staleness) AS staleness_mean, max(staleness) AS staleness_max,
                       avg(reward) FILTER (WHERE is_scored) AS reward_mean, avg(n_turns) AS turns_per_trajectory,
                       1 - sum(n_tool_errors) / nullif(sum(n_tool_calls), 0) AS tool_success_rate,
                       avg(CASE WHEN failure_origin = 'system' THEN 1.0 ELSE 0.0 END) AS system_failure_rate,
                       avg(CASE WHEN failure_origin = 'model' THEN 1.0 ELSE 0.0 END) AS model_failure_rate
                FROM consumed GROUP BY run_id, step),
            passed AS (
                SELECT run_id, step, count(*) AS n_tasks, avg(pass_rate) AS pass_at_1
                FROM (SELECT run_id, step, avg(passed::DOUBLE) AS pass_rate FROM consumed
                      WHERE is_scored GROUP BY run_id, step, task_id)
                GROUP BY run_id, step),
            trainer AS (
                SELECT run_id, step, max(trainer_version) AS trainer_version, avg(entropy) AS entropy,
                       avg(mismatch) AS mismatch
                FROM trainer_steps WHERE list_contains($run, run_id) GROUP BY run_id, step)
            SELECT coalesce(b.run_id, s.run_id) AS run_id, coalesce(b.step, s.step) AS step,
                   coalesce(b.trainer_version, s.trainer_version) AS trainer_version,
                   coalesce(b.n_consumed, 0) AS n_consumed, b.reward_mean, coalesce(p.n_tasks, 0) AS n_tasks,
                   p.pass_at_1, s.entropy, s.mismatch,
                   b.staleness_mean, b.staleness_max, b.turns_per_trajectory, b.tool_success_rate,
                   b.system_failure_rate, b.model_failure_rate
            FROM batches b FULL JOIN trainer s ON s.run_id = b.run_id AND s.step = b.step
            LEFT JOIN passed p ON p.run_id = b.run_id AND p.step = b.step
            ORDER BY list_position($run, coalesce(b.run_id, s.run_id)), step""",
        run=list(run_ids),
        threshold=float(success_threshold),
    )
    return metrics.hide_thin_pass_at_1(table.cast(STEP_SCHEMA), min_tasks)


def summary(versions: pa.Table, steps: pa.Table, curves: pa.Table) -> pa.Table:
    """One row per run from the tables of `by_version`, `by_step` and `pass_at_k_curves`."""
    run_ids = list(dict.fromkeys(versions.column("run_id").to_pylist() + steps.column("run_id").to_pylist()))
    curve = {(r["run_id"], r["k"]): r for r in rows(curves) if r["pass_at_k"] is not None}
    shown = [max((k for run, k in curve if run == run_id), default=0) for run_id in run_ids]
    k = min(shown, default=0) or None
    version_rows, step_rows = rows(versions), rows(steps)
    out = []
    for run_id in run_ids:
        vs = [r for r in version_rows if r["run_id"] == run_id]
        ss = [r for r in step_rows if r["run_id"] == run_id]
        mismatch = [r["mismatch"] for r in ss if r["mismatch"] is not None]
        at_1, at_k = curve.get((run_id, 1), {}), curve.get((run_id, k), {})
        out.append({
            "run_id": run_id, "n_trajectories": sum(r["n_trajectories"] for r in vs),
            "n_scored": sum(r["n_scored"] for r in vs), "policy_versions": len(vs),
            "trainer_steps": len(ss),
            "reward_mean": _weighted(vs, "reward_mean", "n_scored"),
            "n_tasks": at_1.get("n_tasks_total"), "pass_at_1": at_1.get("pass_at_k"), "k": k,
            "pass_at_k": at_k.get("pass_at_k"), "n_tasks_at_k": at_k.get("n_tasks"),
            "mismatch_latest": mismatch[-1] if mismatch else None,
            "staleness_mean": _weighted(ss, "staleness_mean", "n_consumed"),
            "system_failure_rate": _weighted(vs, "system_failure_rate", "n_trajectories"),
            "model_failure_rate": _weighted(vs, "model_failure_rate", "n_trajectories"),
        })  # fmt: skip
    return pa.Table.from_pylist(out, schema=SUMMARY_SCHEMA)


def _weighted(table_rows: list[dict[str, Any]], column: str, weight: str) -> float | None:
    """The mean of `column` over rows, each weighted by `weight` (rows without a value left out)."""
    pairs = [(r[column], r[weight]) for r in table_rows if r[column] is not None and r[weight]]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def comparison_report(
    lake: Any,
    run_ids: Sequence[str],
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> dict[str, Any]:
    """`trajlake metrics --runs`: the summary, the figures by policy version and by step, pass@k."""
    versions = by_version(lake, run_ids, success_threshold, min_tasks)
    steps = by_step(lake, run_ids, success_threshold, min_tasks)
    curves = pass_at_k_curves(lake, run_ids, success_threshold, min_tasks)
    return {
        "run_ids": list(run_ids),
        "success_threshold": success_threshold,
        "min_tasks": min_tasks,
        "summary": rows(summary(versions, steps, curves)),
        "by_version": rows(versions),
        "by_step": rows(steps),
        "pass_at_k": rows(curves),
    }
