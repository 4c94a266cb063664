"""`trajlake doctor`: the dry-run health report to read before an RL run.

Runs SQL over the lake for one run: how often trajectories fail because of the system
versus the model (per environment), how each tool behaves (errors, timeouts, truncation,
malformed-call retries), how often the context nudge fired, and how often TITO drift was
seen, the labels people put on its trajectories (env_bug, reward_hack, …), and what the
trainer measured: the engine mismatch (on tokens the trainer's own weights generated, with
their count) and, apart, the policy's drift on older tokens, by staleness.
A system error rate above the threshold fails the check: fix the harness first,
because system failures trained as reward 0 poison the signal. Then the learning signals
(`trajlake.store.health`): entropy collapse, mismatch acceleration, reward–length correlation,
advantage drift, tool-error spikes and garbled output, each an alert naming the step where it
began; any alert fails the check too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trajlake.store.config import MISMATCH_THRESHOLD, HealthSettings
from trajlake.store.health import HealthReport, diagnose_health, render_health
from trajlake.store.labels import label_counts
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

TRAINER_SQL = """
select count(*) as steps, count(mismatch) as measured_steps,
  coalesce(sum(mismatch_tokens) filter (where mismatch is not null), 0) as mismatch_tokens,
  coalesce(sum(mismatch * mismatch_tokens) / nullif(sum(mismatch_tokens) filter (where mismatch is not null), 0),
           avg(mismatch)) as mismatch,
  max(mismatch) as mismatch_worst_step, count(*) filter (where not mismatch_healthy) as unhealthy_steps,
  coalesce(sum(drift_tokens) filter (where drift is not null), 0) as drift_tokens,
  sum(drift * drift_tokens) / nullif(sum(drift_tokens) filter (where drift is not null), 0) as drift,
  sum(drift_kl * drift_tokens) / nullif(sum(drift_tokens) filter (where drift_kl is not null), 0) as drift_kl
from trainer_steps where run_id = $run
"""
"""The engine mismatch over the run (token-weighted; a lake written before the counts were kept:
the mean of its steps), and the policy's drift on tokens older weights generated."""

DRIFT_SQL = """
with parts as (select unnest(drift_by_staleness) as d from trainer_steps where run_id = $run)
select d.staleness as staleness, sum(d.n_tokens) as tokens,
  sum(d.abs_diff * d.n_tokens) / nullif(sum(d.n_tokens), 0) as abs_diff,
  sum(d.kl * d.n_tokens) / nullif(sum(d.n_tokens), 0) as kl
from parts group by all order by staleness
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
    trainer: dict[str, Any] = field(default_factory=dict)
    drift_by_staleness: list[dict[str, Any]] = field(default_factory=list)
    health: HealthReport | None = None
    storage: dict[str, Any] = field(default_factory=dict)
    """Whether the lake's store refuses a second put-if-absent (`safe`: True, False, None if not checked)."""
    labels: list[dict[str, Any]] = field(default_factory=list)
    """Per label key in force on the run (`store.labels.label_counts`): the trajectories and turns it marks."""

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
        unsafe = self.storage.get("safe") is False
        return bool(self.totals.get("trajectories")) and within and not alerts and not unsafe

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
    report = DoctorReport(run_id, max_system_error_rate, storage=storage_check(lake))
    if not lake.exists("trajectories"):
        return report
    report.totals = _rows(lake, TOTALS_SQL, run_id)[0]
    report.by_environment = _rows(lake, BY_ENVIRONMENT_SQL, run_id)
    report.by_failure = _rows(lake, BY_LABEL_SQL, run_id)
    if lake.exists("tool_calls"):
        report.by_tool = _rows(lake, BY_TOOL_SQL, run_id)
    report.labels = label_counts(lake, run_id)
    if lake.exists("trainer_steps"):
        report.trainer = _rows(lake, TRAINER_SQL, run_id)[0]
        report.drift_by_staleness = _rows(lake, DRIFT_SQL, run_id)
    if report.totals.get("trajectories"):
        report.health = diagnose_health(lake, run_id, health, tokenizer)
    return report


