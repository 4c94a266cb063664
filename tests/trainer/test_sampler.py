"""The sampler: staleness, groups, filters, leases, commits and micro-batches."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from trajlake.ingest.recorder import Recorder
from trajlake.store.catalog import Catalog, default_url, utcnow
from trajlake.store.compact import compact
from trajlake.store.projections import catch_up
from trajlake.trainer.batch import pack_micro_batches
from trajlake.trainer.config import SamplerConfig
from trajlake.trainer.errors import LeaseLostError, TrainerVersionError
from trajlake.trainer.sampler import Sampler, _reach
from trajlake.trainer.tokens import read_from_events, read_from_view


@pytest.fixture
def catalog(lake):
    cat = Catalog(default_url(lake.root))
    yield cat
    cat.close()


def sampler(lake, catalog, rank=0, **overrides) -> Sampler:
    config = SamplerConfig(run_id="run-t", group_wait_s=3600, **overrides)
    return Sampler(lake, catalog, config, rank=rank)


@pytest.fixture
def pair(spec):
    """Specs of a two-sample group with rewards 1 and 0 (non-zero variance)."""

    def _pair(group, version=0, rewards=(1.0, 0.0), **kw):
        return [spec(group, reward=r, version=version, **kw) for r in rewards]

    return _pair


def count_reads(lake, monkeypatch) -> list[int]:
    """The number of files each count (a read with `select`) of `lake` reads, as they happen."""
    reads: list[int] = []
    real_read = lake.read

    def spy(name, *args, files=None, select=None, **kw):
        if select is not None:
            reads.append(files.num_rows)
        return real_read(name, *args, files=files, select=select, **kw)

    monkeypatch.setattr(lake, "read", spy)
    return reads


def test_only_fresh_trajectories_are_handed_out(lake, catalog, make_run, pair):
    make_run(pair("g2", version=2) + pair("g3", version=3) + pair("g5", version=5))
    batch = sampler(lake, catalog, max_staleness=2, groups_per_batch=10).next_batch(trainer_version=5, step=0)
    assert {s.group_id for s in batch.samples} == {"g3", "g5"}
    assert max(batch.staleness) == 2
    assert batch.stats.stale == 2


def test_a_trajectory_of_unknown_version_is_never_taken_as_fresh_and_is_counted(
    lake, catalog, make_run, pair, spec
):
    make_run(pair("known", version=3) + [spec("unknown", reward=r, version=None) for r in (1.0, 0.0)])
    chooser = sampler(lake, catalog, max_staleness=2, groups_per_batch=10)
    for trainer_version in (0, 3, 5):  # at no version does an unknown one look fresh
        ready, stats = chooser.select_groups(trainer_version)
        assert "unknown" not in {g.group_id for g in ready}
        assert (stats.unknown_version, stats.finished) == (2, 4)
    batch = chooser.next_batch(trainer_version=3, step=0)
    assert {s.group_id for s in batch.samples} == {"known"} and batch.stats.as_dict()["unknown_version"] == 2


def test_whole_groups_oldest_first_up_to_groups_per_batch(lake, catalog, make_run, pair):
    make_run(pair("a") + pair("b") + pair("c"))
    batch = sampler(lake, catalog, groups_per_batch=2).next_batch(0, 0)
    assert [s.group_id for s in batch.samples] == ["a", "a", "b", "b"]
    assert batch.prompt_index().tolist() == [0, 0, 1, 1]


def test_groups_older_than_the_window_are_counted_as_row_by_row(lake, catalog, make_run, pair, spec):
    """Old groups are counted in one aggregate (not read): the same counts as reading each row."""
    old = [
        *pair("old", version=1),
        spec("old", reward=None, version=1, status="error", origin="system"),
        spec("old", reward=None, version=1),
        *pair("old-b", version=1),
    ]
    fresh = [
        *pair("fresh", version=4),
        spec("fresh", reward=None, version=4),
        spec("fresh", reward=None, version=4, status="error", origin="system"),
        spec("wip", finished=False),
    ]
    make_run(old + fresh)
    chooser = sampler(lake, catalog, max_staleness=2, groups_per_batch=10)
    ready, stats = chooser.select_groups(trainer_version=4)
    assert [g.group_id for g in ready] == ["fresh"]
    assert (stats.finished, stats.unfinished) == (10, 1)
    assert (stats.system_failures, stats.no_reward, stats.stale) == (2, 2, 4)
    # the same trajectories at a version that reaches every group: each row read and counted
    everything = sampler(lake, catalog, max_staleness=10, groups_per_batch=10).select_groups(4)[1]
    assert (everything.finished, everything.system_failures, everything.no_reward) == (10, 2, 2)


def test_files_past_the_staleness_window_are_not_read_but_their_groups_members_are(
    lake, catalog, make_run, pair, spec, bus, drain
):
    """A group in reach is read whole, wherever its members' files are; files of old, finished
    groups only are skipped on their Delta statistics, and still counted."""
    recorder = Recorder(bus, "run-t", vocab_size=100)

    def loner(version: int, reward: float) -> str:  # no task or group id: a group of its own
        traj = recorder.start(task_id="", sample_index=0)
        traj.turn([4, 5], [-0.1, -0.2], version, input_token_ids=[1, 2])
        traj.reward(reward)
        traj.finish("completed")
        return traj.trajectory_id

    old_loner = loner(0, 1.0)
    make_run([*pair("old", version=0), spec("span", reward=1.0, version=0)])
    fresh_loner = loner(5, 0.5)
    make_run([spec("span", reward=0.0, version=5)])
    make_run(pair("fresh", version=5))
    files = lake.file_stats("trajectories")
    assert 0 < len(_reach(files, "run-t", oldest=4)) < files.num_rows
    chooser = sampler(lake, catalog, max_staleness=1, groups_per_batch=10, drop_zero_variance=False)
    ready, stats = chooser.select_groups(trainer_version=5)
    members = {g.group_id: sorted(m.reward for m in g.members) for g in ready}
    assert members == {"fresh": [0.0, 1.0], "span": [0.0], fresh_loner: [0.5]}
    assert old_loner not in members
    assert (stats.finished, stats.stale) == (8, 4)  # stale: the old pair, the old span member, the old loner
    everything = sampler(lake, catalog, max_staleness=10, groups_per_batch=10).select_groups(5)[1]
    assert (everything.finished, everything.stale) == (8, 0)


def test_a_samplers_counts_stay_right_as_its_window_moves_and_files_are_compacted(
    lake, catalog, make_run, pair, spec, monkeypatch
):
    """A sampler counts the files out of its window once (a data file never changes): its counts
    match a fresh sampler's as the window moves on, moves back, and after a compaction."""
    for version in range(4):
        failed = spec(f"g{version}", reward=None, version=version, status="error", origin="system")
        make_run([*pair(f"g{version}", version=version), failed])
    reads = count_reads(lake, monkeypatch)  # files each count of the run's finished rows read

    def counts(chooser: Sampler, version: int) -> tuple[int, ...]:
        stats = chooser.select_groups(trainer_version=version)[1]
        return stats.finished, stats.system_failures, stats.no_reward, stats.stale

    def fresh(version: int) -> tuple[int, ...]:
        return counts(sampler(lake, catalog, max_staleness=0, groups_per_batch=10), version)

    chooser = sampler(lake, catalog, max_staleness=0, groups_per_batch=10)
    for version in (1, 3, 0, 3):
        assert counts(chooser, version) == fresh(version)
    assert fresh(3) == (12, 4, 0, 6)
    reads.clear()
    assert counts(chooser, 3) == (12, 4, 0, 6)
    files = lake.file_stats("trajectories").num_rows
    assert len(reads) == 1 and reads[0] < files  # the files within reach only
    compact(lake, vacuum=False)
    assert lake.file_stats("trajectories").num_rows < files
    assert counts(chooser, 3) == fresh(3) == (12, 4, 0, 6)


