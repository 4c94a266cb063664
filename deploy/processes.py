"""The stack's own processes (sinks, projector, dashboard): started detached in a session of their
own, recorded with their start time, so a later `down` signals exactly them and never a process
that reused a pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trajlake.common.procs import proc_stat
from trajlake.common.retry import wait_until

TRAJLAKE = (sys.executable, "-c", "from trajlake.cli import run; run()")
"""The `trajlake` command, run by this interpreter (the console script may be elsewhere or absent)."""


@dataclass(frozen=True)
class Process:
    """One started `trajlake` command: its name in the stack, pid, kernel start time and log."""

    name: str
    pid: int
    started: int
    """Field 22 of /proc/<pid>/stat (clock ticks since boot): a reused pid has another."""
    log: str
    url: str | None = None

    def is_alive(self) -> bool:
        """Whether the process started as this record still runs (not a zombie, not a reused pid)."""
        stat = proc_stat(self.pid)
        return stat is not None and stat[0] != "Z" and int(stat[19]) == self.started

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM its process group (a command and the children it started), SIGKILL after
        `timeout_s`; return whether it was running."""
        if not self.is_alive():
            return False
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)  # its own session: the group is its id
            if wait_until(
                lambda: not self.is_alive() and not _group_alive(self.pid), timeout_s=wait_s, interval_s=0.1
            ):
                break
        return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return any(
        (stat := proc_stat(int(p.name))) is not None and int(stat[2]) == pgid and stat[0] != "Z"
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
    )


def launch(name: str, args: list[str], env: Mapping[str, str], log: Path, url: str | None = None) -> Process:
    """Start `trajlake ARGS` (this interpreter's) detached, its output appended to `log`."""
    with open(log, "ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [*TRAJLAKE, *args], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **env},
        )  # fmt: skip
    stat = proc_stat(proc.pid)
    return Process(name, proc.pid, int(stat[19]) if stat else 0, str(log), url)
