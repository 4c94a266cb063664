"""Small lakes for the dashboard tests, built through the real pipeline (loadgen → bus → sink)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.rollout.recorder import Recorder
from trajlake.schemas.tables import TRAINER_STEPS_SCHEMA
from trajlake.store.lake import Lake

RUN_ID = "dash-run"


def build_lake(root: Path, trajectories: int = 160, trainer: bool = True, run_id: str = RUN_ID) -> Lake:
    """A lake with one loadgen run; with `trainer`, also consumed batches and trainer steps."""
    lake = Lake(root)
    bus = InProcessBus(partitions=2)
    config = LoadgenConfig(
        trajectories=trajectories, run_id=run_id, turns=4, prompt_tokens=48, output_tokens=24, env_tokens=16,
        policy_versions=4, group_size=8, vocab_size=4096, seed=7,
    )
    generate(bus, config)
    if trainer:
        add_trainer_events(lake, bus, run_id)
    DeltaSink(lake, bus, SinkConfig(max_latency_s=0.05)).run(until_idle_s=0.3)
    return lake


def add_trainer_events(lake: Lake, bus: InProcessBus, run_id: str) -> None:
    """What a trainer leaves behind: three consumed batches and per-rank steps with entropy and mismatch."""
    staging = InProcessBus(partitions=1)
    generate_ids = _trajectory_ids(bus)
    recorder = Recorder(bus, run_id, producer_id="trainer")
    steps = []
    now = dt.datetime.now(dt.UTC)
    for step in range(3):
        batch = generate_ids[step * 16 : (step + 1) * 16]
        recorder.batch_consumed(step, trainer_version=step + 1, trajectory_ids=batch, staleness=[step % 3] * len(batch))
        for rank in range(2):
            steps.append({
                "run_id": run_id, "step": step, "trainer_version": step + 1, "rank": rank, "loss": 0.5 - 0.1 * step,
                "entropy": 0.9 - 0.1 * step + 0.01 * rank, "mismatch": 0.01 + 0.015 * step + 0.002 * rank,
                "n_trajectories": 16, "created_at": now,
            })
    del staging
    lake.append("trainer_steps", pa.Table.from_pylist(steps, schema=TRAINER_STEPS_SCHEMA))


def _trajectory_ids(bus: InProcessBus) -> list[str]:
    """Trajectory ids already on the bus, in publishing order (message keys)."""
    seen: dict[str, None] = {}
    for log in bus._logs:
        for message in log:
            if message.key and message.key != RUN_ID and message.key.count("-") >= 4:
                seen.setdefault(message.key)
    return list(seen)