def test_a_new_sampler_takes_the_counts_of_files_out_of_reach_from_the_catalog(
    lake, catalog, make_run, pair, spec, monkeypatch
):
    """A restarted trainer's sampler reads the files out of its window from none of their rows:
    an earlier sampler kept each file's count in the catalog. Without a catalog it counts them."""
    for version in range(4):
        failed = spec(f"g{version}", reward=None, version=version, status="error", origin="system")
        make_run(
            [*pair(f"g{version}", version=version), spec(f"g{version}", reward=None, version=version), failed]
        )
    expected = (16, 4, 4, 6)  # finished, system failures, others without a reward, stale
    files = lake.file_stats("trajectories")
    near = _reach(files, "run-t", oldest=3).num_rows
    assert 0 < near < files.num_rows
    reads = count_reads(lake, monkeypatch)

    def counts(chooser: Sampler) -> tuple[int, ...]:
        stats = chooser.select_groups(trainer_version=3)[1]
        return stats.finished, stats.system_failures, stats.no_reward, stats.stale

    assert counts(sampler(lake, catalog, max_staleness=0)) == expected
    assert sum(reads) == files.num_rows  # the first sampler ever read every file once
    reads.clear()
    assert counts(sampler(lake, catalog, max_staleness=0)) == expected
    assert reads == [near]  # a new one: only the files within reach
    reads.clear()
    assert counts(Sampler(lake, None, SamplerConfig(run_id="run-t", max_staleness=0))) == expected
    assert sorted(reads) == sorted([near, files.num_rows - near])  # no catalog: one count of the rest


