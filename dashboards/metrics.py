"""The dashboards' figures: one function per chart, shared by the app, `trajlake metrics` and tests.

Every function takes the `Lake` and a run id (plus optional filters) and returns a `pyarrow.Table`
(or plain Python values), read with DuckDB from the scalar columns of the projections; nothing
here touches the token payloads except `trajectory_tokens`, which reads one trajectory.

Conventions shared by every figure:
- A trajectory's policy version is `policy_version_min`, the version that produced its first
  token (staleness is measured from it too).
- A *scored* trajectory is finished, has a reward, and is not a system failure: a harness or
  verifier fault says nothing about the model, so it never counts as a reward of 0.
- A scored trajectory *passes* when its reward is >= `success_threshold` (default 1.0).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.dashboards.browse import (
    find_trajectories,
    labels_by_outcome,
    trajectory_advantage,
    trajectory_labels,
    trajectory_summary,
    trajectory_token_values,
    trajectory_tool_calls,
    trajectory_turns,
)
from trajlake.dashboards.config import DEFAULT_SUCCESS_THRESHOLD
from trajlake.dashboards.latency import (
    PERCENTILES,
    length_histogram,
    length_percentiles,
    slowest_trajectories,
)
from trajlake.dashboards.passk import MAX_K, MIN_TASKS, basis, mean_pass_at_k, pass_at_k
from trajlake.dashboards.query import (
    EVENTS,
    SCORED,
    TOOL_CALLS,
    TRAJECTORIES,
    TURNS,
    Runs,
    VersionRange,
    bucket_seconds,
    bucket_width,
    every_trajectory_has,
    query,
    rows,
    run_clause,
    run_key,
    scored,
    time_buckets,
    version_join,
    versions_clause,
)
from trajlake.dashboards.rescore import (
    flip_counts,
    task_flips,
    trajectory_rewards,
    verdict_flips,
    verifier_versions,
)
from trajlake.store.config import MISMATCH_THRESHOLD

__all__ = [
    "MAX_K",
    "MIN_TASKS",
    "MISMATCH_THRESHOLD",
    "basis",
    "find_trajectories",
    "flip_counts",
    "labels_by_outcome",
    "length_histogram",
    "length_percentiles",
    "pass_at_k",
    "query",
    "rows",
    "slowest_trajectories",
    "task_flips",
    "trajectory_advantage",
    "trajectory_labels",
    "trajectory_rewards",
    "trajectory_summary",
    "trajectory_token_values",
    "trajectory_tool_calls",
    "trajectory_turns",
    "verdict_flips",
    "verifier_versions",
]


# -- selectors --------------------------------------------------------------------------------
def runs(lake: Any) -> list[str]:
    """Run ids in the lake, most recently started first.

    Every page asks (the sidebar): from the Delta statistics of `trajectories` when each of its
    files holds one run and says when its last trajectory started, as when each sink commit
    carries one run's rows; otherwise from a scan of every file (0.26 s at 312 files)."""
    files = lake.file_stats("trajectories")
    names = ("min.run_id", "max.run_id", "max.started_at", "null_count.started_at", "num_records")
    if files.num_rows and all(n in files.column_names for n in names):
        low, high, latest = (
            files.column("min.run_id"),
            files.column("max.run_id"),
            files.column("max.started_at"),
        )
        alone = pc.fill_null(pc.equal(low, high), False)
        known = pc.or_(
            pc.is_valid(latest), pc.equal(files.column("null_count.started_at"), files.column("num_records"))
        )
        if pc.all(pc.and_(alone, pc.fill_null(known, False))).as_py():
            by_run = (
                pa.table({"run_id": low, "started_at": latest})
                .group_by("run_id")
                .aggregate([("started_at", "max")])
            )
            order = pc.sort_indices(by_run, [("started_at_max", "descending", "at_end")])
            return by_run.column("run_id").take(order).to_pylist()
    table = query(
        lake, f"SELECT run_id FROM {TRAJECTORIES} GROUP BY run_id ORDER BY max(started_at) DESC NULLS LAST"
    )
    return table.column("run_id").to_pylist()


def policy_versions(lake: Any, run_id: str) -> list[int]:
    """Policy versions that started trajectories of the run, ascending."""
    table = query(
        lake,
        f"SELECT DISTINCT policy_version_min AS v FROM {TRAJECTORIES} WHERE run_id = $run AND v IS NOT NULL ORDER BY v",
        run=run_id,
    )
    return table.column("v").to_pylist()


