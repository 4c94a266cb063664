"""The demo's final summary: did it learn, how did behaviour change, what failed, where to look next.

Figures come from the dashboards' metric queries (`trajlake.dashboards.metrics`), so the
summary, `trajlake metrics` and the Streamlit pages agree. Learning is judged as the
issue states it: the mean reward over the last fifth of policy versions against the
first fifth (a version's reward is the mean over its scored trajectories).
"""

from __future__ import annotations

import shlex
from typing import Any, TextIO

VERSION_COLUMNS = (
    "policy_version",
    "n_trajectories",
    "n_scored",
    "reward_mean",
    "pass_at_1",
    "n_system_failures",
    "n_model_failures",
)

LEARNING_MARGIN = 0.2
"""The last fifth of versions must beat the first fifth by this much mean reward."""

TABLES = ("events", "trajectories", "turns", "tool_calls", "dead_letters", "policy_versions", "trainer_steps",
          "batch_consumption")  # fmt: skip


def fifths(values: list[float]) -> tuple[float, float]:
    """Mean of the first fifth and of the last fifth of `values` (at least one value each)."""
    if not values:
        return float("nan"), float("nan")
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def _count(lake: Any, table: str, run_id: str) -> int:
    return int(
        lake.sql(f"select count(*) from {table} where run_id = $run", {"run": run_id}).column(0)[0].as_py()
    )