def test_after_a_compaction_a_sampler_still_reads_only_the_files_within_its_window(
    lake, catalog, make_run, pair, monkeypatch
):
    """Compaction merges `trajectories` files only up to `TRAJECTORIES_FILE_BYTES`: the run in one
    file would put every row in reach at every batch after it."""
    from trajlake.store import compact as compaction

    for version in range(8):
        make_run(pair(f"g{version}", version=version))
    before = sampler(lake, catalog, max_staleness=1).select_groups(trainer_version=7)
    sizes = lake.file_stats("trajectories").column("size_bytes").to_pylist()
    monkeypatch.setattr(compaction, "TRAJECTORIES_FILE_BYTES", 3 * max(sizes))  # a few files a bin
    compaction.compact(lake, vacuum=False)
    files = lake.file_stats("trajectories")
    assert 1 < files.num_rows < len(sizes)
    assert 0 < _reach(files, "run-t", oldest=6).num_rows < files.num_rows
    after = sampler(lake, catalog, max_staleness=1).select_groups(trainer_version=7)
    assert [g.group_id for g in after[0]] == [g.group_id for g in before[0]] == ["g6", "g7"]
    assert after[1].stale == before[1].stale == 12


def test_files_without_statistics_are_read(lake, catalog, make_run, pair):
    """A lake written before the sampler's columns had Delta statistics: every file is kept."""
    make_run(pair("old", version=0))
    files = lake.file_stats("trajectories")
    bare = files.select(
        [c for c in files.column_names if "policy_version_min" not in c and "finished" not in c]
    )
    assert _reach(bare, "run-t", oldest=4).num_rows == files.num_rows
    assert _reach(files, "run-t", oldest=4).num_rows == 0


def test_system_failures_are_excluded_and_counted(lake, catalog, make_run, pair, spec):
    make_run([*pair("a"), spec("a", reward=None, status="error", origin="system")])
    batch = sampler(lake, catalog).next_batch(0, 0)
    assert len(batch.samples) == 2
    assert batch.stats.system_failures == 1


@pytest.mark.parametrize("drop", [True, False], ids=["drop", "keep"])
def test_zero_variance_groups(lake, catalog, make_run, drop, pair):
    make_run(pair("flat", rewards=(1.0, 1.0)) + pair("mixed"))
    batch = sampler(lake, catalog, drop_zero_variance=drop).next_batch(0, 0)
    assert ({s.group_id for s in batch.samples} == {"mixed"}) is drop
    assert batch.stats.zero_variance_groups == (1 if drop else 0)


