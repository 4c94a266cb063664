"""Errors of the trainer stage; each carries its facts and says the fix."""

from __future__ import annotations

from trajlake.schemas.errors import TrajlakeError


class TrainerError(TrajlakeError, RuntimeError):
    """A trainer-side failure."""


class LeaseLostError(TrainerError):
    """A batch's lease expired and another rank took some of its trajectories before commit."""

    def __init__(self, message: str, *, run_id: str, trajectory_ids: list[str]) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.trajectory_ids = trajectory_ids


class MegatronUnavailableError(TrainerError):
    """megatron-core (or a GPU) is not available for the Megatron adapter."""


class TrainerVersionError(TrainerError, ValueError):
    """The trainer version a batch was asked for is not a policy version (an int >= 0)."""

    def __init__(self, *, run_id: str, trainer_version: object) -> None:
        super().__init__(
            f"trainer_version must be the policy version the trainer is about to train, an int >= 0 "
            f"(got {trainer_version!r} for run {run_id!r}); a run no trainer has published to yet has no "
            f"rows in policy_versions: start from the newest version its rollouts recorded "
            f"(max(policy_version_max) of trajectories), or 0"
        )
        self.run_id = run_id
        self.trainer_version = trainer_version