def summarize(
    lake: Any, config: Any, overfit: dict[str, Any] | None, run: dict[str, Any], elapsed_s: float
) -> dict[str, Any]:
    """Every figure of the summary, JSON-ready."""
    from trajlake.dashboards import metrics

    run_id = config.run_id
    by_version = metrics.rows(metrics.overview_by_version(lake, run_id))
    scored = [r for r in by_version if r["reward_mean"] is not None]
    first, last = fifths([r["reward_mean"] for r in scored])
    versions = [r["policy_version"] for r in scored]
    k = max(1, len(versions) // 5)
    early, late = ((versions[0], versions[k - 1]), (versions[-k], versions[-1])) if versions else (None, None)
    behaviour = {
        name: metrics.rows(metrics.behaviour_by_version(lake, run_id, rng))
        for name, rng in (("early", early), ("late", late))
    }
    spans = lake.sql(
        """select count(*) filter (where policy_version_max > policy_version_min) as spanning, count(*) as n
            from _t_trajectories where run_id = $run""",
        {"run": run_id},
    ).to_pylist()[0]
    staleness = lake.sql(
        "select max(staleness) as max, avg(staleness) as mean from batch_consumption where run_id = $run",
        {"run": run_id},
    ).to_pylist()[0]
    mismatch = lake.sql(
        "select avg(mismatch) as mean, max(mismatch) as max from trainer_steps where run_id = $run",
        {"run": run_id},
    ).to_pylist()[0]
    return {
        "run_id": run_id,
        "lake": lake.root,
        "elapsed_s": round(elapsed_s, 1),
        "steps": run["steps"],
        "trajectories": run["trajectories"],
        "overfit": overfit,
        "reward_by_version": [{k: r[k] for k in VERSION_COLUMNS} for r in by_version],
        "reward_first_fifth": first,
        "reward_last_fifth": last,
        "learned": last - first >= LEARNING_MARGIN,
        "pass_at_k": {
            "early": metrics.rows(
                metrics.pass_at_k_curve(lake, run_id, early, max_k=config.samples_per_group)
            ),
            "late": metrics.rows(metrics.pass_at_k_curve(lake, run_id, late, max_k=config.samples_per_group)),
        },
        "behaviour": {name: _pool(rows) for name, rows in behaviour.items()},
        "failures": metrics.rows(metrics.failures_by(lake, run_id, "label")),
        "tool_failures": metrics.rows(metrics.tool_failures(lake, run_id)),
        "spanning_trajectories": spans["spanning"],
        "staleness": staleness,
        "mismatch": mismatch,
        "tables": {t: _count(lake, t, run_id) for t in TABLES},
    }


def _pool(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Behaviour figures of several versions, averaged with each version weighted by its trajectories."""
    keys = ("turns_per_trajectory", "assistant_tokens_per_turn", "tool_success_rate", "code_exec_ratio",
            "context_exhaustion_ratio", "nudge_rate")  # fmt: skip
    out: dict[str, float | None] = {}
    for key in keys:
        pairs = [(r[key], r["n_trajectories"]) for r in rows if r[key] is not None]
        total = sum(n for _, n in pairs)
        out[key] = sum(v * n for v, n in pairs) / total if total else None
    return out


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_summary(summary: dict[str, Any], out: TextIO) -> None:
    """The human-readable summary."""
    p = lambda text="": print(text, file=out)  # noqa: E731
    run_id, lake = summary["run_id"], summary["lake"]
    p()
    p(
        f"== trajlake demo: run {run_id} finished in {summary['elapsed_s']:.0f}s "
        f"({summary['steps']} steps, {summary['trajectories']} trajectories) =="
    )
    if summary["overfit"]:
        o = summary["overfit"]
        p(
            f"overfit check  {o['tasks']} tasks with reward variance: reward {o['reward_before']:.2f} -> "
            f"{o['reward_after']:.2f} after {o['steps']} steps (run {o['run_id']})"
        )
    p()
    p("reward by policy version (scored = finished, not a system failure)")
    p("  version  trajectories  scored  reward  pass@1  system_failures")
    for r in summary["reward_by_version"]:
        p(
            f"  {r['policy_version']:>7}  {r['n_trajectories']:>12}  {r['n_scored']:>6}  {_fmt(r['reward_mean']):>6}  "
            f"{_fmt(r['pass_at_1']):>6}  {r['n_system_failures']:>15}"
        )
    verdict = "LEARNED" if summary["learned"] else "did NOT learn enough"
    p(
        f"mean reward, first fifth of versions {summary['reward_first_fifth']:.2f} -> last fifth "
        f"{summary['reward_last_fifth']:.2f}: {verdict} (needs +{LEARNING_MARGIN})"
    )
    for name in ("early", "late"):
        curve = "  ".join(f"pass@{r['k']}={r['pass_at_k']:.2f}" for r in summary["pass_at_k"][name])
        p(f"pass@k ({name} versions)  {curve}")
    p()
    p("behaviour            early    late")
    early, late = summary["behaviour"]["early"], summary["behaviour"]["late"]
    for key in early:
        p(f"  {key:<26} {_fmt(early[key]):>6}  {_fmt(late[key]):>6}")
    p()
    p("failures (trajectories) by label and origin")
    for r in summary["failures"]:
        p(f"  {r['label']:<18} {r['origin']:<7} {r['n_trajectories']:>6}  ({r['share']:.1%})")
    p(
        f"trajectories spanning policy versions: {summary['spanning_trajectories']}; staleness max "
        f"{summary['staleness']['max']}, mean {_fmt(summary['staleness']['mean'])}; train/rollout logprob "
        f"mismatch mean {_fmt(summary['mismatch']['mean'], '.2e')}"
    )
    p("rows per table: " + ", ".join(f"{t} {n}" for t, n in summary["tables"].items()))
    p()
    lake_q = shlex.quote(lake)
    p(f"data: {lake} (Delta tables; catalog {lake}/catalog.db)")
    p(f"dashboard: trajlake dashboard --lake {lake_q}")
    p(f"metrics:   trajlake metrics --lake {lake_q} --run {run_id}")
    p(f"ablation:  trajlake ablate --lake {lake_q} --run {run_id}")
    query = (
        f"select policy_version_min as v, avg(reward) as reward, count(*) as n from trajectories "
        f"where run_id = '{run_id}' group by v order by v"
    )
    quoted = f'"{query}"' if not any(c in query for c in '"$`\\!') else shlex.quote(query)
    p(f"SQL:       trajlake sql --lake {lake_q} {quoted}")
