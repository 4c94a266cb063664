"""The demo environment: small multi-turn tool-use tasks with verifiers and injected faults."""

from trajlake.demo.envs.config import EnvConfig, FaultConfig
from trajlake.demo.envs.episode import Episode, EpisodeResult, PolicyClient, run_episode
from trajlake.demo.envs.tasks import Task, make_tasks, verify

__all__ = [
    "EnvConfig",
    "Episode",
    "EpisodeResult",
    "FaultConfig",
    "PolicyClient",
    "Task",
    "make_tasks",
    "run_episode",
    "verify",
]