def storage_check(lake: Lake) -> dict[str, Any]:
    """Whether several writers may share the lake's store (`put_if_absent.check_store`)."""
    from trajlake.store.errors import LakeError
    from trajlake.store.put_if_absent import check_store

    try:
        check = check_store(lake.storage)
    except LakeError as err:  # e.g. a read-only identity may not write the probe
        return {"lake": lake.root, "safe": None, "detail": f"put-if-absent not checked: {err}"}
    if check is None:
        return {
            "lake": lake.root,
            "safe": True,
            "detail": "a local directory: each commit is linked in put-if-absent",
        }
    return {"lake": lake.root, "safe": check.safe, "detail": check.describe()}


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
    from trajlake.common.terminal import format_table

    return format_table(columns, [[r.get(c) for c in columns] for r in rows], width, float_format=".3f")


def render(report: DoctorReport, width: int | None = None) -> str:
    """The report as text; each table fits `width` characters (None: every column; 0: nothing cut)."""
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
        f"  storage          {report.storage.get('detail', '-')}",
        f"  labels           {label_line(report.labels)}",
        *trainer_lines(report),
    ]
    inner = width and max(width - 2, 20)  # the tables are indented two spaces
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


def label_line(labels: list[dict[str, Any]]) -> str:
    """The labels in force, each with the trajectories it marks ('none' without any)."""
    if not labels:
        return "none (trajlake label marks env_bug, reward_hack, …; the sampler can leave them out)"
    return ", ".join(
        f"{c['key']} {c['trajectories']} trajectories" + (f" ({c['turns']} turns)" if c["turns"] else "")
        for c in labels
    )


def trainer_lines(report: DoctorReport) -> list[str]:
    """The engine mismatch and the policy drift the trainer measured, each labelled (none without a trainer)."""
    tr = report.trainer
    if not tr.get("steps"):
        return []
    health = "UNHEALTHY" if (tr["mismatch"] or 0) >= MISMATCH_THRESHOLD else "healthy"
    if tr["mismatch"] is None:
        engine = f"not measured: no step trained on tokens its own weights generated ({tr['steps']} steps)"
    elif not tr["mismatch_tokens"]:
        engine = (
            f"{tr['mismatch']:.3g}, the mean of {tr['measured_steps']} steps recorded without token counts (by a "
            f"trainer that did not tell it from the policy's drift): {health} (threshold {MISMATCH_THRESHOLD:g})"
        )
    else:
        engine = (
            f"{tr['mismatch']:.3g} over {tr['mismatch_tokens']:,} tokens the trainer's own weights generated, in "
            f"{tr['measured_steps']} of {tr['steps']} steps (worst step {tr['mismatch_worst_step']:.3g}): {health} "
            f"(threshold {MISMATCH_THRESHOLD:g})"
        )
    lines = [f"  engine mismatch  {engine}"]
    if tr["drift"] is not None:
        parts = ", ".join(
            f"{d['staleness']}: {d['abs_diff']:.3g} ({d['tokens']:,})" for d in report.drift_by_staleness
        )
        lines.append(
            f"  policy drift     |Δ logprob| {tr['drift']:.3g}, KL {tr['drift_kl']:.3g} over {tr['drift_tokens']:,} "
            f"tokens of older weights (by staleness: {parts})"
        )
    return lines


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
    if report.storage.get("safe") is False:
        reasons.append(
            f"the lake's store accepts a second put-if-absent: concurrent writers lose commits; "
            f"use one that enforces If-None-Match (AWS S3, SeaweedFS) for {report.storage['lake']}"
        )
    if report.health and report.health.alerts:
        names = ", ".join(a.signal for a in report.health.alerts)
        reasons.append(f"health alerts: {names} (see the health signals above)")
    return "FAIL: " + "; ".join(reasons)


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.as_dict(), default=str, indent=2)
