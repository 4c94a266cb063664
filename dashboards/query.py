"""SQL helpers shared by the metric queries: running with parameters, table names, common clauses."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

VersionRange = tuple[int, int] | None
Runs = str | Sequence[str]
"""One run id, or several: a query of several runs reads them in one scan and keys its rows by run_id."""

TIME_BUCKETS = 40
"""About how many buckets the over-time charts split a run's time span into."""


# The stored scalar columns of the projections. The public `trajectories` and `turns` views
# join the token payloads from `events`, and DuckDB keeps that join (a scan and group-by of
# `events`) even when no token column is selected; the figures never need the tokens.
TRAJECTORIES = "_t_trajectories"
TURNS = "_t_turns"
TOOL_CALLS = "_t_tool_calls"
EVENTS = "_t_events"


def query(lake: Any, sql: str, **params: Any) -> pa.Table:
    """Run read-only SQL on the lake; DuckDB binds each `$name` placeholder to `params[name]`.

    Every parameter passed must appear in `sql` (DuckDB refuses extra ones). A query given `run`
    (one run id, or several) keeps every table it reads to those runs, so it reads only the files
    whose Delta statistics may hold them: a run's pages do not open the other runs' files.
    """
    runs = params.get("run")
    within = None
    if runs:
        ids = [runs] if isinstance(runs, str) else list(runs)
        within = ("run_id", min(ids), max(ids))
    return lake.sql(sql, params or None, within)


def versions_clause(versions: VersionRange, column: str = "policy_version_min") -> str:
    """`column BETWEEN low AND high`, or TRUE for every version."""
    if versions is None:
        return "TRUE"
    low, high = (int(v) for v in versions)
    return f"{column} BETWEEN {low} AND {high}"


SCORED = "finished AND reward IS NOT NULL AND coalesce(failure_origin, '') <> 'system'"
"""A trajectory that counts toward reward and pass@k (see trajlake.dashboards.metrics)."""


def scored(versions: VersionRange = None, runs: Runs = "") -> str:
    """The WHERE clause of scored trajectories of the run(s) in `$run`."""
    return f"{run_clause(runs)} AND {SCORED} AND {versions_clause(versions)}"


def run_clause(runs: Runs, column: str = "run_id") -> str:
    """`column = $run` for one run; `list_contains($run, column)` for several (bind `run` to the list)."""
    return f"{column} = $run" if isinstance(runs, str) else f"list_contains($run, {column})"


def run_key(runs: Runs) -> str:
    """`run_id, ` to select (and group by) when `runs` is several runs; nothing for one."""
    return "" if isinstance(runs, str) else "run_id, "


def rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table as a list of row dicts (what `--format json` prints)."""
    return table.to_pylist()


def version_join(versions: VersionRange, alias: str) -> str:
    if versions is None:
        return ""
    return (
        f"JOIN (SELECT trajectory_id FROM {TRAJECTORIES} WHERE {versions_clause(versions)}) v "
        f"ON v.trajectory_id = {alias}.trajectory_id"
    )


def time_buckets(column: str) -> str:
    """A SELECT expression putting `column` into about TIME_BUCKETS equal buckets of whole seconds."""
    return f"to_timestamp(floor(epoch({column}) / w.width) * w.width) AS bucket_start"


def bucket_seconds(first: float, last: float) -> int:
    """`bucket_width` from a span's first and last epoch seconds, computed outside SQL."""
    return max(1, math.ceil((last - first + 1) / TIME_BUCKETS))


def bucket_width(table: str, column: str, where: str) -> str:
    return (
        f"(SELECT greatest(1, ceil((epoch(max({column})) - epoch(min({column})) + 1) / {TIME_BUCKETS})) AS width "
        f"FROM {table} WHERE {where}) w"
    )


def every_trajectory_has(lake: Any, run_id: Runs, column: str) -> bool:
    """Whether every trajectory of the run(s) with turns has `column`, a sum of its turns: always
    on a lake whose `trajectories` had the column from the start; on one that gained it, the rows
    are checked (until `trajlake rebuild`, rows projected before lack it)."""
    if not lake.exists("trajectories") or column not in lake.stored_columns("trajectories"):
        return False
    if not lake.may_mix_schemas("trajectories"):
        return True
    lacking = query(
        lake,
        f"""SELECT count(*) AS n FROM {TRAJECTORIES}
            WHERE {run_clause(run_id)} AND "{column}" IS NULL AND n_turns > 0""",
        run=run_id,
    )
    return lacking.column("n")[0].as_py() == 0
