"""Queries of the latency page: per-request generation latency, token lengths, the slowest trajectories.

Per-turn measures are grouped by the turn's own policy version (the weights that sampled it);
per-trajectory measures by `policy_version_min`, over finished trajectories only (a running
one has not reached its length yet). A turn without a recorded `latency_s` counts toward the
token lengths but not toward latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from trajlake.dashboards.query import (
    TRAJECTORIES,
    TURNS,
    VersionRange,
    every_trajectory_has,
    query,
    versions_clause,
)

PERCENTILES = (0.5, 0.9, 0.99)
"""The percentiles drawn as lines per policy version (p50, p90, p99)."""
HISTOGRAM_BINS = 40
"""Equal-width bins between the smallest value and the p99; one more bin holds the top 1 %."""


@dataclass(frozen=True)
class Measure:
    """One distribution the page draws: a column of `turns` or of finished `trajectories`."""

    table: str
    column: str
    title: str
    unit: str
    whole: bool  # counts (bins of whole numbers), or seconds

    @property
    def version(self) -> str:
        """The policy version a value belongs to: the turn's own, or the trajectory's first."""
        return "policy_version" if self.table == TURNS else "policy_version_min"

    def scope(self, versions: VersionRange) -> str:
        """The WHERE clause of the rows of run `$run` this measure reads."""
        finished = "TRUE" if self.table == TURNS else "finished"
        return (
            f"run_id = $run AND {finished} AND {self.version} IS NOT NULL "
            f"AND {versions_clause(versions, self.version)}"
        )

    def source(self, versions: VersionRange) -> str:
        """`SELECT policy_version, value` of the run `$run` (rows without a value left out)."""
        return f"""SELECT {self.version} AS policy_version, {self.column}::DOUBLE AS value FROM {self.table}
                   WHERE {self.scope(versions)} AND {self.column} IS NOT NULL"""


MEASURES = {
    "latency_s": Measure(TURNS, "latency_s", "Generation latency per request (s)", "seconds", whole=False),
    "output_tokens": Measure(TURNS, "n_output_tokens", "Output tokens per turn", "tokens", whole=True),
    "tokens": Measure(TRAJECTORIES, "total_tokens", "Tokens per trajectory", "tokens", whole=True),
    "turns": Measure(TRAJECTORIES, "n_turns", "Turns per trajectory", "turns", whole=True),
}
"""What the page and `trajlake metrics` show, by name (the `measure` column of the figures)."""


def _measure(name: str) -> Measure:
    if name not in MEASURES:
        raise ValueError(f"measure must be one of {', '.join(MEASURES)} (got {name!r})")
    return MEASURES[name]


def length_percentiles(lake: Any, run_id: str, versions: VersionRange = None) -> pa.Table:
    """Per measure and policy version: n values, mean, p50, p90, p99 and max.

    A measure with no value in a version (e.g. no latency recorded) has no row for it. Each
    table is read once, and each measure's percentiles come from one sort (the list form of
    `quantile_cont`): a few times faster than one quantile at a time on millions of turns.
    """
    ctes, parts = [], []
    for table in (TURNS, TRAJECTORIES):
        names = [n for n, m in MEASURES.items() if m.table == table]
        first = MEASURES[names[0]]
        aggregates = ", ".join(
            f"count({c}) AS n_{n}, avg({c}) AS mean_{n}, quantile_cont({c}::DOUBLE, {list(PERCENTILES)}) AS q_{n}, "
            f"max({c})::DOUBLE AS max_{n}"
            for n, c in ((n, MEASURES[n].column) for n in names)
        )
        ctes.append(
            f"""{table}_by_version AS MATERIALIZED (SELECT {first.version} AS policy_version, {aggregates}
                FROM {table} WHERE {first.scope(versions)} GROUP BY 1)"""
        )
        for n in names:
            quantiles = ", ".join(f"q_{n}[{i + 1}] AS p{round(q * 100)}" for i, q in enumerate(PERCENTILES))
            parts.append(
                f"""SELECT '{n}' AS measure, policy_version, n_{n} AS n, mean_{n} AS mean, {quantiles},
                           max_{n} AS max FROM {table}_by_version WHERE n_{n} > 0"""
            )
    order = "CASE measure " + " ".join(f"WHEN '{n}' THEN {i}" for i, n in enumerate(MEASURES)) + " END"
    return query(
        lake,
        f"WITH {', '.join(ctes)} SELECT * FROM ({' UNION ALL '.join(parts)}) ORDER BY {order}, policy_version",
        run=run_id,
    )


def length_histogram(
    lake: Any, run_id: str, measure: str, versions: VersionRange = None, bins: int = HISTOGRAM_BINS
) -> pa.Table:
    """A measure's distribution per policy version: `bin_start, bin_end, n` and each bin's share of its version.

    The bins are shared by every version: equal widths (whole numbers for counts) from the
    selection's smallest value to its p99, then one last bin from there to the largest value.
    """
    m = _measure(measure)
    width = (
        "greatest(1, ceil((quantile_cont(value, 0.99) - min(value) + 1) / $bins))"
        if m.whole
        else "greatest(1e-9, (quantile_cont(value, 0.99) - min(value)) / $bins)"
    )
    return query(
        lake,
        f"""WITH v AS ({m.source(versions)}),
                 w AS (SELECT min(value) AS low, {width} AS width, max(value) AS high FROM v),
                 b AS (SELECT policy_version, least(floor((value - low) / width), $bins)::BIGINT AS bin,
                              count(*) AS n
                       FROM v, w GROUP BY ALL)
            SELECT b.policy_version, low + bin * width AS bin_start,
                   CASE WHEN bin = $bins THEN high ELSE low + (bin + 1) * width END AS bin_end,
                   n, n / sum(n) OVER (PARTITION BY b.policy_version) AS share
            FROM b, w ORDER BY b.policy_version, bin_start""",
        run=run_id,
        bins=int(bins),
    )


def slowest_trajectories(lake: Any, run_id: str, versions: VersionRange = None, limit: int = 20) -> pa.Table:
    """The trajectories that spent longest generating (sum of their turns' latency), slowest first.

    A top-N of `trajectories`, whose rows sum their turns' latency; summed from `turns` (a
    group-by of every turn, 2.9x slower at a million trajectories) on a lake projected before
    those columns existed, until `trajlake rebuild`.
    """
    if every_trajectory_has(lake, run_id, "n_timed_turns"):
        g, source = "t", f"{TRAJECTORIES} t WHERE t.n_timed_turns > 0 AND"
    else:
        g = "g"
        source = f"""(SELECT trajectory_id, sum(latency_s)::DOUBLE AS generation_s,
                             max(latency_s)::DOUBLE AS slowest_turn_s, count(latency_s) AS n_timed_turns
                      FROM {TURNS} WHERE run_id = $run AND latency_s IS NOT NULL GROUP BY trajectory_id) g
                     JOIN {TRAJECTORIES} t ON t.trajectory_id = g.trajectory_id WHERE"""
    return query(
        lake,
        f"""SELECT t.trajectory_id, {g}.generation_s, {g}.slowest_turn_s, {g}.n_timed_turns, t.n_turns,
                   t.assistant_tokens, t.total_tokens, t.policy_version_min AS policy_version, t.task_id,
                   t.status, t.reward, epoch(t.finished_at) - epoch(t.started_at) AS wall_s
            FROM {source} t.run_id = $run AND {versions_clause(versions, "t.policy_version_min")}
            ORDER BY {g}.generation_s DESC, t.trajectory_id LIMIT $limit""",
        run=run_id,
        limit=int(limit),
    )
