"""The sandbox interface, its factory, and a helper that turns a sandbox into a tool."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from trajlake.common.threads import DeadlineExceeded, call_with_deadline
from trajlake.rollout.config import SandboxConfig
from trajlake.rollout.errors import SandboxTimeout

T = TypeVar("T")


@dataclass
class ExecResult:
    """What one command in a sandbox did."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Sandbox(abc.ABC):
    """An isolated place to run commands; every stage (create, exec, terminate) has a timeout."""

    def __init__(self, config: SandboxConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def exec(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        """Run a shell command; a timeout kills it and returns `timed_out=True`."""

    @abc.abstractmethod
    def terminate(self) -> None:
        """Tear the sandbox down (idempotent); raise `SandboxTimeout` if that hangs."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()


def with_deadline(stage: str, timeout_s: float, fn: Callable[[], T]) -> T:
    """Run a blocking call in a helper thread; raise `SandboxTimeout(stage=…)` past `timeout_s`.

    Remote APIs (Modal) can hang on a dead connection; the caller must get control back.
    """
    try:
        return call_with_deadline(fn, timeout_s, name=f"sandbox-{stage}")
    except DeadlineExceeded:
        raise SandboxTimeout(f"sandbox {stage} took longer than {timeout_s:g}s", stage=stage) from None


def setup_sandbox(config: SandboxConfig | None = None, **kwargs: Any) -> Sandbox:
    """Build the sandbox backend named by `config.type`."""
    config = config or SandboxConfig()
    if config.type == "modal":
        from trajlake.rollout.sandbox.modal import ModalSandbox

        return ModalSandbox(config, **kwargs)
    from trajlake.rollout.sandbox.local import LocalSandbox

    return LocalSandbox(config, **kwargs)


def sandbox_tool(sandbox: Sandbox, name: str = "bash", *, timeout_s: float | None = None) -> Any:
    """A code-execution `Tool` that runs `command` in `sandbox` (a timeout kills the process)."""
    from trajlake.rollout.tools import Tool

    def run(command: str) -> str:
        result = sandbox.exec(command, timeout_s=timeout_s)
        if result.timed_out:
            raise SandboxTimeout(
                f"command timed out after {timeout_s or sandbox.config.exec_timeout_s:g}s", stage="exec"
            )
        out = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
        return out if result.exit_code == 0 else f"{out}\n[exit code {result.exit_code}]"

    # the runner's own timeout is a backstop a little after the sandbox's, which kills the process
    backstop = (timeout_s or sandbox.config.exec_timeout_s) + 5.0
    return Tool(name, run, is_code_execution=True, timeout_s=backstop, description="Run a shell command.")
