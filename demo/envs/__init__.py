"""The demo environment: small multi-turn tool-use tasks with verifiers and injected faults."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajlake.demo.envs.config import EnvConfig, FaultConfig
    from trajlake.demo.envs.episode import Episode, EpisodeResult, PolicyClient, run_episode
    from trajlake.demo.envs.tasks import Task, make_tasks, verify

_HOME = {
    "EnvConfig": "config", "FaultConfig": "config", "Episode": "episode", "EpisodeResult": "episode",
    "PolicyClient": "episode", "run_episode": "episode", "Task": "tasks", "make_tasks": "tasks", "verify": "tasks",
}  # fmt: skip

__all__ = [
    "EnvConfig", "Episode", "EpisodeResult", "FaultConfig", "PolicyClient", "Task", "make_tasks",
    "run_episode", "verify",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    # loaded on first use, so settings models (`EnvConfig`) import without the episode machinery
    if name not in _HOME:
        raise AttributeError(f"module 'trajlake.demo.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trajlake.demo.envs.{_HOME[name]}"), name)