# -- run overview -----------------------------------------------------------------------------
def task_outcomes(
    lake: Any,
    run_id: Runs,
    versions: VersionRange = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
) -> pa.Table:
    """Per task (and policy version): n scored samples, c passing ones, and their mean reward (a trajectory
    of unknown version has no place on the version axis: it counts in the run's figures only)."""
    return query(
        lake,
        f"""SELECT {run_key(run_id)}policy_version_min AS policy_version, task_id, count(*) AS n,
                   count(*) FILTER (WHERE reward >= $threshold) AS c, avg(reward) AS reward_mean
            FROM {TRAJECTORIES} WHERE {scored(versions, run_id)} AND policy_version_min IS NOT NULL
            GROUP BY ALL ORDER BY {run_key(run_id)}policy_version, task_id""",
        run=run_id,
        threshold=float(success_threshold),
    )


PASS_AT_K_FIELDS = [
    ("k", pa.int64()),
    ("pass_at_k", pa.float64()),
    ("n_tasks", pa.int64()),
    ("n_tasks_total", pa.int64()),
]
"""The columns of every pass@k table after its keys: the value and the tasks it stands on (`mean_pass_at_k`)."""


def pass_at_k_curve(
    lake: Any,
    run_id: Runs,
    versions: VersionRange = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    max_k: int = MAX_K,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """pass@k for k = 1..max_k over the tasks with >= k scored samples in `versions`, with their count.

    For several runs, one curve per run (rows keyed by run_id, in the order given)."""
    outcomes = query(
        lake,
        f"""SELECT {run_key(run_id)}task_id, count(*) AS n, count(*) FILTER (WHERE reward >= $threshold) AS c
            FROM {TRAJECTORIES} WHERE {scored(versions, run_id)} GROUP BY ALL""",
        run=run_id,
        threshold=float(success_threshold),
    )
    keys = [] if isinstance(run_id, str) else [("run_id", pa.string())]
    order = [()] if isinstance(run_id, str) else [(r,) for r in run_id]
    return pass_at_k_table(outcomes, keys, order, max_k, min_tasks)


def pass_at_k_by_version(
    lake: Any,
    run_id: str,
    versions: VersionRange = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    max_k: int = MAX_K,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """Per policy version, pass@k over the tasks with >= k scored samples at that version, with their count."""
    outcomes = task_outcomes(lake, run_id, versions, success_threshold)
    keys = [("policy_version", pa.int64())]
    order = [(v,) for v in dict.fromkeys(outcomes.column("policy_version").to_pylist())]
    return pass_at_k_table(outcomes, keys, order, max_k, min_tasks)


def pass_at_k_table(
    outcomes: pa.Table, keys: list[tuple[str, pa.DataType]], order: list[tuple], max_k: int, min_tasks: int
) -> pa.Table:
    """`mean_pass_at_k` of each group of per-task `n, c` rows that share `keys`, groups in `order`."""
    tasks: dict[tuple, list[tuple[int, int]]] = {key: [] for key in order}
    columns = [outcomes.column(name).to_pylist() for name, _ in keys]
    pairs = zip(outcomes.column("n").to_pylist(), outcomes.column("c").to_pylist(), strict=True)
    for i, pair in enumerate(pairs):
        tasks[tuple(column[i] for column in columns)].append(pair)
    table = [
        {**{name: value for (name, _), value in zip(keys, key, strict=True)}, **row}
        for key, got in tasks.items()
        for row in mean_pass_at_k(got, range(1, max_k + 1), min_tasks)
    ]
    return pa.Table.from_pylist(table, schema=pa.schema([*keys, *PASS_AT_K_FIELDS]))


def overview_by_version(
    lake: Any,
    run_id: Runs,
    versions: VersionRange = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> pa.Table:
    """Per policy version (and run, for several): trajectories, scored ones, mean reward, pass@1 and failure counts.

    pass@1 is the mean over the version's `n_tasks` tasks of each task's share of passing scored
    samples, hidden (null) below `min_tasks` tasks as `mean_pass_at_k` hides it; one scan gives
    both the per-task outcomes it needs and the counts."""
    keys = f"{run_key(run_id)}policy_version_min"
    table = query(
        lake,
        f"""WITH per_task AS (
                SELECT {keys}, task_id, count(*) AS n_trajectories, count(*) FILTER (WHERE {SCORED}) AS n,
                       count(*) FILTER (WHERE {SCORED} AND reward >= $threshold) AS c,
                       sum(reward) FILTER (WHERE {SCORED}) AS reward_sum,
                       count(*) FILTER (WHERE failure_origin = 'system') AS n_system_failures,
                       count(*) FILTER (WHERE failure_origin = 'model') AS n_model_failures
                FROM {TRAJECTORIES}
                WHERE {run_clause(run_id)} AND policy_version_min IS NOT NULL AND {versions_clause(versions)}
                GROUP BY ALL)
            SELECT {run_key(run_id)}policy_version_min AS policy_version, sum(n_trajectories)::BIGINT AS n_trajectories,
                   sum(n)::BIGINT AS n_scored, sum(reward_sum) / nullif(sum(n), 0) AS reward_mean,
                   sum(n_system_failures)::BIGINT AS n_system_failures,
                   sum(n_model_failures)::BIGINT AS n_model_failures,
                   count(*) FILTER (WHERE n > 0) AS n_tasks, avg(c / n) FILTER (WHERE n > 0) AS pass_at_1
            FROM per_task GROUP BY ALL ORDER BY {keys}""",
        run=run_id,
        threshold=float(success_threshold),
    )
    return hide_thin_pass_at_1(table, min_tasks)


def hide_thin_pass_at_1(table: pa.Table, min_tasks: int) -> pa.Table:
    """`table` with `pass_at_1` null where it stands on fewer than `min_tasks` tasks (`n_tasks`), as
    `mean_pass_at_k` withholds it."""
    enough = pc.greater_equal(table.column("n_tasks"), min_tasks)
    hidden = pc.if_else(enough, table.column("pass_at_1"), pa.scalar(None, pa.float64()))
    return table.set_column(table.schema.get_field_index("pass_at_1"), "pass_at_1", hidden)


# -- entropy ----------------------------------------------------------------------------------
def rollout_entropy(lake: Any, run_id: Runs, versions: VersionRange = None) -> pa.Table:
    """Per policy version of the turn: −mean logprob of the sampled tokens (a Monte-Carlo entropy estimate).

    Read from `trajectories.turns_by_version` (one row per trajectory); from `turns` (one row per
    turn, ~30x more) when a trajectory of the run(s) lacks it, as on a lake written before it
    existed until `trajlake rebuild`."""
    if every_trajectory_has(lake, run_id, "turns_by_version"):
        source = f"""SELECT run_id, v.policy_version, v.n_turns, v.n_output_tokens, v.sum_logprob
                     FROM (SELECT run_id, unnest(turns_by_version) AS v FROM {TRAJECTORIES}
                           WHERE {run_clause(run_id)})"""
    else:
        source = f"""SELECT run_id, policy_version, 1 AS n_turns, n_output_tokens, sum_logprob
                     FROM {TURNS} WHERE {run_clause(run_id)}"""
    return query(
        lake,
        f"""SELECT {run_key(run_id)}policy_version, -sum(sum_logprob) / nullif(sum(n_output_tokens), 0) AS entropy,
                   sum(n_output_tokens)::BIGINT AS n_tokens, sum(n_turns)::BIGINT AS n_turns
            FROM ({source}) WHERE policy_version IS NOT NULL AND {versions_clause(versions, "policy_version")}
            GROUP BY ALL ORDER BY {run_key(run_id)}policy_version""",
        run=run_id,
    )


def trainer_entropy(lake: Any, run_id: str) -> pa.Table:
    """The trainer-reported entropy per step (mean over ranks); empty until the trainer writes steps."""
    return query(
        lake,
        """SELECT step, max(trainer_version) AS trainer_version, avg(entropy) AS entropy
           FROM trainer_steps WHERE run_id = $run AND entropy IS NOT NULL GROUP BY step ORDER BY step""",
        run=run_id,
    )


# -- behaviour --------------------------------------------------------------------------------
def behaviour_by_version(lake: Any, run_id: Runs, versions: VersionRange = None) -> pa.Table:
    """Per policy version: turns, assistant tokens per turn, tool success, code execution, context, nudges."""
    return query(
        lake,
        f"""SELECT {run_key(run_id)}policy_version_min AS policy_version, count(*) AS n_trajectories,
                   avg(n_turns) AS turns_per_trajectory,
                   sum(assistant_tokens) / nullif(sum(n_turns), 0) AS assistant_tokens_per_turn,
                   1 - sum(n_tool_errors) / nullif(sum(n_tool_calls), 0) AS tool_success_rate,
                   sum(n_code_exec) / nullif(sum(n_tool_calls), 0) AS code_exec_ratio,
                   avg(CASE WHEN status = 'context_exhausted' THEN 1.0 ELSE 0.0 END) AS context_exhaustion_ratio,
                   avg(CASE WHEN nudged THEN 1.0 ELSE 0.0 END) AS nudge_rate,
                   avg(n_nudges) AS nudges_per_trajectory,
                   avg(CASE WHEN tito_drift THEN 1.0 ELSE 0.0 END) AS tito_drift_rate
            FROM {TRAJECTORIES}
            WHERE {run_clause(run_id)} AND finished AND policy_version_min IS NOT NULL AND {versions_clause(versions)}
            GROUP BY ALL ORDER BY {run_key(run_id)}policy_version""",
        run=run_id,
    )


def turns_histogram(lake: Any, run_id: str, versions: VersionRange = None) -> pa.Table:
    """How many finished trajectories took each number of turns."""
    return query(
        lake,
        f"""SELECT n_turns, count(*) AS n_trajectories FROM {TRAJECTORIES}
            WHERE run_id = $run AND finished AND {versions_clause(versions)} GROUP BY n_turns ORDER BY n_turns""",
        run=run_id,
    )


def tool_stats(lake: Any, run_id: str, versions: VersionRange = None) -> pa.Table:
    """Per tool: calls with a result, success rate, timeouts, truncations, retries, latency."""
    return query(
        lake,
        f"""SELECT c.tool_name, count(*) AS n_calls, avg(CASE WHEN c.ok THEN 1.0 ELSE 0.0 END) AS success_rate,
                   count(*) FILTER (WHERE c.timed_out) AS n_timeouts, count(*) FILTER (WHERE c.truncated) AS n_truncated,
                   sum(c.retries)::BIGINT AS n_retries, avg(c.latency_s) AS latency_s_mean,
                   bool_or(c.is_code_execution) AS is_code_execution
            FROM {TOOL_CALLS} c {version_join(versions, "c")}
            WHERE c.run_id = $run AND c.has_result GROUP BY c.tool_name ORDER BY n_calls DESC, c.tool_name""",
        run=run_id,
    )


# -- failures ---------------------------------------------------------------------------------
def failures_over_time(lake: Any, run_id: str, versions: VersionRange = None) -> pa.Table:
    """Finished trajectories per time bucket and outcome: `system`, `model` failure, or `ok`."""
    where = f"run_id = $run AND finished AND finished_at IS NOT NULL AND {versions_clause(versions)}"
    return query(
        lake,
        f"""SELECT {time_buckets("finished_at")}, coalesce(failure_origin, 'ok') AS origin, count(*) AS n_trajectories
            FROM {TRAJECTORIES}, {bucket_width(TRAJECTORIES, "finished_at", where)}
            WHERE {where} GROUP BY ALL ORDER BY bucket_start, origin""",
        run=run_id,
    )


def failures_by(lake: Any, run_id: str, dimension: str, versions: VersionRange = None) -> pa.Table:
    """Failed trajectories by `label` or `environment` and origin, with the share of all finished ones."""
    column = {"label": "failure_label", "environment": "environment"}.get(dimension)
    if column is None:
        raise ValueError(
            f"dimension must be 'label' or 'environment' (got {dimension!r}); use tool_failures for tools"
        )
    return query(
        lake,
        f"""WITH f AS (SELECT coalesce({column}, '(none)') AS {dimension}, failure_origin
                       FROM {TRAJECTORIES} WHERE run_id = $run AND finished AND {versions_clause(versions)})
            SELECT {dimension}, failure_origin AS origin, count(*) AS n_trajectories,
                   count(*) / (SELECT count(*) FROM f) AS share
            FROM f WHERE failure_origin IS NOT NULL GROUP BY ALL ORDER BY n_trajectories DESC, {dimension}, origin""",
        run=run_id,
    )


def tool_failures(lake: Any, run_id: str, versions: VersionRange = None) -> pa.Table:
    """Failed tool calls by tool and error type."""
    return query(
        lake,
        f"""SELECT c.tool_name, coalesce(c.error_type, CASE WHEN c.timed_out THEN 'timeout' ELSE 'unknown' END)
                   AS error_type, count(*) AS n_calls
            FROM {TOOL_CALLS} c {version_join(versions, "c")}
            WHERE c.run_id = $run AND c.has_result AND NOT c.ok GROUP BY ALL ORDER BY n_calls DESC, c.tool_name""",
        run=run_id,
    )


def dead_letter_reasons(lake: Any, run_id: str) -> pa.Table:
    """Dead letters of the run (and those too broken to name a run) counted by reason."""
    return query(
        lake,
        """SELECT reason, count(*) AS n_dead_letters, max(received_at) AS last_received_at FROM dead_letters
           WHERE run_id = $run OR run_id IS NULL GROUP BY reason ORDER BY n_dead_letters DESC, reason""",
        run=run_id,
    )


def recent_dead_letters(lake: Any, run_id: str, limit: int = 50) -> pa.Table:
    """The latest dead letters of the run (raw bytes left out)."""
    return query(
        lake,
        f"""SELECT received_at, source, topic, "partition", "offset", event_type, trajectory_id, reason,
                   octet_length(raw) AS raw_bytes
            FROM dead_letters WHERE run_id = $run OR run_id IS NULL ORDER BY received_at DESC LIMIT {int(limit)}""",
        run=run_id,
    )


# -- async health -----------------------------------------------------------------------------
def staleness_distribution(lake: Any, run_id: str) -> pa.Table:
    """Trajectories consumed by the trainer per staleness (trainer version − policy_version_min)."""
    return query(
        lake,
        """SELECT staleness, count(*) AS n_trajectories FROM batch_consumption
           WHERE run_id = $run GROUP BY staleness ORDER BY staleness""",
        run=run_id,
    )


def zero_signal_groups(lake: Any, run_id: str) -> pa.Table:
    """Per trainer step: the prompt groups it consumed, and those with zero signal.

    A group has zero signal when all its consumed trajectories got the same reward: every
    advantage is 0 under GRPO, Dr. GRPO and RLOO, so the step spent compute on it for no
    gradient. Rewards come from `trajectories`, so trainers that record no advantages count too.
    """
    return query(
        lake,
        f"""SELECT step, count(*) AS n_groups, count(*) FILTER (WHERE zero_signal) AS n_zero_signal_groups,
                   count(*) FILTER (WHERE zero_signal) / count(*) AS zero_signal_share
            FROM (SELECT b.step, coalesce(t.group_id, b.trajectory_id) AS group_id,
                         min(t.reward) = max(t.reward) AS zero_signal
                  FROM batch_consumption b
                  JOIN {TRAJECTORIES} t ON t.run_id = b.run_id AND t.trajectory_id = b.trajectory_id
                  WHERE b.run_id = $run GROUP BY ALL)
            GROUP BY step ORDER BY step""",
        run=run_id,
    )


CATEGORIES = {
    "difficulty": ["easy (>75% pass)", "medium", "hard (<25% pass)", "unscored"],
    "length": ["01-02 turns", "03-05 turns", "06-10 turns", "11-20 turns", "21+ turns"],
}
"""Buffer-composition categories, in the order charts colour them."""
DIFFICULTY_SQL = """CASE WHEN d.pass_rate IS NULL THEN 'unscored'
     WHEN d.pass_rate < 0.25 THEN 'hard (<25% pass)' WHEN d.pass_rate > 0.75 THEN 'easy (>75% pass)'
     ELSE 'medium' END"""
LENGTH_SQL = """CASE WHEN t.n_turns <= 2 THEN '01-02 turns' WHEN t.n_turns <= 5 THEN '03-05 turns'
     WHEN t.n_turns <= 10 THEN '06-10 turns' WHEN t.n_turns <= 20 THEN '11-20 turns' ELSE '21+ turns' END"""


def buffer_composition(
    lake: Any,
    run_id: str,
    by: str = "difficulty",
    source: str = "arrivals",
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
) -> pa.Table:
    """What fills the buffer over time: trajectories by task difficulty or length.

    `source="arrivals"`: finished trajectories per time bucket (what rollouts deliver, easy tasks
    first); `source="consumption"`: trajectories per trainer step (what the sampler handed out).
    Difficulty is the task's pass rate over the whole run.
    """
    category = {"difficulty": DIFFICULTY_SQL, "length": LENGTH_SQL}.get(by)
    if category is None or source not in ("arrivals", "consumption"):
        raise ValueError(
            f"by must be 'difficulty' or 'length' and source 'arrivals' or 'consumption' (got {by!r}, {source!r})"
        )
    difficulty = f"""(SELECT task_id, avg(CASE WHEN reward >= $threshold THEN 1.0 ELSE 0.0 END) AS pass_rate
                      FROM {TRAJECTORIES} WHERE {scored()} GROUP BY task_id) d"""
    if source == "consumption":
        return query(
            lake,
            f"""SELECT b.step, {category} AS category, count(*) AS n_trajectories
                FROM batch_consumption b
                JOIN {TRAJECTORIES} t ON t.run_id = b.run_id AND t.trajectory_id = b.trajectory_id
                LEFT JOIN {difficulty} ON d.task_id = t.task_id
                WHERE b.run_id = $run GROUP BY ALL ORDER BY b.step, category""",
            run=run_id,
            threshold=float(success_threshold),
        )
    where = "run_id = $run AND finished AND finished_at IS NOT NULL"
    return query(
        lake,
        f"""SELECT {time_buckets("t.finished_at")}, {category} AS category, count(*) AS n_trajectories
            FROM {TRAJECTORIES} t LEFT JOIN {difficulty} ON d.task_id = t.task_id,
                 {bucket_width(TRAJECTORIES, "finished_at", where)}
            WHERE t.run_id = $run AND t.finished AND t.finished_at IS NOT NULL
            GROUP BY ALL ORDER BY bucket_start, category""",
        run=run_id,
        threshold=float(success_threshold),
    )


def logprob_mismatch(lake: Any, run_id: str) -> pa.Table:
    """Train/inference logprob mismatch per trainer step (mean over ranks) against MISMATCH_THRESHOLD."""
    return query(
        lake,
        f"""SELECT step, avg(mismatch) AS mismatch, avg(mismatch) < {MISMATCH_THRESHOLD} AS healthy
            FROM trainer_steps WHERE run_id = $run AND mismatch IS NOT NULL GROUP BY step ORDER BY step""",
        run=run_id,
    )


def ingest_lag(lake: Any, run_id: str) -> pa.Table:
    """Ingest lag per time bucket: when the sink wrote an event's file minus the event's `event_time`.

    The write time is the Delta `add` action's modification time of the event's Parquet file
    (after `trajlake compact` rewrites files, it is the compaction time for the rows it moved).
    One scan reads `run_id` and `event_time` of only the files whose Delta statistics may hold
    the run; the buckets split the run's `event_time_extent`, and both percentiles come from
    one sort. The arithmetic is on integer microseconds and the bucket is a number until the
    groups are formed: per row, `epoch()` and a timestamp to group on took half the query's
    time (13M events of a 1B-token run). Returns `bucket_start, n_events, lag_p50_s,
    lag_p95_s, lag_max_s`.
    """
    schema = pa.schema(
        [("bucket_start", pa.timestamp("us", tz="UTC")), ("n_events", pa.int64())]
        + [(f"lag_{s}_s", pa.float64()) for s in ("p50", "p95", "max")]
    )
    if not lake.is_local:
        return schema.empty_table()
    extent = event_time_extent(lake, run_id)
    if extent is None:
        return schema.empty_table()
    files = lake.file_stats("events", ("run_id", run_id, run_id))
    first, last = (t.timestamp() for t in extent)
    return query(
        lake,
        """SELECT to_timestamp(bucket * $width) AS bucket_start, n_events, q[1] / 1e6 AS lag_p50_s,
                  q[2] / 1e6 AS lag_p95_s, lag_max_us / 1e6 AS lag_max_s FROM (
                SELECT us // ($width * 1000000) AS bucket, count(*) AS n_events,
                       quantile_cont(lag_us, [0.5, 0.95]) AS q, max(lag_us) AS lag_max_us
                FROM (SELECT epoch_us(event_time) AS us, $written_us[file_index::BIGINT + 1] - us AS lag_us
                      FROM read_parquet($files) WHERE run_id = $run)
                GROUP BY ALL)
            ORDER BY bucket_start""",
        files=files.column("uri").to_pylist(),
        written_us=pc.multiply(files.column("modification_time").cast(pa.int64()), 1000).to_pylist(),
        width=bucket_seconds(first, last),
        run=run_id,
    ).cast(schema)


def event_time_extent(lake: Any, run_id: str) -> tuple[dt.datetime, dt.datetime] | None:
    """The run's first and last `event_time` (None for a run without events).

    Taken from the Delta statistics when every events file that may hold the run holds only it
    (its `run_id` minimum and maximum are the run), as when one sink serves one run; otherwise
    from a scan of those files, which the sink may share between runs that arrive together."""
    files = lake.file_stats("events", ("run_id", run_id, run_id))
    if not files.num_rows:
        return None
    run = pa.scalar(run_id, pa.string())
    names = ("min.run_id", "max.run_id", "min.event_time", "max.event_time")
    if all(n in files.column_names for n in names):
        low_run, high_run, first, last = (files.column(n) for n in names)
        alone = pc.and_(pc.and_(pc.equal(low_run, run), pc.equal(high_run, run)), pc.is_valid(first))
        if pc.all(pc.fill_null(alone, False)).as_py():
            return pc.min(first).as_py(), pc.max(last).as_py()
    extent = query(
        lake,
        f"SELECT min(event_time) AS lo, max(event_time) AS hi FROM {EVENTS} WHERE run_id = $run",
        run=run_id,
    ).to_pylist()[0]
    return None if extent["hi"] is None else (extent["lo"], extent["hi"])


def freshness_s(lake: Any, run_id: str) -> float | None:
    """Seconds since the run's latest event (None for a run without events)."""
    extent = event_time_extent(lake, run_id)
    return None if extent is None else time.time() - extent[1].timestamp()


# -- the report of `trajlake metrics` ---------------------------------------------------------
def figures_by_version(
    lake: Any,
    run_id: Runs,
    versions: VersionRange = None,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> list[dict[str, Any]]:
    """Per policy version (and run, for several), one row: the overview, behaviour and rollout-entropy figures."""

    def key(r: dict[str, Any]) -> tuple[Any, Any]:
        return r.get("run_id"), r["policy_version"]

    overview = rows(overview_by_version(lake, run_id, versions, success_threshold, min_tasks))
    behaviour = {key(r): r for r in rows(behaviour_by_version(lake, run_id, versions))}
    entropy = {key(r): r["entropy"] for r in rows(rollout_entropy(lake, run_id, versions))}
    merged = []
    for row in overview:
        extra = {
            k: x for k, x in behaviour.get(key(row), {}).items() if k not in ("n_trajectories", "run_id")
        }
        merged.append({**row, **extra} | {"rollout_entropy": entropy.get(key(row))})
    return merged


def metrics_report(
    lake: Any,
    run_id: str,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
    min_tasks: int = MIN_TASKS,
) -> dict[str, Any]:
    """The dashboard's headline figures per policy version, as one JSON-ready dict.

    Each pass@k, of the run and of each version, comes as rows `{k, pass_at_k, n_tasks,
    n_tasks_total}`: the tasks it is averaged over beside it, the value null below `min_tasks`."""
    versions = figures_by_version(lake, run_id, None, success_threshold, min_tasks)
    lengths: dict[int, dict[str, float]] = {}
    for r in rows(length_percentiles(lake, run_id)):
        for q in PERCENTILES:
            p = f"p{round(q * 100)}"
            lengths.setdefault(r["policy_version"], {})[f"{r['measure']}_{p}"] = r[p]
    by_version: dict[int, list[dict[str, Any]]] = {}  # one query for every version's pass@k
    for r in rows(pass_at_k_by_version(lake, run_id, None, success_threshold, MAX_K, min_tasks)):
        by_version.setdefault(r.pop("policy_version"), []).append(r)
    for row in versions:
        v = row["policy_version"]
        row |= lengths.get(v, {})  # e.g. latency_s_p99, tokens_p50: absent where nothing was recorded
        row["pass_at_k"] = by_version.get(v, [])
    return {
        "run_id": run_id,
        "success_threshold": success_threshold,
        "min_tasks": min_tasks,
        "versions": versions,
        "pass_at_k": rows(pass_at_k_curve(lake, run_id, None, success_threshold, MAX_K, min_tasks)),
        "trainer_entropy": rows(trainer_entropy(lake, run_id)),
        "logprob_mismatch": rows(logprob_mismatch(lake, run_id)),
        "staleness": rows(staleness_distribution(lake, run_id)),
        "slowest_trajectories": rows(slowest_trajectories(lake, run_id, limit=10)),
        "zero_signal_groups": rows(zero_signal_groups(lake, run_id)),
    }