@pytest.mark.parametrize(
    ("wait", "policy", "handed"),
    [(3600, "use", {"done"}), (0, "use", {"done", "partial"}), (0, "drop", {"done"})],
    ids=["waiting", "use-after-wait", "drop-after-wait"],
)
def test_incomplete_groups_wait_then_follow_the_policy(
    lake, catalog, make_run, wait, policy, handed, pair, spec
):
    make_run(pair("done") + pair("partial") + [spec("partial", finished=False)])
    config = SamplerConfig(run_id="run-t", group_wait_s=wait, incomplete_groups=policy, groups_per_batch=5)
    batch = Sampler(lake, catalog, config).next_batch(0, 0)
    assert {s.group_id for s in batch.samples} == handed


def test_group_size_makes_a_group_complete_without_waiting(lake, catalog, make_run, pair, spec):
    make_run([*pair("g"), spec("g", finished=False)])
    assert sampler(lake, catalog).next_batch(0, 0) is None
    batch = sampler(lake, catalog, group_size=2).next_batch(0, 0)
    assert len(batch.samples) == 2


@pytest.mark.parametrize("mode", ["keep", "mask", "drop"])
def test_overlong_samples(lake, catalog, make_run, mode, spec):
    make_run([spec("g", 1.0), spec("g", 0.0), spec("g", 0.5, status="context_exhausted")])
    batch = sampler(lake, catalog, overlong=mode).next_batch(0, 0)
    long = [s for s in batch.samples if s.overlong]
    assert batch.stats.overlong == 1
    if mode == "drop":
        assert long == [] and len(batch.samples) == 2
    else:
        assert len(long) == 1 and long[0].loss_mask.any() == (mode == "keep")


def test_token_arrays_match_what_was_recorded_and_both_readers_agree(lake, catalog, bus, drain):
    recorder = Recorder(bus, "run-t", vocab_size=100)
    traj = recorder.start(task_id="t", group_id="g")
    traj.turn([10, 11], [-0.5, -0.25], 0, full_input_token_ids=[1, 2])
    traj.turn([12], [-0.125], 0, full_input_token_ids=[1, 2, 10, 11, 7, 8], loss_mask=[False])
    traj.turn([13], [-1.0], 1, full_input_token_ids=[9, 9, 9])  # drift: the sequence restarts
    traj.reward(1.0)
    traj.finish("completed")
    plain = recorder.start(task_id="t", group_id="g")
    plain.turn([20], [-2.0], 0, input_token_ids=[3])
    plain.finish("completed")
    drain()
    ids = [traj.trajectory_id, plain.trajectory_id]
    direct, view = read_from_events(lake, "run-t", ids), read_from_view(lake, "run-t", ids)
    tokens, lps, mask = direct[traj.trajectory_id]
    assert tokens.tolist() == [9, 9, 9, 13]
    assert lps.tolist() == [0, 0, 0, -1.0] and mask.tolist() == [False, False, False, True]
    assert direct[plain.trajectory_id][0].tolist() == [3, 20]
    for tid in ids:
        for a, b in zip(direct[tid], view[tid], strict=True):
            assert np.array_equal(a, b)


def test_token_arrays_align_prompt_outputs_and_environment(lake, catalog, make_run, spec):
    make_run([spec("g", 1.0, outputs=[[4, 5], [7]]), spec("g", 0.0)])
    sample = sampler(lake, catalog).next_batch(0, 0).samples[0]
    assert sample.token_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert sample.logprobs.tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, -0.1])
    assert sample.loss_mask.tolist() == [False, False, False, True, True, False, True]


def test_two_ranks_never_get_the_same_trajectory_and_commits_are_recorded(lake, catalog, make_run, pair):
    make_run(pair("a") + pair("b") + pair("c") + pair("d"))
    first = sampler(lake, catalog, rank=0, groups_per_batch=2).next_batch(0, 0)
    second = sampler(lake, catalog, rank=1, groups_per_batch=2).next_batch(0, 0)
    assert set(first.trajectory_ids).isdisjoint(second.trajectory_ids)
    assert len(first.samples) == len(second.samples) == 4
    assert sampler(lake, catalog, rank=2).next_batch(0, 0) is None
    rank0 = Sampler(lake, catalog, SamplerConfig(run_id="run-t"), owner=_owner_of(catalog, first))
    assert rank0.commit(first) == first.trajectory_ids
    catch_up(lake)
    rows = lake.sql("select trajectory_id, staleness, step from batch_consumption").to_pylist()
    assert sorted(r["trajectory_id"] for r in rows) == sorted(first.trajectory_ids)


