"""Rewards per verifier version: the reward recorded with an episode and each re-score's, from `rewards`.

A trajectory's reward events are kept side by side; a version is chosen by name:
  * `latest` (the default everywhere): its last reward event, what `trajectories.reward` holds;
  * `original`: the reward recorded with the episode (its first reward event without a version);
  * any other name: its last reward event of that `verifier_version` (`trajlake rescore --verifier-version`).
A trajectory the chosen version did not score has no reward under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from trajlake.store.errors import LakeError

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

LATEST = "latest"
ORIGINAL = "original"
RESERVED = (LATEST, ORIGINAL)
"""Version names that choose by position, never a verifier's own."""

VERSION_REWARDS_SQL = """
select run_id, trajectory_id,
  case when ${version} = 'original' then arg_min_null(reward, seq) else arg_max_null(reward, seq) end as reward,
  case when ${version} = 'original' then arg_min_null(verifier_error, seq)
       else arg_max_null(verifier_error, seq) end as verifier_error,
  case when ${version} = 'original' then arg_min_null(verifier_version, seq)
       else arg_max_null(verifier_version, seq) end as verifier_version
from {table}
where run_id = $run and (${version} = 'latest' or verifier_version = ${version}
                         or (${version} = 'original' and verifier_version is null))
group by run_id, trajectory_id
"""
"""Per trajectory of run `$run`, its reward (and verifier error) under the version named by the parameter
`${version}` (a name, never pasted in): the one definition the dashboards and `trajlake rescore` use."""

VERSIONS_SQL = """
select coalesce(verifier_version, 'original') as version, any_value(verifier) as verifier,
  count(distinct trajectory_id) as trajectories, count(reward) as scored, count(verifier_error) as errors,
  avg(reward) as mean_reward, min(event_time) as first_at, max(event_time) as last_at
from rewards where run_id = $run group by all order by first_at
"""
"""The verifier versions that scored run `$run` (`original`: the rewards recorded without one), oldest first."""


class VersionNotFound(LakeError):
    """A verifier version the run was never scored with; the message lists those it was."""


def version_rewards_sql(param: str, table: str = "rewards") -> str:
    """`VERSION_REWARDS_SQL` reading `table`, the version in parameter `$<param>`, the run in `$run`."""
    return VERSION_REWARDS_SQL.replace("{version}", param).replace("{table}", table)


def versions(lake: Lake, run_id: str) -> list[dict[str, Any]]:
    """The run's verifier versions with their counts (`VERSIONS_SQL`)."""
    if not lake.exists("rewards"):
        return []
    return lake.sql(VERSIONS_SQL, {"run": run_id}).to_pylist()


def check_version(lake: Lake, run_id: str, version: str) -> str:
    """`version` if the run has rewards under it, else `VersionNotFound` naming the versions it has."""
    if version in RESERVED:
        return version
    known = [v["version"] for v in versions(lake, run_id)]
    if version not in known:
        raise VersionNotFound(
            f"run {run_id!r} has no rewards of verifier version {version!r}; it has "
            f"{', '.join(known) or 'none'} (or choose latest / original)"
        )
    return version


def rewards_of(
    lake: Lake, run_id: str, version: str, trajectory_ids: Sequence[str]
) -> dict[str, tuple[float | None, str | None]]:
    """(reward, verifier error) of each of `trajectory_ids` under `version`; a trajectory the version did
    not score is absent."""
    if not trajectory_ids or not lake.exists("rewards"):
        return {}
    where, params = "run_id = ?", [run_id]
    if version == ORIGINAL:
        where += " and verifier_version is null"
    elif version != LATEST:
        where, params = where + " and verifier_version = ?", [run_id, version]
    rows = lake.read(
        "rewards", ["trajectory_id", "seq", "reward", "verifier_error"], where, params,
        among=("trajectory_id", sorted(set(trajectory_ids))),
    )  # fmt: skip
    chosen: dict[str, tuple[int, float | None, str | None]] = {}
    first = version == ORIGINAL
    for tid, seq, reward, error in zip(*(rows.column(i).to_pylist() for i in range(4)), strict=True):
        held = chosen.get(tid)
        if held is None or (seq < held[0] if first else seq > held[0]):
            chosen[tid] = (seq, reward, error)
    return {tid: (reward, error) for tid, (_, reward, error) in chosen.items()}


def with_rewards_of(lake: Lake, run_id: str, rows: pa.Table, version: str) -> pa.Table:
    """`rows` (with `trajectory_id` and `reward`) with each reward taken from `version` (`latest`: as they
    are; a trajectory the version did not score gets none)."""
    if version == LATEST or not rows.num_rows:
        return rows
    chosen = rewards_of(lake, run_id, version, rows.column("trajectory_id").to_pylist())
    rewards = [chosen.get(tid, (None, None))[0] for tid in rows.column("trajectory_id").to_pylist()]
    at = rows.schema.get_field_index("reward")
    return rows.set_column(at, rows.schema.field(at), pa.array(rewards, rows.schema.field(at).type))
