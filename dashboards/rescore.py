"""Queries of the re-scoring page: a run's verifier versions, and what passes or fails differently under two.

A trajectory's verdict under a version is `pass` (reward >= the threshold), `fail`, or `unscored`
(that version's last reward event for it has no valid reward: its verifier raised). Only the
trajectories both versions looked at are compared; `store.rewards.VERSION_REWARDS_SQL` picks each
version's reward (`original`, `latest`, or a name `trajlake rescore` stored).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from trajlake.dashboards.query import TRAJECTORIES, query
from trajlake.store.rewards import VERSIONS_SQL, version_rewards_sql

VERDICT = "case when {r}.reward >= $threshold then 'pass' when {r}.reward is not null then 'fail' else 'unscored' end"

FLIPS_SQL = f"""
with a as ({version_rewards_sql("a")}), b as ({version_rewards_sql("b")}),
both_ as (
  select t.trajectory_id, t.task_id, t.policy_version_min as policy_version, a.reward as reward_a,
    b.reward as reward_b, {VERDICT.format(r="a")} as verdict_a, {VERDICT.format(r="b")} as verdict_b,
    b.verifier_error as error_b
  from {TRAJECTORIES} t join a using (run_id, trajectory_id) join b using (run_id, trajectory_id)
  where t.run_id = $run
)
select *, verdict_a || ' → ' || verdict_b as flip from both_
"""
"""Every trajectory both versions (`$a`, `$b`) scored or tried to, with its verdict under each."""


def verifier_versions(lake: Any, run_id: str) -> list[dict[str, Any]]:
    """The run's verifier versions (`original` first), with what each scored."""
    if not lake.exists("rewards"):
        return []
    return query(lake, VERSIONS_SQL, run=run_id).to_pylist()


def verdict_flips(lake: Any, run_id: str, a: str, b: str, success_threshold: float) -> pa.Table:
    """The trajectories whose verdict differs under versions `a` and `b`, most recently started tasks first."""
    return query(
        lake,
        f"select * from ({FLIPS_SQL}) where verdict_a <> verdict_b order by flip, task_id, trajectory_id",
        run=run_id, a=a, b=b, threshold=float(success_threshold),
    )  # fmt: skip


def flip_counts(lake: Any, run_id: str, a: str, b: str, success_threshold: float) -> dict[str, int]:
    """How many compared trajectories keep their verdict and how many take each new one (`pass → fail`, …)."""
    counts = query(
        lake, f"select flip, count(*) as n from ({FLIPS_SQL}) group by flip",
        run=run_id, a=a, b=b, threshold=float(success_threshold),
    )  # fmt: skip
    return dict(zip(counts.column("flip").to_pylist(), counts.column("n").to_pylist(), strict=True))


def task_flips(lake: Any, run_id: str, a: str, b: str, success_threshold: float) -> pa.Table:
    """Per task with a trajectory whose verdict flipped: its samples, pass rate under each version, and flips."""
    return query(
        lake,
        f"""select task_id, count(*) as samples,
                   avg((verdict_a = 'pass')::int) as pass_rate_a, avg((verdict_b = 'pass')::int) as pass_rate_b,
                   count(*) filter (where verdict_a = 'fail' and verdict_b = 'pass') as fail_to_pass,
                   count(*) filter (where verdict_a = 'pass' and verdict_b = 'fail') as pass_to_fail,
                   count(*) filter (where verdict_a <> verdict_b) as flipped
            from ({FLIPS_SQL}) group by task_id having count(*) filter (where verdict_a <> verdict_b) > 0
            order by flipped desc, task_id""",
        run=run_id, a=a, b=b, threshold=float(success_threshold),
    )  # fmt: skip


def trajectory_rewards(lake: Any, run_id: str, trajectory_id: str) -> pa.Table:
    """One trajectory's reward events, oldest first: the verifier, its version, the reward or its error."""
    return query(
        lake,
        """select seq, verifier, coalesce(verifier_version, 'original') as version, reward, verifier_error,
                  event_time from rewards where run_id = $run and trajectory_id = $traj order by seq""",
        run=run_id, traj=trajectory_id,
    )  # fmt: skip