def _owner_of(catalog, batch):
    from sqlalchemy import select

    from trajlake.store.catalog import SamplerLease

    with catalog.engine.connect() as conn:
        owners = conn.execute(
            select(SamplerLease.owner).where(SamplerLease.trajectory_id.in_(batch.trajectory_ids))
        )
        (owner,) = set(owners.scalars())
    return owner


def test_committed_trajectories_never_come_back_but_released_and_expired_ones_do(
    lake, catalog, make_run, pair
):
    make_run(pair("a") + pair("b"))
    rank0 = sampler(lake, catalog, groups_per_batch=1)
    used = rank0.next_batch(0, 0)
    rank0.commit(used)
    returned = rank0.next_batch(0, 1)
    assert set(returned.trajectory_ids).isdisjoint(used.trajectory_ids)
    rank0.release(returned)
    again = sampler(lake, catalog, rank=1).next_batch(0, 0)
    assert again.trajectory_ids == returned.trajectory_ids
    assert sampler(lake, catalog, rank=2).next_batch(0, 0) is None


def test_a_dead_ranks_lease_expires_and_its_late_commit_is_refused(lake, make_run, pair):
    make_run(pair("a"))
    now = [utcnow()]
    catalog = Catalog(default_url(lake.root), clock=lambda: now[0])
    dead = sampler(lake, catalog, lease_ttl_s=60)
    lost = dead.next_batch(0, 0)
    now[0] += dt.timedelta(seconds=59)
    assert sampler(lake, catalog, rank=1).next_batch(0, 0) is None  # the lease still holds
    now[0] += dt.timedelta(seconds=2)  # the dead rank's lease expires
    alive = sampler(lake, catalog, rank=1)
    taken = alive.next_batch(0, 0)
    assert taken.trajectory_ids == lost.trajectory_ids
    assert alive.commit(taken) == taken.trajectory_ids
    with pytest.raises(LeaseLostError, match="raise lease_ttl_s"):
        dead.commit(lost)
    catalog.close()


def test_a_partly_lost_batch_records_the_advantages_of_what_it_kept(lake, make_run, pair):
    make_run(pair("a") + pair("b", rewards=(0.5, 0.0)))
    now = [utcnow()]
    catalog = Catalog(default_url(lake.root), clock=lambda: now[0])
    slow = sampler(lake, catalog, groups_per_batch=2, lease_ttl_s=60)
    batch = slow.next_batch(0, 0)
    batch.advantages = [10.0 + i for i in range(len(batch.samples))]  # as a step would set them
    given = dict(zip(batch.trajectory_ids, batch.advantages, strict=True))
    now[0] += dt.timedelta(seconds=61)
    other = sampler(lake, catalog, rank=1, groups_per_batch=1)
    taken = other.next_batch(0, 0)
    other.commit(taken)  # no step set advantages: recorded as null
    with pytest.raises(LeaseLostError):
        slow.commit(batch)
    catalog.close()
    catch_up(lake)
    rows = lake.sql("select trajectory_id, advantage from batch_consumption").to_pylist()
    kept = {r["trajectory_id"]: r["advantage"] for r in rows}
    assert len(rows) == 4 and all(kept[t] is None for t in taken.trajectory_ids)
    assert {t: a for t, a in kept.items() if t not in taken.trajectory_ids} == {
        t: a for t, a in given.items() if t not in taken.trajectory_ids
    }


