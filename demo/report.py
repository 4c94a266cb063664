"""The demo's final summary: did it learn, how did behaviour change, what failed, where to look next.

Figures come from the dashboards' metric queries (`trajlake.dashboards.metrics`), so the
summary, `trajlake metrics` and the Streamlit pages agree. Learning is judged as the
issue states it: the mean reward over the last fifth of policy versions against the
first fifth (a version's reward is the mean over its scored trajectories).
"""

from __future__ import annotations

import math
import shlex
from typing import Any, TextIO

from trajlake.dashboards.passk import curve_text
from trajlake.store.config import CatalogSettings

VERSION_COLUMNS = (
    "policy_version",
    "n_trajectories",
    "n_scored",
    "reward_mean",
    "pass_at_1",
    "n_system_failures",
    "n_model_failures",
)

LEARNING_MARGIN = 0.1
"""The last fifth of versions must beat the first fifth by this much mean reward (a warm-started
chat model starts near 0.5, the GRU near 0.2: the headroom differs, the bar is the same) ..."""
LEARNING_T = 2.5
"""... and by more than this many standard errors of that difference (Welch, over the versions'
mean rewards), so the spread between versions alone does not explain the rise."""

TABLES = ("events", "trajectories", "turns", "tool_calls", "dead_letters", "policy_versions", "trainer_steps",
          "batch_consumption")  # fmt: skip


def fifths(values: list[float]) -> tuple[float, float]:
    """Mean of the first fifth and of the last fifth of `values` (at least one value each)."""
    if not values:
        return float("nan"), float("nan")
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def rise_t(values: list[float]) -> float:
    """Welch's t of the last fifth of `values` against the first (inf when both fifths are constant)."""
    k = max(1, len(values) // 5)
    first, last = values[:k], values[-k:]
    if k < 2:
        return float("nan")
    var = [sum((v - sum(x) / k) ** 2 for v in x) / (k - 1) for x in (first, last)]
    se = math.sqrt((var[0] + var[1]) / k)
    rise = sum(last) / k - sum(first) / k
    return rise / se if se else (math.inf if rise > 0 else 0.0)


HARNESS_SQL = {
    "turns": """select count(*) as turns, avg(n_output_tokens) as tokens_per_turn,
        quantile_disc(n_output_tokens, [0.1, 0.5, 0.9]) as tokens_p10_p50_p90, max(n_output_tokens) as tokens_max,
        count(*) filter (where n_output_tokens > 5) as turns_over_5_tokens
        from turns where run_id = $run""",
    "calls": """select count(*) as tool_calls, count(*) filter (where error_type = 'malformed_call') as malformed,
        count(*) filter (where error_type = 'malformed_call' and exists (select 1 from turns t
            where t.run_id = c.run_id and t.trajectory_id = c.trajectory_id and t.seq > c.call_seq)) as malformed_retried,
        count(*) filter (where retries > 0) as ok_after_retry,
        count(*) filter (where truncated) as truncated, count(*) filter (where timed_out) as timed_out
        from tool_calls c where run_id = $run""",
    "trajectories": """select count(*) filter (where n_turns > 0 and nudged) as nudged,
        count(*) filter (where nudged and status = 'completed') as nudged_then_answered,
        count(*) filter (where failure_origin = 'system') as system_failures,
        count(*) filter (where tito_drift) as tito_drift
        from trajectories where run_id = $run and finished""",
}
"""What the harness did in a run, in SQL anyone can rerun with `trajlake sql` (the run as $run)."""

LESSON_SQL = {
    "malformed call, retried": "select trajectory_id, call_seq, error_type, retries, arguments from tool_calls "
    "where run_id = '{run}' and (error_type = 'malformed_call' or retries > 0)",
    "tool output truncated": "select tool_name, arguments, output_tokens from tool_calls "
    "where run_id = '{run}' and truncated",
    "nudged at 80% of the context": "select trajectory_id, turn_index, context_used_fraction from turns "
    "where run_id = '{run}' and nudged",
    "system failure, labelled": "select failure_label, count(*) as n, count(reward) as scored from trajectories "
    "where run_id = '{run}' and failure_origin = 'system' group by all",
}
"""One query per harness lesson, printed in the closing note for the user to rerun."""


def harness_facts(lake: Any, run_id: str) -> dict[str, Any]:
    """The harness lessons of a run: turn lengths, malformed calls and their retries, truncations, nudges."""
    out: dict[str, Any] = {}
    for query in HARNESS_SQL.values():
        out.update(lake.sql(query, {"run": run_id}).to_pylist()[0])
    return out


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
        "rise_t": rise_t([r["reward_mean"] for r in scored]),
        "learned": last - first >= LEARNING_MARGIN
        and rise_t([r["reward_mean"] for r in scored]) > LEARNING_T,
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
        "harness": harness_facts(lake, run_id),
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
        f"{summary['reward_last_fifth']:.2f} (t = {summary['rise_t']:.1f}): {verdict} "
        f"(needs +{LEARNING_MARGIN} and t > {LEARNING_T})"
    )
    for name in ("early", "late"):  # each value beside its tasks; a k too few tasks reach is hidden
        p(f"pass@k ({name} versions)  {curve_text(summary['pass_at_k'][name], digits=2)}")
    p()
    p("behaviour            early    late")
    early, late = summary["behaviour"]["early"], summary["behaviour"]["late"]
    for key in early:
        p(f"  {key:<26} {_fmt(early[key]):>6}  {_fmt(late[key]):>6}")
    p()
    h = summary["harness"]
    p(
        f"harness: {h['turns']} turns of {_fmt(h['tokens_per_turn'], '.1f')} tokens on average "
        f"(p10/p50/p90 {'/'.join(str(v) for v in h['tokens_p10_p50_p90'] or [])}, max {h['tokens_max']}); "
        f"{h['malformed']} malformed calls ({h['malformed_retried']} retried in a next turn; "
        f"{h['ok_after_retry']} calls ran after such retries); {h['truncated']} tool outputs truncated; {h['nudged']} trajectories nudged at 80% of the "
        f"context ({h['nudged_then_answered']} then answered); {h['timed_out']} tool timeouts"
    )
    run_literal = run_id.replace("'", "''")  # a SQL string literal
    for lesson, query in LESSON_SQL.items():
        command = f"trajlake sql --lake {shlex.quote(lake)} {shell_quoted(query.format(run=run_literal))}"
        p(f"  {lesson + ':':<30} {command}")
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
    catalog = "TRAJLAKE_CATALOG_URL's" if CatalogSettings.from_env().catalog_url else f"{lake}/catalog.db"
    p(f"data: {lake} (Delta tables; catalog {catalog})")
    p(f"dashboard: trajlake dashboard --lake {lake_q}")
    p(f"metrics:   trajlake metrics --lake {lake_q} --run {run_id}")
    p(f"ablation:  trajlake ablate --lake {lake_q} --run {run_id}")
    query = (
        f"select policy_version_min as v, avg(reward) as reward, count(*) as n from trajectories "
        f"where run_id = '{run_id}' group by v order by v"
    )
    p(f"SQL:       trajlake sql --lake {lake_q} {shell_quoted(query)}")


def shell_quoted(query: str) -> str:
    """`query` as one shell word: in double quotes where that is safe (SQL's quotes stay readable)."""
    return f'"{query}"' if not any(c in query for c in '"$`\\!') else shlex.quote(query)
