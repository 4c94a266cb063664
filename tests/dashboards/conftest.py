"""Small lakes for the dashboard tests, built through the real pipeline (loadgen → bus → sink)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.schemas.tables import TRAINER_STEPS_SCHEMA
from trajlake.store.lake import Lake

RUN_ID = "dash-run"
OTHER_RUN_ID = "dash-run-b"


def build_lake(
    root: Path,
    trajectories: int = 192,
    trainer: bool = True,
    run_id: str = RUN_ID,
    policy_versions: int = 4,
    group_size: int = 16,
) -> Lake:
    """A lake with one loadgen run; with `trainer`, also three consumed batches and trainer steps."""
    lake = Lake(root)
    bus = InProcessBus(partitions=2)
    config = LoadgenConfig(
        trajectories=trajectories, run_id=run_id, turns=4, prompt_tokens=48, output_tokens=24, env_tokens=16,
        policy_versions=policy_versions, group_size=group_size, vocab_size=4096, system_failure_rate=0.1, seed=7,
    )  # fmt: skip
    generate(bus, config)
    sink = DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05))
    sink.run(until_idle_s=0.0)
    if trainer:
        ids = lake.sql(
            "select trajectory_id from trajectories where run_id = $run order by started_at", {"run": run_id}
        )
        record_trainer(lake, bus, run_id, ids.column("trajectory_id").to_pylist())
        sink.run(until_idle_s=0.0)
    return lake


def record_trainer(lake: Lake, bus: InProcessBus, run_id: str, trajectory_ids: list[str]) -> None:
    """What a trainer leaves: three consumed batches (events) and per-rank steps (trainer_steps)."""
    recorder = Recorder(bus, run_id, producer_id="trainer")
    steps = []
    for step in range(3):
        batch = trajectory_ids[step * 16 : (step + 1) * 16]
        recorder.batch_consumed(
            step, trainer_version=step + 1, trajectory_ids=batch, staleness=[step] * len(batch)
        )
        for rank in range(2):
            steps.append({
                "run_id": run_id, "step": step, "trainer_version": step + 1, "rank": rank, "loss": 0.5 - 0.1 * step,
                "entropy": 0.9 - 0.1 * step + 0.01 * rank, "mismatch": 0.01 + 0.015 * step + 0.002 * rank,
                "n_trajectories": 16, "created_at": dt.datetime.now(dt.UTC),
            })  # fmt: skip
    lake.append("trainer_steps", pa.Table.from_pylist(steps, schema=TRAINER_STEPS_SCHEMA))


SIGNAL_RUN = "signal-run"
ZERO_SIGNAL_PER_STEP = [0, 1, 3]
"""Of the 3 groups of 2 samples each step consumes, how many got equal rewards (1 and 1, or 0 and 0)."""


def build_signal_lake(root: Path) -> Lake:
    """A run whose trainer steps each consume 3 groups, ZERO_SIGNAL_PER_STEP[step] of them without signal."""
    lake = Lake(root)
    bus = InProcessBus(topic="signal", partitions=1)
    recorder = Recorder(bus, SIGNAL_RUN, vocab_size=64, producer_id="rollout")
    trainer = Recorder(bus, SIGNAL_RUN, producer_id="trainer")
    for step, n_zero in enumerate(ZERO_SIGNAL_PER_STEP):
        ids, advantages = [], []
        for g in range(3):
            rewards = [float(g % 2)] * 2 if g < n_zero else [1.0, 0.0]
            mean = sum(rewards) / len(rewards)
            for i, reward in enumerate(rewards):
                traj = recorder.start(f"task-{step}-{g}", f"group-{step}-{g}", i)
                traj.turn([5, 6], [-0.1, -0.2], step, input_token_ids=[1, 2])
                traj.reward(reward)
                traj.finish("completed")
                ids.append(traj.trajectory_id)
                advantages.append(reward - mean)  # Dr. GRPO: 0 for every sample of a zero-signal group
        trainer.batch_consumed(step, step + 1, ids, [0] * len(ids), advantages=advantages)
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    return lake


THIN_RUN = "thin-run"
THIN_SINGLES = 11
"""Version 0 of THIN_RUN: this many tasks of one failing sample each, and one task of six passing
samples (the issue's shape: pass@1 = 1/12 over twelve tasks, pass@4 = 1.0 from the one task of six)."""
THIN_V1_TASKS = 6
"""Version 1 of THIN_RUN: this many tasks of four samples, two of them passing."""


def build_thin_version_lake(root: Path) -> Lake:
    """THIN_RUN: a version whose only task with several samples is one large group, and a version
    where every task has four samples."""
    lake = Lake(root)
    bus = InProcessBus(topic="thin", partitions=1)
    recorder = Recorder(bus, THIN_RUN, vocab_size=64, producer_id="rollout")

    def play(version: int, task: str, rewards: list[float]) -> None:
        for i, reward in enumerate(rewards):
            traj = recorder.start(task, f"{task}-group", i)
            traj.turn([5, 6], [-0.1, -0.2], version, input_token_ids=[1, 2])
            traj.reward(reward)
            traj.finish("completed")

    for t in range(THIN_SINGLES):
        play(0, f"single-{t}", [0.0])
    play(0, "big", [1.0] * 6)
    for t in range(THIN_V1_TASKS):
        play(1, f"four-{t}", [1.0, 0.0, 1.0, 0.0])
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    return lake


def trajectories_in(lake) -> int:
    """What the overview counts: the run's trajectories that reached a policy version."""
    return (
        lake.sql(
            "select count(*) from trajectories where run_id = $run and policy_version_min is not null",
            {"run": RUN_ID},
        )
        .column(0)[0]
        .as_py()
    )


def append_trajectories(lake, n: int, seed: int, run_id: str = RUN_ID) -> None:
    """More trajectories through the real pipeline (loadgen → bus → sink): new Delta commits."""
    bus = InProcessBus(topic=f"more-{seed}", partitions=1)
    generate(
        bus,
        LoadgenConfig(trajectories=n, run_id=run_id, turns=2, prompt_tokens=8, output_tokens=4, seed=seed),
    )
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)