def test_micro_batches_respect_the_token_budget(lake, catalog, make_run, spec):
    specs = [spec(f"g{i // 2}", reward=float(i % 2), outputs=[[4] * (3 + 7 * i)]) for i in range(12)]
    make_run(specs)
    batch = sampler(lake, catalog, groups_per_batch=6, micro_batch_tokens=100).next_batch(0, 0)
    lengths = [s.n_tokens for s in batch.samples]
    seen = sorted(i for mb in batch.micro_batches for i in mb)
    assert seen == list(range(len(batch.samples)))
    for mb in batch.micro_batches:
        assert len(mb) * max(lengths[i] for i in mb) <= 100 or len(mb) == 1
        tensors = batch.tensors(mb)
        assert tensors.input_ids.numel() <= max(100, tensors.input_ids.shape[1])


def test_first_fit_decreasing_packing():
    assert pack_micro_batches([5, 50, 30, 20, 10], budget=60) == [[1], [2, 3], [4, 0]]
    assert pack_micro_batches([200, 10], budget=100) == [[0], [1]]  # too long: a micro-batch of its own
    assert pack_micro_batches([], budget=10) == []


def test_a_sample_finishing_after_its_group_was_handed_out_is_counted_not_used(lake, catalog, bus, drain):
    from trajlake.ingest.recorder import Recorder

    recorder = Recorder(bus, "run-t", vocab_size=100)
    trajs = [recorder.start(task_id="t", group_id="g", sample_index=i) for i in range(3)]
    for traj, reward in zip(trajs[:2], (1.0, 0.0), strict=True):
        traj.turn([4], [-0.5], 0, input_token_ids=[1])
        traj.reward(reward)
        traj.finish("completed")
    trajs[2].turn([4], [-0.5], 0, input_token_ids=[1])
    trajs[2].flush()
    drain()
    config = SamplerConfig(run_id="run-t", group_wait_s=0)
    first = Sampler(lake, catalog, config).next_batch(0, 0)
    assert len(first.samples) == 2
    trajs[2].reward(1.0)
    trajs[2].finish("completed")
    drain()
    rank1 = Sampler(lake, catalog, config, rank=1)
    assert rank1.next_batch(0, 0) is None
    assert rank1.select_groups(0)[1].late_members == 1


def test_a_labelled_trajectory_leaves_its_group_out_of_the_batch_and_is_counted(
    lake, catalog, make_run, pair
):
    from trajlake.store.labels import add_labels, label_rows

    ids = make_run(pair("clean") + pair("buggy") + pair("other"))
    add_labels(lake, label_rows("run-t", [ids["buggy"][0]], "env_bug", "true", "ann"))
    add_labels(lake, label_rows("run-t", [ids["other"][0]], "review", "ok", "ann"))
    batch = sampler(lake, catalog, groups_per_batch=10, exclude_labels=["env_bug"]).next_batch(0, 0)
    # the labelled sample is left out; its partner alone has no reward variance
    assert {s.trajectory_id for s in batch.samples} == {*ids["clean"], *ids["other"]}
    assert batch.stats.labelled == 1
    add_labels(lake, label_rows("run-t", [ids["buggy"][0]], "env_bug", None, "ann"))  # cleared: trained again
    again = sampler(lake, catalog, groups_per_batch=10, exclude_labels=["env_bug"]).next_batch(0, 1)
    assert {s.trajectory_id for s in again.samples} == set(ids["buggy"])


def test_a_bad_label_spec_names_the_setting():
    with pytest.raises(ValueError, match=r"(?s)exclude_labels.*label key 'env bug' is not a word"):
        SamplerConfig(run_id="run-t", exclude_labels=["env bug"])


def test_a_trainer_version_that_is_not_a_version_is_refused_with_the_fix(lake, catalog, make_run, pair):
    make_run(pair("g"))
    chooser = sampler(lake, catalog)
    with pytest.raises(TrainerVersionError, match="policy_versions") as raised:
        chooser.next_batch(trainer_version=None, step=0)  # a run no trainer has published to yet
    assert (raised.value.run_id, raised.value.trainer_version) == ("run-t", None)
    with pytest.raises(TrainerVersionError):
        next(chooser.batches(trainer_version=None))  # the iterator form too
    assert chooser.next_batch(trainer_version=0, step=0) is not None  # nothing was leased by the refusal
