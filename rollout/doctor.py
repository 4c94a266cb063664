"""`trajlake doctor`: the dry-run health report to read before an RL run.

Runs SQL over the lake for one run: how often trajectories fail because of the system
versus the model (per environment), how each tool behaves (errors, timeouts, truncation,
malformed-call retries), how often the context nudge fired, and how often TITO drift was
seen. A system error rate above the threshold fails the check: fix the harness first,
because system failures trained as reward 0 poison the signal. Then the learning signals
(`trajlake.store.health`): entropy collapse, mismatch acceleration, reward–length correlation,
advantage drift, tool-error spikes and garbled output, each an alert naming the step where it
began; any alert fails the check too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trajlake.store.config import HealthSettings
from trajlake.store.health import HealthReport, diagnose_health, render_health
from trajlake.store.lake import Lake

BY_ENVIRONMENT_SQL = """
select coalesce(environment, '(none)') as environment,
  count(*) as trajectories,
  count(*) filter (where failure_origin = 'system') as system_failures,
  count(*) filter (where failure_origin = 'model') as model_failures,
  count(*) filter (where status = 'timeout') as timeouts,
  count(*) filter (where status = 'context_exhausted') as context_exhausted,
  count(*) filter (where nudged) as nudged,
  count(*) filter (where tito_drift) as drift,
  avg(reward) filter (where failure_origin is distinct from 'system') as mean_reward
from trajectories where run_id = $run group by all order by environment
"""

BY_LABEL_SQL = """
select failure_origin, failure_label, count(*) as trajectories
from trajectories where run_id = $run and failure_origin is not null
group by all order by trajectories desc, failure_origin, failure_label
"""

BY_TOOL_SQL = """
select tool_name,
  count(*) as calls,
  count(*) filter (where not coalesce(ok, false)) as errors,
  count(*) filter (where error_type = 'malformed_call') as malformed,
  count(*) filter (where timed_out) as timeouts,
  count(*) filter (where truncated) as truncated,
  sum(retries) as retries,
  bool_or(is_code_execution) as code_execution
from tool_calls where run_id = $run group by all order by calls desc, tool_name
"""

TOTALS_SQL = """
select count(*) as trajectories,
  count(*) filter (where failure_origin = 'system') as system_failures,
  count(*) filter (where failure_origin = 'model') as model_failures,
  count(*) filter (where status = 'timeout') as trajectory_timeouts,
  coalesce(sum(n_tool_timeouts), 0) as tool_timeouts,
  coalesce(sum(n_tool_truncated), 0) as truncations,
  coalesce(sum(n_nudges), 0) as nudges,
  count(*) filter (where nudged) as nudged_trajectories,
  count(*) filter (where tito_drift) as drift_trajectories,
  coalesce(sum(n_drift_turns), 0) as drift_turns,
  coalesce(sum(n_tool_retries), 0) as tool_retries
