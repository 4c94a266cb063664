"""The demo environment: small multi-turn tool-use tasks with verifiers and injected faults."""

from trajlake.rollout.envs.config import EnvConfig, FaultConfig
from trajlake.rollout.envs.episode import Episode, EpisodeResult, PolicyClient, run_episode
from trajlake.rollout.envs.tasks import Task, make_tasks, verify

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