@pytest.fixture(scope="session")
def dash_lake(tmp_path_factory) -> Lake:
    """A run with trainer tables filled (shared, read-only: do not write to it)."""
    return build_lake(tmp_path_factory.mktemp("dash") / "lake")


@pytest.fixture(scope="session")
def bare_lake(tmp_path_factory) -> Lake:
    """A run without any trainer data: the trainer pages show their empty states."""
    return build_lake(tmp_path_factory.mktemp("bare") / "lake", trajectories=48, trainer=False)


@pytest.fixture(scope="session")
def two_runs_lake(tmp_path_factory, dash_lake: Lake) -> Lake:
    """Two runs with trainer tables in one lake (`dash-run`, then the newer, smaller `dash-run-b`)."""
    root = tmp_path_factory.mktemp("two") / "lake"
    shutil.copytree(dash_lake.root, root)  # dash_lake's run, then one more: dash_lake stays as it was
    return build_lake(root, trajectories=96, run_id=OTHER_RUN_ID)


@pytest.fixture(scope="session")
def signal_lake(tmp_path_factory) -> Lake:
    """A run with a known number of zero-signal groups per trainer step (read-only)."""
    return build_signal_lake(tmp_path_factory.mktemp("signal") / "lake")


@pytest.fixture(scope="session")
def thin_lake(tmp_path_factory) -> Lake:
    """THIN_RUN (read-only): version 0's pass@4 stands on one task of twelve."""
    return build_thin_version_lake(tmp_path_factory.mktemp("thin") / "lake")


MANY_VERSIONS = 12
"""Policy versions of `many_versions_lake`: more than a chart has colours for."""


@pytest.fixture(scope="session")
def many_versions_lake(tmp_path_factory) -> Lake:
    """A run over MANY_VERSIONS policy versions, with trainer tables (read-only)."""
    root = tmp_path_factory.mktemp("many") / "lake"
    return build_lake(root, trajectories=240, policy_versions=MANY_VERSIONS, group_size=4)