from trajectories where run_id = $run
"""


@dataclass
class DoctorReport:
    """The health figures of one run and whether it passes."""

    run_id: str
    max_system_error_rate: float
    totals: dict[str, Any] = field(default_factory=dict)
    by_environment: list[dict[str, Any]] = field(default_factory=list)
    by_failure: list[dict[str, Any]] = field(default_factory=list)
    by_tool: list[dict[str, Any]] = field(default_factory=list)
    health: HealthReport | None = None

    @property
    def system_error_rate(self) -> float:
        n = self.totals.get("trajectories") or 0
        return (self.totals.get("system_failures") or 0) / n if n else 0.0

    @property
    def model_failure_rate(self) -> float:
        n = self.totals.get("trajectories") or 0
        return (self.totals.get("model_failures") or 0) / n if n else 0.0

    @property
    def healthy(self) -> bool:
        alerts = self.health.alerts if self.health else []
        within = self.system_error_rate <= self.max_system_error_rate
        return bool(self.totals.get("trajectories")) and within and not alerts

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            health=self.health.as_dict() if self.health else None,
            system_error_rate=self.system_error_rate,
            model_failure_rate=self.model_failure_rate,
            healthy=self.healthy,
        )
        return out


def _rows(lake: Lake, sql: str, run_id: str) -> list[dict[str, Any]]:
    con = lake.connect()
    try:
        cursor = con.execute(sql, {"run": run_id})
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    finally:
        con.close()


def diagnose(
    lake: Lake,
    run_id: str,
    max_system_error_rate: float = 0.05,
    health: HealthSettings | None = None,
    tokenizer: str | None = None,
) -> DoctorReport:
    """Compute the report for `run_id` (read-only); `health` and `tokenizer` go to the health signals."""
    report = DoctorReport(run_id, max_system_error_rate)
    if not lake.exists("trajectories"):
        return report
    report.totals = _rows(lake, TOTALS_SQL, run_id)[0]
    report.by_environment = _rows(lake, BY_ENVIRONMENT_SQL, run_id)
    report.by_failure = _rows(lake, BY_LABEL_SQL, run_id)
    if lake.exists("tool_calls"):
        report.by_tool = _rows(lake, BY_TOOL_SQL, run_id)
    if report.totals.get("trajectories"):
        report.health = diagnose_health(lake, run_id, health, tokenizer)
    return report


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


ENVIRONMENT_COLUMNS = ["environment", "trajectories", "system_failures", "model_failures", "timeouts",
                       "context_exhausted", "nudged", "drift", "mean_reward"]  # fmt: skip
FAILURE_COLUMNS = ["failure_origin", "failure_label", "trajectories"]
TOOL_COLUMNS = [
    "tool_name",
    "calls",
    "errors",
    "malformed",
    "timeouts",
    "truncated",
    "retries",
    "code_execution",
]


def _table(rows: list[dict[str, Any]], columns: list[str], width: int | None) -> list[str]:
    from trajlake.schemas.terminal import format_table

    return format_table(columns, [[r.get(c) for c in columns] for r in rows], width, float_format=".3f")


def render(report: DoctorReport, width: int | None = None) -> str:
    """The report as text; each table fits `width` characters (None: never cut)."""
    t = report.totals
    n = t.get("trajectories") or 0
    if not n:
        return f"run {report.run_id!r}: no trajectories in the lake; check --run and --lake"
    lines = [
        f"trajlake doctor — run {report.run_id!r}: {n} trajectories",
        f"  system failures  {t['system_failures']:>6}  {_pct(t['system_failures'], n)}   (threshold {100 * report.max_system_error_rate:.1f}%)",
        f"  model failures   {t['model_failures']:>6}  {_pct(t['model_failures'], n)}",
        f"  timeouts         {t['trajectory_timeouts']:>6} trajectories, {t['tool_timeouts']} tool calls",
        f"  truncations      {t['truncations']:>6} tool outputs",
        f"  malformed-call retries {t['tool_retries']}",
        f"  nudges           {t['nudges']:>6} in {t['nudged_trajectories']} trajectories",
        f"  TITO drift       {t['drift_trajectories']:>6} trajectories ({t['drift_turns']} turns)",
    ]
    inner = None if width is None else max(width - 2, 20)  # the tables are indented two spaces
    for title, rows, columns in (
        ("per environment", report.by_environment, ENVIRONMENT_COLUMNS),
        ("failures by origin and label", report.by_failure, FAILURE_COLUMNS),
        ("per tool", report.by_tool, TOOL_COLUMNS),
    ):
        if rows or columns is ENVIRONMENT_COLUMNS:
            lines += ["", f"{title}:", *("  " + line for line in _table(rows, columns, inner))]
    if report.health:
        lines += ["", *render_health(report.health)]
    return "\n".join([*lines, "", verdict(report)])


def verdict(report: DoctorReport) -> str:
    """OK, or FAIL with each reason and where to look."""
    if report.healthy:
        return "OK"
    reasons = []
    if report.system_error_rate > report.max_system_error_rate:
        reasons.append(
            f"system error rate {100 * report.system_error_rate:.1f}% > {100 * report.max_system_error_rate:.1f}%; "
            "fix the harness before training (see the failure labels above)"
        )
    if report.health and report.health.alerts:
        names = ", ".join(a.signal for a in report.health.alerts)
        reasons.append(f"health alerts: {names} (see the health signals above)")
    return "FAIL: " + "; ".join(reasons)


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.as_dict(), default=str, indent=2)
