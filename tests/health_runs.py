"""Synthetic runs for the health signals: one healthy run and one run per pathology, each recorded
through the real pipeline (Recorder → InProcessBus → DeltaSink) plus the trainer's `trainer_steps`.

Every run has STEPS steps; rollouts of policy version v are consumed by step v. A sick run is
healthy until ONSET, which starts a window (windows of 5), so its alert must name ONSET.

`learns-tools` is healthy the way the demo is: reward rises as the agent learns to call a tool
(a long turn) before it answers, so reward rises with turns and output tokens, yet among samples
that took as many turns it does not follow length. `tools-then-length` is the same run with a
reward hack planted at ONSET: from there the reward follows the answer's length alone.
"""

from __future__ import annotations

import datetime as dt
import random
import statistics
from pathlib import Path

import pyarrow as pa

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.schemas.tables import TRAINER_STEPS_SCHEMA
from trajlake.store.lake import Lake

STEPS = 20
ONSET = 10
GROUPS, SAMPLES = 2, 8
PATHOLOGIES = {
    "entropy": "entropy_collapse",
    "mismatch": "mismatch_acceleration",
    "length": "reward_length",
    "advantage": "advantage_drift",
    "no-signal": "advantage_drift",
    "tools": "tool_error_spike",
    "garbled": "garbled_output",
    "tools-then-length": "reward_length",
}
"""Run id → the signal its pathology must raise (the healthy runs are `healthy` and `learns-tools`)."""
HEALTHY = ("healthy", "learns-tools")


def build_health_lake(root: Path) -> Lake:
    """A lake with the run `healthy`, every run of PATHOLOGIES, and `no-advantages` (a trainer that kept none)."""
    lake = Lake(root)
    bus = InProcessBus(partitions=2)
    rows = []
    for seed, run_id in enumerate([*HEALTHY, "no-advantages", *PATHOLOGIES]):
        rows += record_run(bus, run_id, seed)
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.0)
    lake.append("trainer_steps", pa.Table.from_pylist(rows, schema=TRAINER_STEPS_SCHEMA))
    return lake


def record_run(bus: InProcessBus, run_id: str, seed: int) -> list[dict]:
    """Record the rollouts and consumed batches of one run; return its trainer_steps rows."""
    rng = random.Random(seed)
    rollouts = Recorder(bus, run_id, flush_each_turn=False)
    trainer = Recorder(bus, run_id, producer_id="trainer")
    steps = []
    for step in range(STEPS):
        sick = run_id if step >= ONSET else None
        ids, advantages = [], []
        for group in range(GROUPS):
            rewards = []
            for sample in range(SAMPLES):
                if run_id in ("learns-tools", "tools-then-length"):
                    hacked = sick == "tools-then-length"
                    trajectory_id, reward = record_tool_learner(rollouts, rng, step, group, sample, hacked)
                else:
                    trajectory_id, reward = record_trajectory(rollouts, rng, step, group, sample, sick)
                ids.append(trajectory_id)
                rewards.append(reward)
            advantages += group_advantages(rewards, sick)
        kept = None if run_id == "no-advantages" else advantages
        trainer.batch_consumed(step, step + 1, ids, [0] * len(ids), kept)
        steps.append(trainer_step(run_id, step, rng, sick))
    return steps


def record_trajectory(
    rec: Recorder, rng: random.Random, version: int, group: int, sample: int, sick: str | None
) -> tuple[str, float]:
    """One trajectory of 1–3 turns with a tool call between turns; returns its id and reward."""
    n_turns = rng.randint(1, 3)
    error_rate = 0.7 if sick == "tools" else 0.1
    with rec.start(f"task-{group}", f"g{version}-{group}", sample, environment="synthetic") as traj:
        n_tokens = 0
        for turn in range(n_turns):
            length = rng.randint(20, 100) if sick == "length" else rng.randint(16, 32)
            if sick == "garbled":
                out = [7, 8, 9] * (length // 3)
            else:
                out = [rng.randrange(2, 1000) for _ in range(length)]
            n_tokens += len(out)
            inputs = [rng.randrange(2, 1000) for _ in range(8)]
            traj.turn(out, [-rng.uniform(0.5, 1.5) for _ in out], version, input_token_ids=inputs)
            if turn < n_turns - 1:
                call = traj.tool_call("search", {"query": "q"})
                ok = rng.random() >= error_rate
                traj.tool_result(call, "search", ok=ok, error_type=None if ok else "tool_error")
        reward = float(n_tokens > 90) if sick == "length" else float(rng.random() < 0.3)
        traj.reward(reward)
        traj.finish("completed")
    return traj.trajectory_id, reward


def record_tool_learner(
    rec: Recorder, rng: random.Random, version: int, group: int, sample: int, hacked: bool
) -> tuple[str, float]:
    """An agent learning to call a tool (a 28–36-token turn) before a short answer, which is what
    scores; `hacked`: the answer's length alone decides the reward."""
    calls_tool = rng.random() < min(0.9, 0.1 + 0.05 * version)
    answer = rng.randint(8, 60) if hacked else rng.randint(8, 12)
    with rec.start(f"task-{group}", f"g{version}-{group}", sample, environment="synthetic") as traj:
        for out_len, is_call in ([(rng.randint(28, 36), True)] if calls_tool else []) + [(answer, False)]:
            out = [rng.randrange(2, 1000) for _ in range(out_len)]
            traj.turn(out, [-rng.uniform(0.5, 1.5) for _ in out], version, input_token_ids=[1, 2, 3])
            if is_call:
                call = traj.tool_call("search", {"query": "q"})
                ok = rng.random() >= 0.1
                traj.tool_result(call, "search", ok=ok, error_type=None if ok else "tool_error")
        reward = float(answer > 34) if hacked else float(rng.random() < (0.9 if calls_tool else 0.1))
        traj.reward(reward)
        traj.finish("completed")
    return traj.trajectory_id, reward


def group_advantages(rewards: list[float], sick: str | None) -> list[float]:
    """Group-normalised advantages; `advantage`: the raw reward (no baseline); `no-signal`: all 0."""
    if sick == "advantage":
        return list(rewards)
    if sick == "no-signal":
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / std if std else 0.0 for r in rewards]


def trainer_step(run_id: str, step: int, rng: random.Random, sick: str | None) -> dict:
    """The trainer's row: entropy slowly falling, mismatch flat, unless the run is sick there."""
    entropy = 1.0 - 0.004 * step + rng.uniform(-0.02, 0.02)
    mismatch = 0.01 + rng.uniform(-0.002, 0.002)
    if sick == "entropy":
        entropy = 0.6 ** (step - ONSET + 1)
    if sick == "mismatch":
        mismatch = 0.01 * 2 ** (step - ONSET + 1)
    return {"run_id": run_id, "step": step, "trainer_version": step + 1, "rank": 0, "entropy": entropy,
            "mismatch": mismatch, "n_trajectories": GROUPS * SAMPLES, "created_at": dt.datetime.now(dt.UTC)}  # fmt: skip
