"""Pick tasks to prove learnability on: tasks whose samples disagree (non-zero reward variance).

The field's advice before a big run: take ~32 such tasks with ~8 samples each and check
that the trainer can overfit them. System failures and samples without a valid reward
are left out, since their rewards say nothing about the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

SELECT_SQL = """
select task_id, count(*) as n_samples, count(distinct group_id) as n_groups,
  avg(reward) as reward_mean, stddev_pop(reward) as reward_std, min(reward) as reward_min, max(reward) as reward_max
from trajectories
where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
group by task_id
having count(*) >= $min_samples and stddev_pop(reward) > 0
order by abs(avg(reward) - (min(reward) + max(reward)) / 2) asc, reward_std desc, task_id
limit $n
"""


def select_overfit(lake: Lake, run_id: str, n: int = 32, min_samples: int = 2) -> list[dict[str, Any]]:
    """Up to `n` tasks with non-zero reward variance, most balanced (mean nearest mid-range) first."""
    return lake.sql(SELECT_SQL, {"run": run_id, "min_samples": int(min_samples), "n": int(n)}).to_pylist()
