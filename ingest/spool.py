"""A disk spool for messages the producer could not deliver: append-only files, read in order.

Each record is `len(meta) len(value) meta value` (big-endian u32 lengths; meta is JSON with
the key and headers). A torn record at the end of a file (a crash mid-write) is ignored.
A spool file is held with an exclusive lock, so a restarted producer can take over the
files a dead one left behind and deliver them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import struct
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from trajlake.ingest.bus.base import Message
from trajlake.schemas.errors import TrajlakeError

_LEN = struct.Struct(">II")


class SpoolFull(TrajlakeError, RuntimeError):
    """The spool reached its byte limit while the broker stayed unreachable; raise spool_max_bytes."""


class Spool:
    """FIFO of undelivered messages on disk, shared by the producer's threads."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._files: list[tuple[Path, IO[bytes]]] = []  # oldest first, each locked by us
        self._writer: IO[bytes] | None = None
        self._read_pos: int = 0  # offset into the oldest file
        self.messages = 0
        self.bytes = 0
        self.spooled_total = 0
        self.delivered_total = 0
        self._adopt_orphans()

    def _adopt_orphans(self) -> None:
        if not self.directory.exists():
            return
        for path in sorted(self.directory.glob("spool-*.bin")):
            handle = open(path, "r+b")  # noqa: SIM115 - kept open to hold the lock
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()  # a live producer owns it
                continue
            count = sum(1 for _ in _records(handle, 0))
            if count == 0:
                handle.close()
                path.unlink(missing_ok=True)
                continue
            self._files.append((path, handle))
            self.messages += count
            self.bytes += path.stat().st_size

    def __len__(self) -> int:
        return self.messages

    def put(self, message: Message) -> None:
        """Append one message."""
        meta = json.dumps({"k": message.key, "h": message.headers}).encode()
        record = _LEN.pack(len(meta), len(message.value)) + meta + message.value
        with self._lock:
            if self.bytes + len(record) > self.max_bytes:
                raise SpoolFull(
                    f"the spool in {self.directory} holds {self.bytes} bytes (limit {self.max_bytes}); "
                    "the broker has been unreachable too long: fix the connection or raise "
                    "spool_max_bytes (TRAJLAKE_KAFKA_SPOOL_MAX_BYTES)"
                )
            if self._writer is None:
                self.directory.mkdir(parents=True, exist_ok=True)
                path = self.directory / f"spool-{uuid.uuid4().hex}.bin"
                self._writer = open(path, "a+b")  # noqa: SIM115 - closed when drained; appends whatever readers seek
                fcntl.flock(self._writer, fcntl.LOCK_EX)
                self._files.append((path, self._writer))
            self._writer.write(record)
            self._writer.flush()
            self.messages += 1
            self.bytes += len(record)
            self.spooled_total += 1

    def peek(self, limit: int) -> list[tuple[Message, int]]:
        """Up to `limit` oldest messages with their record sizes, without removing them."""
        with self._lock:
            out: list[tuple[Message, int]] = []
            pos = self._read_pos
            for path_handle in self._files:
                handle = path_handle[1]
                for message, size in _records(handle, pos):
                    out.append((message, size))
                    if len(out) >= limit:
                        return out
                pos = 0
            return out

    def pop(self, sizes: list[int]) -> None:
        """Remove the oldest `len(sizes)` messages (delivered), deleting drained files."""
        with self._lock:
            for size in sizes:
                handle = self._files[0][1]
                self._read_pos += size
                self.messages -= 1
                self.bytes -= size
                self.delivered_total += 1
                handle.seek(0, 2)
                if self._read_pos >= handle.tell():
                    self._drop_oldest()
            if self.messages == 0:
                while self._files:
                    self._drop_oldest()

    def _drop_oldest(self) -> None:
        path, handle = self._files.pop(0)
        if handle is self._writer:
            self._writer = None
        handle.close()
        path.unlink(missing_ok=True)
        self._read_pos = 0

    def close(self) -> None:
        """Close files; what is left stays on disk for the next producer."""
        with self._lock:
            for _, handle in self._files:
                with contextlib.suppress(OSError):
                    handle.close()
            self._files.clear()
            self._writer = None


def _records(handle: IO[bytes], start: int) -> Iterator[tuple[Message, int]]:
    handle.seek(start)
    while True:
        head = handle.read(_LEN.size)
        if len(head) < _LEN.size:
            return
        meta_len, value_len = _LEN.unpack(head)
        meta = handle.read(meta_len)
        value = handle.read(value_len)
        if len(meta) < meta_len or len(value) < value_len:
            return  # torn tail from a crash mid-write
        try:
            parsed = json.loads(meta)
        except json.JSONDecodeError:
            return
        yield Message(key=parsed["k"], value=value, headers=parsed["h"]), _LEN.size + meta_len + value_len
