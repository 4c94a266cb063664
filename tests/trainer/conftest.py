"""Helpers for the trainer tests: record small, hand-specified runs into a lake."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from trajlake.ingest.recorder import Recorder


@dataclass
class Spec:
    """One trajectory to record: group, reward, policy version, outcome and turns."""

    group: str
    reward: float | None = 1.0
    version: int | None = 0  # None: recorded without a version (unknown)
    status: str = "completed"
    origin: str | None = None
    finished: bool = True
    prompt: list[int] = field(default_factory=lambda: [1, 2, 3])
    outputs: list[list[int]] = field(default_factory=lambda: [[4, 5]])
    env: list[int] = field(default_factory=lambda: [6])


def record(recorder: Recorder, spec: Spec, index: int = 0) -> str:
    """Record one trajectory; return its id. Logprob of output token k is -(k+1)/10."""
    traj = recorder.start(task_id=f"task-{spec.group}", group_id=spec.group, sample_index=index)
    for turn, out in enumerate(spec.outputs):
        appended = spec.prompt if turn == 0 else spec.env
        traj.turn(out, [-(k + 1) / 10 for k in range(len(out))], spec.version, input_token_ids=appended)
    if not spec.finished:
        traj.flush()
        return traj.trajectory_id
    if spec.reward is not None or spec.origin == "system":
        traj.reward(spec.reward)
    traj.finish(spec.status, failure_origin=spec.origin)
    return traj.trajectory_id


@pytest.fixture
def spec() -> type[Spec]:
    """The `Spec` class (test modules cannot import conftest under --import-mode=importlib)."""
    return Spec


@pytest.fixture
def make_run(bus, drain) -> Callable[..., dict[str, list[str]]]:
    """Record specs on the bus under `run_id`, drain into the lake; return ids by group."""

    def _make(specs: list[Spec], run_id: str = "run-t") -> dict[str, list[str]]:
        """Record `specs` and drain them into the lake."""
        recorder = Recorder(bus, run_id, vocab_size=100)
        ids: dict[str, list[str]] = {}
        for i, spec in enumerate(specs):
            ids.setdefault(spec.group, []).append(record(recorder, spec, i))
        drain()
        return ids

    return _make
