"""Local sandbox: each command is a subprocess in its own session and working directory."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping

from trajlake.rollout.config import SandboxConfig
from trajlake.rollout.errors import SandboxError
from trajlake.rollout.sandbox.base import ExecResult, Sandbox


class LocalSandbox(Sandbox):
    """Runs commands with `bash -c` in a private temp directory; a timeout kills the process group."""

    def __init__(self, config: SandboxConfig | None = None, *, env: Mapping[str, str] | None = None) -> None:
        super().__init__(config or SandboxConfig())
        self._owned = self.config.workdir is None
        self.workdir = self.config.workdir or tempfile.mkdtemp(prefix="trajlake-sandbox-")
        self.env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": self.workdir, **(env or {})}
        self.terminated = False

    def exec(self, command: str, *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        if self.terminated:
            raise SandboxError("the sandbox is terminated; create a new one", stage="exec")
        timeout = timeout_s or self.config.exec_timeout_s
        started = time.monotonic()
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.workdir,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, so a timeout kills children too
        )
        try:
            stdout, stderr = proc.communicate(stdin, timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            timed_out = True
        return ExecResult(proc.returncode, stdout, stderr, timed_out, time.monotonic() - started)

    def terminate(self) -> None:
        if self.terminated:
            return
        self.terminated = True
        if self._owned:
            shutil.rmtree(self.workdir, ignore_errors=True)
