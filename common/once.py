"""Build something once per machine, however many processes ask for it at the same time."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def first_to_build(done: Path, lock: Path) -> Iterator[bool]:
    """Whether this process must build what `done` marks: False once it exists; else True, with an
    exclusive lock on `lock` held for the block (a process that built it meanwhile went first)."""
    if done.exists():
        yield False
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield not done.exists()
