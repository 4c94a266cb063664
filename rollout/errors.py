"""Domain errors of the rollout toolkit; an inference error says whether a retry can help."""

from __future__ import annotations

from trajlake.schemas.errors import TrajlakeError


class RolloutError(TrajlakeError, RuntimeError):
    """Base class of rollout toolkit errors."""


class InferenceError(RolloutError):
    """The inference server failed a request (after retries, if it was retryable)."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retryable = retryable
        self.retry_after_s = retry_after_s  # the server's Retry-After: when a retry may succeed


class InferenceResponseError(RolloutError):
    """The server answered, but not in the vLLM format the client follows (terminal)."""


class Cancelled(RolloutError):
    """The caller cancelled the request (its `threading.Event` was set)."""


class SandboxError(RolloutError):
    """A sandbox could not be created, run a command, or be terminated."""

    def __init__(self, message: str, *, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


class SandboxTimeout(SandboxError):
    """A sandbox stage (create, exec, terminate) ran past its timeout."""


class JudgeError(RolloutError):
    """Every API key of the LLM judge failed or stayed rate-limited past the retry budget."""

    def __init__(self, message: str, *, attempts: int) -> None:
        super().__init__(message)
        self.attempts = attempts


class ImportFormatError(RolloutError):
    """An input file of an importer is not in the upstream format it claims to be."""

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
