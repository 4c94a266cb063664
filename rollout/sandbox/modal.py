"""Modal sandbox: `modal.Sandbox.create`, `sandbox.exec`, `sandbox.terminate`, each under a timeout.

Modal's calls block on the network; each one runs under `with_deadline`, so a hung call
becomes a `SandboxTimeout` naming the stage instead of a stuck agent loop. Modal also gets
its own limits (`timeout=` on create and exec) so the remote side stops too.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

from trajlake.rollout.config import SandboxConfig
from trajlake.rollout.errors import SandboxError, SandboxTimeout
from trajlake.rollout.sandbox.base import ExecResult, Sandbox, with_deadline

EXEC_SLACK_S = 2.0
"""How long past its own limit a Modal exec may take before the local deadline gives up on it."""


def _import_modal() -> ModuleType:
    try:
        import modal
    except ImportError as err:
        raise SandboxError("the modal backend needs `pip install trajlake[modal]`", stage="create") from err
    return modal


class ModalSandbox(Sandbox):
    """A Modal sandbox created on construction; `modal_module` lets tests inject a stand-in."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        modal_module: ModuleType | Any | None = None,
        exec_slack_s: float = EXEC_SLACK_S,
    ) -> None:
        super().__init__(config or SandboxConfig(type="modal"))
        self.modal = modal_module or _import_modal()
        self.exec_slack_s = exec_slack_s
        self.terminated = False
        self.sandbox = with_deadline("create", self.config.create_timeout_s, self._create)

    def _create(self) -> Any:
        app = self.modal.App.lookup(self.config.app_name, create_if_missing=True)
        image = self.modal.Image.from_registry(self.config.image)
        kwargs: dict[str, Any] = {
            "app": app,
            "image": image,
            "timeout": int(self.config.create_timeout_s + 3600),
        }
        if self.config.workdir:
            kwargs["workdir"] = self.config.workdir
        return self.modal.Sandbox.create(**kwargs)

    def exec(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        if self.terminated:
            raise SandboxError("the sandbox is terminated; create a new one", stage="exec")
        timeout = timeout_s or self.config.exec_timeout_s
        started = time.monotonic()

        def run() -> ExecResult:
            process = self.sandbox.exec("bash", "-c", command, timeout=max(1, int(timeout)))
            if stdin is not None:
                process.stdin.write(stdin.encode())
                process.stdin.write_eof()
                process.stdin.drain()
            code = process.wait()
            code = process.returncode if code is None else code
            return ExecResult(
                code, process.stdout.read(), process.stderr.read(), False, time.monotonic() - started
            )

        try:
            # a little slack over Modal's own limit, which should fire first and kill the process
            return with_deadline("exec", timeout + self.exec_slack_s, run)
        except SandboxTimeout:
            return ExecResult(-1, "", f"timed out after {timeout:g}s", True, time.monotonic() - started)

    def terminate(self) -> None:
        if self.terminated:
            return
        self.terminated = True
        with_deadline("terminate", self.config.terminate_timeout_s, self.sandbox.terminate)
