"""What Linux says of a process by its pid (`/proc`), for the starters that track the servers they ran."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (state first: "Z" is a zombie), or None when
    no such process is there."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def is_zombie(pid: int) -> bool:
    """Whether `pid` has exited and waits for its parent to reap it (it still answers kill(pid, 0))."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] == "Z"


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of process `pid` so far, None when unknown."""
    stat = proc_stat(pid) if pid is not None else None
    return None if stat is None else (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
