"""A Harbor 0.25 environment that runs a trial's commands as host subprocesses in a scratch dir.

For machines without a container runtime (no Docker daemon: CI runners, this project's test
machines). Harbor loads it by import path, never trajlake; this module imports harbor at its top
and nothing in trajlake imports it:

    EnvironmentConfig(import_path="trajlake.rollout.adapters.harbor_host:HostEnvironment")
    # the CLI: harbor run --env trajlake.rollout.adapters.harbor_host:HostEnvironment ...

It is not a sandbox: commands run as the calling user, on the host, with its network and
tools (terminus-2 needs `tmux` on PATH). Each environment gets a fresh scratch directory that
stands in for the container's `/`: the absolute environment paths Harbor and its agents name in
commands (`/logs`, `/tests`, `/solution`, `/runtime`, `/app`, `/installed-agent`) are rewritten
to it, and uploads and downloads go there. Only the commands Harbor sends are rewritten, not
the scripts they run: a task's `tests/test.sh` must name its reward file relative to itself
(`$(dirname "$0")/../logs/verifier/reward.txt`), which is the same file in a container. The
task's Dockerfile is not built; the task's `WORKDIR` is assumed to be `/app`.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

ENVIRONMENT_ROOTS = ("logs", "tests", "solution", "runtime", "app", "installed-agent")
PRECREATED = ("logs/agent", "logs/verifier", "logs/artifacts", "tests", "app")  # what a task image has
WORKDIR = "/app"
# an absolute path whose first part is one of the roots, not inside another path or word
_ABSOLUTE = re.compile(r"(?<![\w./~$-])/(" + "|".join(map(re.escape, ENVIRONMENT_ROOTS)) + r")(?=/|\b|$)")


class HostEnvironment(BaseEnvironment):
    """Runs commands with `bash -c` on the host, environment paths mapped into a scratch dir."""

    @staticmethod
    def type() -> str:
        return "trajlake-host"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        """Nothing to validate: the task's Dockerfile is not built."""

    # -- paths -----------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        """The scratch directory standing in for the environment's `/` (made on first use)."""
        if getattr(self, "_root", None) is None:
            self._root = Path(tempfile.mkdtemp(prefix=f"harbor-host-{self.session_id[:40]}-"))
            for name in PRECREATED:
                (self._root / name).mkdir(parents=True)
        return self._root

    def host_path(self, path: str | os.PathLike[str]) -> Path:
        """Where an environment path lives on the host (relative paths are under `/app`)."""
        text = str(path)
        if not text.startswith("/"):
            text = f"{WORKDIR}/{text}"
        return self.root / text.lstrip("/")

    def map_command(self, command: str) -> str:
        """`command` with its environment paths rewritten to the scratch dir."""
        return _ABSOLUTE.sub(lambda m: f"{self.root}/{m.group(1)}", command)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self, force_build: bool) -> None:
        self.root  # noqa: B018 - make the scratch dir

    async def stop(self, delete: bool) -> None:
        root = getattr(self, "_root", None)
        if root is None:
            return
        # the tmux server terminus-2 started lives on a socket under the scratch dir
        await self.exec("tmux kill-server 2>/dev/null || true", timeout_sec=10)
        if delete:
            shutil.rmtree(root, ignore_errors=True)
            self._root = None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run `command` with bash in the scratch dir; `user` is ignored (no user switching on the host)."""
        environ = {**os.environ, **(self._merge_env(env) or {}), "TMUX_TMPDIR": str(self.root)}
        workdir = self.host_path(cwd or WORKDIR)
        workdir.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            "bash", "-c", self.map_command(command), cwd=workdir, env=environ,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_sec)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the command and its children
            out, err = await proc.communicate()
            return ExecResult(stdout=out.decode(errors="replace"), stderr=f"timed out after {timeout_sec} s",
                              return_code=124)  # fmt: skip
        return ExecResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            return_code=proc.returncode or 0,
        )

    # -- files -----------------------------------------------------------------------------
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = self.host_path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_path, target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        shutil.copytree(source_dir, self.host_path(target_dir), dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.host_path(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        shutil.copytree(self.host_path(source_dir), target_dir, dirs_exist_ok=True)
