"""Failure taxonomy: every failure is the system's or the model's, with a label (docs/design.md#failure-taxonomy).

System failures (infra, harness bugs, broken verifiers, missing dependencies) are never
trained as reward 0; model failures (context exhausted, max turns, wrong answers) are
legitimate training signal. When in doubt a failure is the system's: treating a harness
bug as a model failure poisons the reward, the opposite merely drops one sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajlake.schemas.events import FAILURE_LABELS, FAILURE_ORIGINS, STATUSES

SYSTEM, MODEL = "system", "model"
MODEL_CAPABILITY, TOOL_DESIGN, HARNESS_BEHAVIOR = "model_capability", "tool_design", "harness_behavior"
ENV_DEPENDENCY, VERIFIER_ERROR, INFRA = "env_dependency", "verifier_error", "infra"


@dataclass(frozen=True)
class Failure:
    """How a trajectory ended: its status, who is to blame, why, and whether its reward counts."""

    status: str
    origin: str | None
    label: str | None
    reward_valid: bool = True

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
        assert self.origin is None or self.origin in FAILURE_ORIGINS, self.origin
        assert self.label is None or self.label in FAILURE_LABELS, self.label


COMPLETED = Failure("completed", None, None)
CONTEXT_EXHAUSTED = Failure("context_exhausted", MODEL, MODEL_CAPABILITY)
MAX_TURNS = Failure("max_turns", MODEL, MODEL_CAPABILITY)
AGENT_TIMEOUT = Failure("timeout", MODEL, MODEL_CAPABILITY)
VERIFIER_FAILED = Failure("error", SYSTEM, VERIFIER_ERROR, reward_valid=False)
INFRA_FAILED = Failure("error", SYSTEM, INFRA, reward_valid=False)
ENV_FAILED = Failure("error", SYSTEM, ENV_DEPENDENCY, reward_valid=False)
HARNESS_FAILED = Failure("error", SYSTEM, HARNESS_BEHAVIOR, reward_valid=False)
TOOL_BROKEN = Failure("error", SYSTEM, TOOL_DESIGN, reward_valid=False)
MALFORMED_TOOL_CALLS = Failure("error", MODEL, TOOL_DESIGN)
WORKER_CRASHED = Failure("error", SYSTEM, INFRA, reward_valid=False)

# Exception type names (Harbor, LiteLLM, OpenAI, httpx, this package) -> failure. Matched on
# the class name so that importers can classify exceptions recorded as text.
_BY_NAME: dict[str, Failure] = {
    # the model ran out of room or time
    "ContextLengthExceededError": CONTEXT_EXHAUSTED,
    "ContextLengthExceeded": CONTEXT_EXHAUSTED,
    "ContextWindowExceededError": CONTEXT_EXHAUSTED,
    "OutputLengthExceededError": CONTEXT_EXHAUSTED,
    "MaxTurnsExceededError": MAX_TURNS,
    "AgentTimeoutError": AGENT_TIMEOUT,
    # the verifier could not score the attempt: no valid reward
    "RewardFileNotFoundError": VERIFIER_FAILED,
    "RewardFileEmptyError": VERIFIER_FAILED,
    "VerifierOutputParseError": VERIFIER_FAILED,
    "VerifierTimeoutError": VERIFIER_FAILED,
    "CopyTestsDirError": VERIFIER_FAILED,
    "AddTestsDirError": VERIFIER_FAILED,
    "DownloadVerifierDirError": VERIFIER_FAILED,
    "JudgeError": VERIFIER_FAILED,
    # the environment never came up
    "EnvironmentStartTimeoutError": ENV_FAILED,
    "DockerStartupError": ENV_FAILED,
    "AgentSetupTimeoutError": ENV_FAILED,
    "ModuleNotFoundError": ENV_FAILED,
    # infrastructure
    "RateLimitError": INFRA_FAILED,
    "APIConnectionError": INFRA_FAILED,
    "APITimeoutError": INFRA_FAILED,
    "ServiceUnavailableError": INFRA_FAILED,
    "InternalServerError": INFRA_FAILED,
    "InferenceError": INFRA_FAILED,
    "ConnectError": INFRA_FAILED,
    "ReadTimeout": INFRA_FAILED,
    "ConnectTimeout": INFRA_FAILED,
    "ClientConnectorError": INFRA_FAILED,  # aiohttp (SkyRL's RemoteInferenceClient): the engine unreachable
    "ServerDisconnectedError": INFRA_FAILED,
    "ClientOSError": INFRA_FAILED,
    "SandboxError": INFRA_FAILED,
    "SandboxTimeout": INFRA_FAILED,
    "WorkerCrashedError": WORKER_CRASHED,
    "WorkerDiedError": WORKER_CRASHED,
    "OutOfMemoryError": INFRA_FAILED,
    # the harness itself broke
    "NonZeroAgentExitCodeError": HARNESS_FAILED,
    "RecorderError": HARNESS_FAILED,
}

_BY_MESSAGE: tuple[tuple[str, Failure], ...] = (
    ("maximum context length", CONTEXT_EXHAUSTED),
    ("context length", CONTEXT_EXHAUSTED),
    ("context_length_exceeded", CONTEXT_EXHAUSTED),
    ("rate limit", INFRA_FAILED),
    ("429", INFRA_FAILED),
    ("reward file", VERIFIER_FAILED),
)


def classify_exception_name(exception_type: str | None, message: str | None = None) -> Failure:
    """The failure an exception stands for, by class name, then message; unknown ones are harness faults."""
    if exception_type and exception_type in _BY_NAME:
        return _BY_NAME[exception_type]
    text = (message or "").lower()
    for needle, failure in _BY_MESSAGE:
        if needle in text:
            return failure
    return HARNESS_FAILED


def classify_exception(exc: BaseException) -> Failure:
    """The failure an exception raised in an agent loop stands for (its class hierarchy is checked)."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _BY_NAME:
            return _BY_NAME[cls.__name__]
    if isinstance(exc, TimeoutError):
        return INFRA_FAILED
    if isinstance(exc, (ConnectionError, MemoryError)):
        return INFRA_FAILED
    return classify_exception_name(type(exc).__name__, str(exc))


def classify_tool_error(error_type: str, *, is_code_execution: bool = False) -> tuple[str, str]:
    """(origin, label) of one failed tool call, by its `error_type` (see `ToolResult`)."""
    if error_type == "malformed_call":
        return MODEL, TOOL_DESIGN  # the model did not follow the tool's schema
    if error_type == "timeout":
        # code the model wrote may loop forever; any other tool hanging is the environment's fault
        return (MODEL, MODEL_CAPABILITY) if is_code_execution else (SYSTEM, ENV_DEPENDENCY)
    if error_type in ("sandbox_crash", "infra"):
        return SYSTEM, INFRA
    if error_type == "tool_error":
        return (MODEL, MODEL_CAPABILITY) if is_code_execution else (SYSTEM, TOOL_DESIGN)
    return SYSTEM, HARNESS_BEHAVIOR
