"""A disk spool for messages the producer could not deliver: append-only files, read in order.

Each record is `MAGIC len(meta) len(value) crc32 meta value` (big-endian u32s; meta is JSON
with the key and headers; the CRC covers both lengths, meta and value) and is fsynced before
`put` returns, so a spooled message survives a crash of the machine, not only of the process.
A spool file is held with an exclusive lock, so a restarted producer can take over the files
a dead one left behind and deliver them. Taking over, it checks every record: a torn or
corrupt one is logged with its file and offset and counted (`corrupt_total`), the bytes up to
the next good record (found by its MAGIC) are skipped, and every good record is delivered.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
import threading
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from trajlake.ingest.bus.base import Message
from trajlake.schemas.errors import TrajlakeError

MAGIC = b"TLS1"
_HEAD = struct.Struct(">4sIII")  # magic, len(meta), len(value), crc32(lengths + meta + value)
_MAX_RECORD = 1 << 31  # lengths beyond this are corruption, not a message

log = logging.getLogger(__name__)


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
        self.corrupt_total = 0  # torn or corrupt regions found (and reported) when taking files over
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
            count, end = 0, 0
            for _, size in _records(handle, 0, on_corrupt=self._report(path)):
                count += 1
                end += size
            if handle.seek(0, 2) > end:  # nothing good after `end`: a torn tail, reported above
                handle.truncate(end)
                _fsync(handle)
            if count == 0:
                handle.close()
                path.unlink(missing_ok=True)
                continue
            self._files.append((path, handle))
            self.messages += count
            self.bytes += path.stat().st_size

    def _report(self, path: Path) -> Callable[[int, int, str], None]:
        def report(offset: int, skipped: int, why: str) -> None:
            self.corrupt_total += 1
            log.error(
                "spool file %s: %s at offset %d; skipping %d bytes (that message is lost, the rest is delivered)",
                path,
                why,
                offset,
                skipped,
            )

        return report

    def __len__(self) -> int:
        return self.messages

    def put(self, message: Message) -> None:
        """Append one message."""
        meta = json.dumps({"k": message.key, "h": message.headers}).encode()
        record = _record(meta, message.value)
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
            _fsync(self._writer)
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


def _record(meta: bytes, value: bytes) -> bytes:
    lengths = struct.pack(">II", len(meta), len(value))
    crc = zlib.crc32(value, zlib.crc32(meta, zlib.crc32(lengths)))
    return _HEAD.pack(MAGIC, len(meta), len(value), crc) + meta + value


def _fsync(handle: IO[bytes]) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _records(
    handle: IO[bytes], start: int, on_corrupt: Callable[[int, int, str], None] | None = None
) -> Iterator[tuple[Message, int]]:
    """Good records from `start` on, each with its size counted from the end of the one before.

    A bad region (torn, wrong CRC, unreadable meta) is skipped up to the next record that
    checks out, and passed to `on_corrupt(offset, bytes skipped, why)`; its bytes are added
    to the size of the next good record, so popping that record also leaves the region behind.
    """
    end = handle.seek(0, 2)
    pos = handle.seek(start)
    while pos < end:
        record = handle.read(_HEAD.size)
        if len(record) == _HEAD.size:
            magic, meta_len, value_len, _ = _HEAD.unpack(record)
            if magic == MAGIC and meta_len + value_len <= end - pos - _HEAD.size:
                record += handle.read(meta_len + value_len)
        bad = _check(record, 0)
        if bad is None:
            yield _parse(record, 0)
            pos += len(record)
            continue
        # a bad region (rare): resynchronise on the next MAGIC whose record checks out
        handle.seek(pos)
        rest = handle.read(end - pos)
        nxt = rest.find(MAGIC, 1)
        while nxt != -1 and _check(rest, nxt) is not None:
            nxt = rest.find(MAGIC, nxt + 1)
        if on_corrupt is not None:
            on_corrupt(pos, len(rest) if nxt == -1 else nxt, bad)
        if nxt == -1:
            return
        message, size = _parse(rest, nxt)
        yield message, nxt + size
        pos = handle.seek(pos + nxt + size)


def _check(data: bytes, pos: int) -> str | None:
    """Why the record at `pos` is bad, or None if it is good."""
    if len(data) - pos < _HEAD.size:
        return "torn record header"
    magic, meta_len, value_len, crc = _HEAD.unpack_from(data, pos)
    if magic != MAGIC or meta_len > _MAX_RECORD or value_len > _MAX_RECORD:
        return "corrupt record header"
    body = pos + _HEAD.size
    if len(data) - body < meta_len + value_len:
        return "torn record (shorter than its header says)"
    meta = data[body : body + meta_len]
    value = data[body + meta_len : body + meta_len + value_len]
    lengths = struct.pack(">II", meta_len, value_len)
    if zlib.crc32(value, zlib.crc32(meta, zlib.crc32(lengths))) != crc:
        return "record checksum mismatch"
    try:
        parsed = json.loads(meta)
        _ = (parsed["k"], parsed["h"])  # both must be there
    except (ValueError, KeyError, TypeError):
        return "unreadable record metadata"
    return None


def _parse(data: bytes, pos: int) -> tuple[Message, int]:
    """The (checked) record at `pos` and its size."""
    _, meta_len, value_len, _ = _HEAD.unpack_from(data, pos)
    body = pos + _HEAD.size
    parsed = json.loads(data[body : body + meta_len])
    value = data[body + meta_len : body + meta_len + value_len]
    return Message(key=parsed["k"], value=value, headers=parsed["h"]), _HEAD.size + meta_len + value_len
