"""The sampler: staleness-filtered prompt groups from the lake, leased in the catalog, packed.

For a trainer at version v it reads the scalar columns of `trajectories` (no tokens),
keeps finished trajectories with v − policy_version_min <= max_staleness, always leaves
out system failures (failure_origin = 'system'), those without a valid reward and those
whose policy version is unknown (a turn recorded without one: its staleness cannot be told,
so it is never taken as fresh; counted as `unknown_version`), groups
the rest by `group_id` (leaving out those carrying a label of `exclude_labels`, and taking each
reward from `verifier_version`: the latest by default), waits up to `group_wait_s` for incomplete groups, optionally
drops zero-reward-variance groups and overlong samples, and claims whole groups in the
catalog (a group another rank got first is skipped). Only then does it fetch the token
payloads of the claimed trajectories and pack them into micro-batches.

A batch is handed out under a lease; `commit(batch)` (after the step that used it)
marks it consumed and records it in `batch_consumption` (a `batch_consumed` event), with
the advantage the step computed for each trajectory. If a rank dies before committing,
its leases expire and the trajectories come back.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.store.labels import labelled_trajectories, parse_specs
from trajlake.store.rewards import check_version, with_rewards_of
from trajlake.trainer.batch import Batch, SamplerStats, TrajectorySample, pack_micro_batches
from trajlake.trainer.config import SamplerConfig
from trajlake.trainer.errors import LeaseLostError, TrainerVersionError
from trajlake.trainer.publish import publish_batch_consumed
from trajlake.trainer.tokens import read_tokens

if TYPE_CHECKING:
    from trajlake.ingest.recorder import Recorder
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake

SCALAR_COLUMNS = (
    "trajectory_id",
    "group_id",
    "task_id",
    "policy_version_min",
    "reward",
    "status",
    "failure_origin",
    "finished",
    "total_tokens",
    "finished_at",
)
TRUNCATED_STATUSES = ("context_exhausted", "max_turns")
IN_REACH = "run_id = ? and (policy_version_min is null or policy_version_min >= ? or not finished)"
"""The rows that can still yield a sample at a trainer version: fresh enough, not finished or
without a version. Their groups are all `select_groups` reads, so a batch costs what the staleness
window holds, not the whole run (at 100k trajectories, reading every row took most of a batch)."""


def _reach(files: pa.Table, run_id: str, oldest: int) -> pa.Table:
    """The `trajectories` files (a `Lake.file_stats` table) whose Delta statistics may hold a row
    `IN_REACH`: those of the run with a null or fresh enough version, or an unfinished row (a file
    without the statistics is kept). A run's files past its staleness window are not opened."""
    if not files.num_rows:
        return files

    def stat(name: str, type_: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return files.column(name) if name in files.column_names else pa.nulls(files.num_rows, type_)

    def keep(cond: pa.Array) -> pa.Array:
        return pc.fill_null(cond, True)

    may = pc.and_(
        keep(pc.and_kleene(pc.less_equal(stat("min.run_id", pa.string()), run_id),
                           pc.greater_equal(stat("max.run_id", pa.string()), run_id))),
        pc.or_(
            pc.or_(keep(pc.greater(stat("null_count.policy_version_min", pa.int64()), 0)),
                   keep(pc.greater_equal(stat("max.policy_version_min", pa.int64()), oldest))),
            keep(pc.invert(stat("min.finished", pa.bool_()))),
        ),
    )  # fmt: skip
    return files.filter(may)


FINISHED_COUNTS = (
    "count(*) AS finished, count(*) FILTER (failure_origin = 'system') AS system_failures, "
    "count(*) FILTER (failure_origin IS DISTINCT FROM 'system' AND reward IS NULL) AS no_reward"
)
"""The run's finished trajectories counted in SQL: all of them, system failures, and the others
without a reward. One row, where reading the two columns moved a million rows into Arrow (0.10 s
against 0.04 s on a 1B-token run)."""
COUNTED = ("finished", "system_failures", "no_reward")


def _out_of_reach(finished: dict[str, int], cols: dict[str, list[Any]]) -> SamplerStats:
    """The counts of the rows `select_groups` does not read (every one finished and too stale): the
    run's `FINISHED_COUNTS` less those of the rows within reach: counts of the finished rows,
    without the join that picks the groups out of reach (on a million trajectories 0.08 s
    against 0.41 s, before the counts moved into SQL)."""
    for i, done in enumerate(cols["finished"]):
        if done:
            finished["finished"] -= 1
            if cols["failure_origin"][i] == "system":
                finished["system_failures"] -= 1
            elif cols["reward"][i] is None:
                finished["no_reward"] -= 1
    stale = finished["finished"] - finished["system_failures"] - finished["no_reward"]
    return SamplerStats(
        finished=finished["finished"],
        system_failures=finished["system_failures"],
        no_reward=finished["no_reward"],
        stale=stale,
    )


@dataclass
class _Member:
    trajectory_id: str
    task_id: str | None
    reward: float
    policy_version_min: int
    overlong: bool


@dataclass
class _Group:
    group_id: str
    members: list[_Member] = field(default_factory=list)
    unfinished: int = 0
    finished: int = 0
    first_finished_at: int | None = None
    """Microseconds since the epoch (a datetime per row costs ~9 µs: 0.9 s for 100k trajectories)."""


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _epoch_us(t: dt.datetime) -> int:
    return (t - EPOCH) // dt.timedelta(microseconds=1)


class Sampler:
    """Hands out staleness-filtered, leased, packed batches of one run to one trainer rank."""

    def __init__(
        self,
        lake: Lake,
        catalog: Catalog | None,
        config: SamplerConfig,
        *,
        rank: int = 0,
        owner: str | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.lake = lake
        self.catalog = catalog
        self.config = config
        self.rank = rank
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:rank{rank}:{uuid.uuid4().hex[:6]}"
        self.recorder = recorder
        self.handed_out = 0
        check_version(lake, config.run_id, config.verifier_version)  # a version the run never had: said now
        self._beyond: tuple[frozenset[str], dict[str, int]] = (frozenset(), dict.fromkeys(COUNTED, 0))
        """The `trajectories` files out of reach when last counted, and their `FINISHED_COUNTS`."""

    # -- selection ------------------------------------------------------------------------
    def select_groups(
        self, trainer_version: int, now: dt.datetime | None = None
    ) -> tuple[list[_Group], SamplerStats]:
        """Groups ready to hand out at `trainer_version` (oldest first), and what was left out."""
        cfg = self.config
        if (
            isinstance(trainer_version, bool)
            or not isinstance(trainer_version, Integral)
            or trainer_version < 0
        ):
            raise TrainerVersionError(run_id=cfg.run_id, trainer_version=trainer_version)
        now = now or dt.datetime.now(dt.UTC)
        rows, finished = self._rows_in_reach(cfg.run_id, trainer_version - cfg.max_staleness)
        rows = with_rewards_of(self.lake, cfg.run_id, rows, cfg.verifier_version)
        labelled = labelled_trajectories(self.lake, cfg.run_id, parse_specs(cfg.exclude_labels))
        taken = self.catalog.unavailable_ids(cfg.run_id) if self.catalog is not None else set()
        cols = {name: rows.column(name).to_pylist() for name in SCALAR_COLUMNS if name != "finished_at"}
        cols["finished_at"] = rows.column("finished_at").cast(pa.int64()).to_pylist()
        stats = _out_of_reach(finished, cols)
        groups: dict[str, _Group] = {}
        blocked: set[str] = set()
        for i, tid in enumerate(cols["trajectory_id"]):
            group = groups.setdefault(cols["group_id"][i] or tid, _Group(cols["group_id"][i] or tid))
            if tid in taken:
                stats.taken += 1
                blocked.add(group.group_id)
                continue
            if not cols["finished"][i]:
                stats.unfinished += 1
                group.unfinished += 1
                continue
            stats.finished += 1
            group.finished += 1
            finished_at = cols["finished_at"][i]
            if finished_at is not None and (
                group.first_finished_at is None or finished_at < group.first_finished_at
            ):
                group.first_finished_at = finished_at
            if tid in labelled:  # a person or a tool found it unfit to train on (env_bug, reward_hack, …)
                stats.labelled += 1
                continue
            member = self._admit(cols, i, trainer_version, stats)
            if member is not None:
                group.members.append(member)
        stats.late_members = sum(len(groups[gid].members) for gid in blocked)
        now_us = _epoch_us(now)
        ready = [g for gid, g in groups.items() if gid not in blocked and self._is_ready(g, now_us, stats)]
        ready = [g for g in ready if self._has_signal(g, stats)]
        ready.sort(key=lambda g: (g.first_finished_at or now_us, g.group_id))
        stats.ready_groups = len(ready)
        return ready, stats

    def _rows_in_reach(self, run_id: str, oldest: int) -> tuple[pa.Table, dict[str, int]]:
        """The `SCALAR_COLUMNS` of every member of a group with a row `IN_REACH`, and the run's
        `FINISHED_COUNTS`, read from one snapshot: the files that may hold such a row, then those
        whose `group_id` (or, for a trajectory without a group, `trajectory_id`) range may hold
        their groups' other members."""
        lake = self.lake
        files = lake.file_stats("trajectories")
        run = "run_id = ?"
        reach = _reach(files, run_id, oldest)
        finished = self._finished_counts(files, reach, run_id)
        keys = lake.read(
            "trajectories", ["group_id", "trajectory_id"], IN_REACH, [run_id, oldest], files=reach
        )
        pairs = list(zip(keys.column(0).to_pylist(), keys.column(1).to_pylist(), strict=True))
        groups = sorted({g or t for g, t in pairs})
        parts = [
            lake.read("trajectories", SCALAR_COLUMNS, run, [run_id], among=("group_id", groups), files=files)
        ]
        alone = sorted({t for g, t in pairs if not g})  # a trajectory without a group is its own
        if alone:
            where = f"{run} and coalesce(group_id, '') = ''"
            among = ("trajectory_id", alone)
            parts.append(lake.read("trajectories", SCALAR_COLUMNS, where, [run_id], among=among, files=files))
        return pa.concat_tables(parts), finished

    def _finished_counts(self, files: pa.Table, reach: pa.Table, run_id: str) -> dict[str, int]:
        """The run's `FINISHED_COUNTS`: those of the files within reach, read at every batch, and
        those of the files out of reach, read once. A data file never changes, so the count of
        the files out of reach only gains the files that left the window since the last batch; it
        starts again if one is gone (compacted) or came back within reach. On a 1B-token run the
        count of every row took 25-30 ms a batch, against 7 ms at 10M."""
        beyond = files.filter(pc.invert(pc.is_in(files.column("uri"), reach.column("uri"))))
        uris = frozenset(beyond.column("uri").to_pylist())
        known, counts = self._beyond
        if not known <= uris:
            known, counts = frozenset(), dict.fromkeys(COUNTED, 0)
        if left := uris - known:  # the files that left the window since the last count
            fresh = self._count_out_of_reach(
                beyond.filter(pc.is_in(beyond.column("uri"), pa.array(sorted(left), pa.string()))), run_id
            )
            counts = {k: counts[k] + fresh[k] for k in COUNTED}
        self._beyond = (uris, counts)
        near = self._count(reach, run_id)[0]
        return {k: counts[k] + near[k] for k in COUNTED}

    def _count(self, files: pa.Table, run_id: str, by_file: bool = False) -> list[dict[str, Any]]:
        """The `FINISHED_COUNTS` of the run's rows in `files` (a `Lake.file_stats` table): one row,
        or with `by_file` one per file with rows, its `uri` first."""
        where, params = "run_id = ? and finished", [run_id]
        counts = self.lake.read(
            "trajectories", where=where, params=params, files=files, select=FINISHED_COUNTS, by_file=by_file
        )
        return counts.to_pylist()

    def _count_out_of_reach(self, files: pa.Table, run_id: str) -> dict[str, int]:
        """`_count` of files out of reach, each file's count kept in the catalog: a new sampler
        (a trainer restarted) reads there what an earlier one counted, not the files (on a
        1B-token run, counting them took 30-46 ms of a new sampler's first batch, against 14-17
        ms at 10M). Without a catalog, one count of them all."""
        if self.catalog is None:
            return self._count(files, run_id)[0]
        paths = dict(zip(files.column("uri").to_pylist(), files.column("path").to_pylist(), strict=True))
        stored = self.catalog.file_counts(run_id, list(paths.values()))
        if unknown := [uri for uri, path in paths.items() if path not in stored]:
            rows = self._count(
                files.filter(pc.is_in(files.column("uri"), pa.array(unknown, pa.string()))),
                run_id,
                by_file=True,
            )
            counted = {paths[uri]: dict.fromkeys(COUNTED, 0) for uri in unknown}  # a file may have no row
            counted.update({paths[row.pop("uri")]: row for row in rows})
            self.catalog.save_file_counts(run_id, counted)
            stored.update(counted)
        return {k: sum(one[k] for one in stored.values()) for k in COUNTED}

    def _admit(self, cols: dict[str, list[Any]], i: int, version: int, stats: SamplerStats) -> _Member | None:
        """The trajectory as a group member, or None (counted) if it must not be trained on."""
        cfg = self.config
        if cols["failure_origin"][i] == "system":
            stats.system_failures += 1  # a harness fault is never trained as reward 0
            return None
        if cols["reward"][i] is None:
            stats.no_reward += 1
            return None
        pv_min = cols["policy_version_min"][i]
        if pv_min is None:  # a turn of unknown version: how stale it is cannot be told
            stats.unknown_version += 1
            return None
        if version - pv_min > cfg.max_staleness:
            stats.stale += 1
            return None
        too_long = (
            cfg.max_sequence_tokens is not None and (cols["total_tokens"][i] or 0) > cfg.max_sequence_tokens
        )
        overlong = cols["status"][i] in TRUNCATED_STATUSES or too_long
        if overlong:
            stats.overlong += 1
            if cfg.overlong == "drop":
                return None
        return _Member(
            cols["trajectory_id"][i], cols["task_id"][i], float(cols["reward"][i]), int(pv_min), overlong
        )

    def _is_ready(self, group: _Group, now_us: int, stats: SamplerStats) -> bool:
        cfg = self.config
        complete = group.finished >= cfg.group_size if cfg.group_size else group.unfinished == 0
        if complete:
            return bool(group.members)
        waited = (
            group.first_finished_at is not None
            and (now_us - group.first_finished_at) / 1e6 >= cfg.group_wait_s
        )
        if not waited:
            stats.incomplete_groups_waiting += 1
            return False
        if cfg.incomplete_groups == "drop":
            stats.incomplete_groups_dropped += 1
            return False
        return bool(group.members)

    def _has_signal(self, group: _Group, stats: SamplerStats) -> bool:
        if not self.config.drop_zero_variance:
            return True
        if len({m.reward for m in group.members}) > 1:
            return True
        stats.zero_variance_groups += 1
        return False

    # -- hand-out -------------------------------------------------------------------------
    def next_batch(self, trainer_version: int, step: int, timeout_s: float = 0.0) -> Batch | None:
        """The next batch for a trainer at `trainer_version`, or None if none was ready in time.

        Waits up to `timeout_s` for `groups_per_batch` groups; at the deadline hands out
        what there is (at least one group).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            final = time.monotonic() >= deadline
            groups, stats = self.select_groups(trainer_version)
            if len(groups) >= self.config.groups_per_batch or (final and groups):
                claimed = self._claim(groups, trainer_version, stats)
                if claimed:
                    return self._build(claimed, trainer_version, step, stats)
            if final:
                return None
            time.sleep(min(self.config.poll_interval_s, max(0.0, deadline - time.monotonic())))

    def plan(self, trainer_version: int, n_batches: int, step: int = 0) -> list[Batch]:
        """Batches for replay, without leases: the first `n_batches` × groups_per_batch ready groups, in order.

        Deterministic for a given lake state, so every configuration of an ablation sees
        the same batches in the same order. Nothing is leased, committed or recorded.
        """
        groups, stats = self.select_groups(trainer_version)
        per = self.config.groups_per_batch
        return [
            self._build(groups[i * per : (i + 1) * per], trainer_version, step + i, stats)
            for i in range(min(n_batches, -(-len(groups) // per)))
        ]

    def _claim(self, groups: list[_Group], version: int, stats: SamplerStats) -> list[_Group]:
        """Lease whole groups, spreading ranks over the list; skip groups another rank got first.

        Claims the ids of as many groups as are still wanted in one statement, then gives
        back the part of any group it got only partly (a race with another rank).
        """
        catalog = self._catalog()
        run, want = self.config.run_id, self.config.groups_per_batch
        shift = (self.rank * want) % len(groups)
        queue = groups[shift:] + groups[:shift]
        claimed: list[_Group] = []
        while queue and len(claimed) < want:
            chunk, queue = queue[: want - len(claimed)], queue[want - len(claimed) :]
            ids = [m.trajectory_id for g in chunk for m in g.members]
            got = set(
                catalog.claim(
                    run,
                    ids,
                    self.owner,
                    rank=self.rank,
                    trainer_version=version,
                    ttl_s=self.config.lease_ttl_s,
                )
            )
            partial: list[str] = []
            for group in chunk:
                mine = [m.trajectory_id for m in group.members if m.trajectory_id in got]
                if len(mine) == len(group.members):
                    claimed.append(group)
                else:
                    stats.lost_races += 1
                    partial += mine
            catalog.release(run, partial, self.owner)
        return claimed

    def _catalog(self) -> Catalog:
        if self.catalog is None:
            raise ValueError(
                "this sampler has no catalog: pass one to hand out batches (or use plan() to replay)"
            )
        return self.catalog

    def _build(self, groups: list[_Group], version: int, step: int, stats: SamplerStats) -> Batch:
        members = [m for g in groups for m in g.members]
        tokens = read_tokens(
            self.lake, self.config.run_id, [m.trajectory_id for m in members], self.config.token_reader
        )
        samples: list[TrajectorySample] = []
        for group in groups:
            for m in group.members:
                ids, lps, mask = tokens[m.trajectory_id]
                if m.overlong and self.config.overlong == "mask":
                    mask = np.zeros_like(mask)  # kept for the group's baseline, but not trained on
                sample = TrajectorySample(
                    trajectory_id=m.trajectory_id,
                    group_id=group.group_id,
                    task_id=m.task_id,
                    reward=m.reward,
                    policy_version_min=m.policy_version_min,
                    staleness=version - m.policy_version_min,
                    token_ids=ids,
                    logprobs=lps,
                    loss_mask=mask,
                    overlong=m.overlong,
                )
                samples.append(sample)
        micro = pack_micro_batches([s.n_tokens for s in samples], self.config.micro_batch_tokens)
        self.handed_out += len(samples)
        return Batch(self.config.run_id, step, version, samples, micro, stats)

    def commit(self, batch: Batch) -> list[str]:
        """Mark a used batch consumed and record it in `batch_consumption`; return the ids committed.

        The record holds each trajectory's advantage when a step set `batch.advantages`.

        Raises `LeaseLostError` (after committing the rest) if a lease had expired and
        another rank took some of the batch: raise `lease_ttl_s` above the step time.
        """
        run = self.config.run_id
        kept = set(self._catalog().mark_consumed(run, batch.trajectory_ids, self.owner, step=batch.step))
        samples = [s for s in batch.samples if s.trajectory_id in kept]
        if samples:
            self._record(batch, samples)
        lost = [tid for tid in batch.trajectory_ids if tid not in kept]
        if lost:
            raise LeaseLostError(
                f"{len(lost)} trajectories of step {batch.step} were re-leased by another rank before commit; "
                f"raise lease_ttl_s (now {self.config.lease_ttl_s}s) above the time a step takes",
                run_id=run,
                trajectory_ids=lost,
            )
        return [s.trajectory_id for s in samples]

    def _record(self, batch: Batch, samples: list[TrajectorySample]) -> None:
        advantages = None
        if batch.advantages is not None:  # a step trained on the batch: keep what it computed
            by_id = dict(zip(batch.trajectory_ids, batch.advantages, strict=True))
            advantages = [by_id[s.trajectory_id] for s in samples]
        publish_batch_consumed(
            self.lake, self.recorder, self.config.run_id, self.owner, batch.step, batch.trainer_version,
            [s.trajectory_id for s in samples], [s.staleness for s in samples], advantages,
        )  # fmt: skip

    def release(self, batch: Batch) -> int:
        """Give a batch back unused (e.g. the step failed); its trajectories can be handed out again."""
        return self._catalog().release(self.config.run_id, batch.trajectory_ids, self.owner)

    def renew(self) -> int:
        """Extend this rank's live leases by `lease_ttl_s` (for steps longer than the TTL)."""
        return self._catalog().renew(self.config.run_id, self.owner, self.config.lease_ttl_s)

    def batches(
        self, trainer_version: Any, steps: int | None = None, timeout_s: float = 0.0
    ) -> Iterator[Batch]:
        """Yield batches; each is committed when the loop asks for the next one (or ends).

        `trainer_version` is an int or a callable returning the current version.
        """
        step = 0
        while steps is None or step < steps:
            version = trainer_version() if callable(trainer_version) else trainer_version
            batch = self.next_batch(version, step, timeout_s)
            if batch is None:
                return
            yield batch
            self.commit(batch)
            step += 1
