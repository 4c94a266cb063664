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
