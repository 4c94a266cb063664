"""Oversized messages: split into compressed chunks by the producer, reassembled by the sink.

Kafka's default message limit is about 1 MB and a 128K-token turn exceeds it. A message
whose value is larger than `max_bytes` is compressed (zstd when available, else gzip),
then cut into chunks that carry the `trajlake-chunk-*` headers below, all with the
message's key (so they land on one partition, in order). The sink's `ChunkAssembler`
holds a partition's later messages back while a set is incomplete, so the offset the
sink commits never passes the first chunk of a half-received set; a set that is still
incomplete `max_gap` messages later on its partition, or whose checksum does not match,
goes to dead letters. See docs/wire-format.md.
"""

from __future__ import annotations

import gzip
import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from trajlake.ingest.bus.base import Message, SourcePosition

CHUNK_ID = "trajlake-chunk-id"
CHUNK_INDEX = "trajlake-chunk-index"
CHUNK_COUNT = "trajlake-chunk-count"
CHUNK_SHA256 = "trajlake-chunk-sha256"
CHUNK_ENCODING = "trajlake-chunk-encoding"
CHUNK_HEADERS = (CHUNK_ID, CHUNK_INDEX, CHUNK_COUNT, CHUNK_SHA256, CHUNK_ENCODING)
MAX_CHUNKS = 100_000
HEADROOM_BYTES = 4096
"""Room left in each chunk for the key, headers and record overhead."""

try:  # zstd is optional (kafka extra); gzip always works
    import zstandard as _zstd
except ImportError:  # pragma: no cover - depends on the environment
    _zstd = None


def default_encoding() -> str:
    """The chunk payload compression this producer uses: zstd if installed, else gzip."""
    return "zstd" if _zstd is not None else "gzip"


def compress(data: bytes, encoding: str) -> bytes:
    """`data` compressed with `encoding` (identity, gzip or zstd)."""
    if encoding == "identity":
        return data
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=3)
    if encoding == "zstd" and _zstd is not None:
        return _zstd.ZstdCompressor(level=3).compress(data)
    raise ValueError(f"chunk encoding {encoding!r} is not available; use gzip or install zstandard")


def decompress(data: bytes, encoding: str) -> bytes:
    """Inverse of `compress`; raises ValueError with the reason on bad input."""
    if encoding == "identity":
        return data
    if encoding == "gzip":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ValueError(f"gzip payload is corrupt: {err}") from None
    if encoding == "zstd":
        if _zstd is None:
            raise ValueError("zstd chunk payload but zstandard is not installed; pip install zstandard")
        try:
            return _zstd.ZstdDecompressor().decompress(data, max_output_size=2**31 - 1)
        except _zstd.ZstdError as err:
            raise ValueError(f"zstd payload is corrupt: {err}") from None
    raise ValueError(f"unknown chunk encoding {encoding!r}; expected identity, gzip or zstd")


def split(message: Message, max_bytes: int, encoding: str | None = None) -> list[Message]:
    """`message` itself if it fits in `max_bytes`, else its chunks (compressed, with chunk headers)."""
    overhead = len(message.key or "") + sum(len(k) + len(v) for k, v in message.headers.items())
    if len(message.value) + overhead + HEADROOM_BYTES <= max_bytes:
        return [message]
    encoding = encoding or default_encoding()
    payload = compress(message.value, encoding)
    size = max_bytes - overhead - HEADROOM_BYTES - 256
    if size <= 0:
        raise ValueError(f"max_bytes={max_bytes} leaves no room for chunk data; raise max_message_bytes")
    count = max(1, -(-len(payload) // size))
    if count > MAX_CHUNKS:
        raise ValueError(f"message of {len(message.value)} bytes needs {count} chunks (max {MAX_CHUNKS})")
    set_id = uuid.uuid4().hex
    digest = hashlib.sha256(message.value).hexdigest()
    chunks = []
    for i in range(count):
        headers = dict(message.headers)
        headers.update(
            {
                CHUNK_ID: set_id,
                CHUNK_INDEX: str(i),
                CHUNK_COUNT: str(count),
                CHUNK_SHA256: digest,
                CHUNK_ENCODING: encoding,
            }
        )
        chunks.append(Message(key=message.key, value=payload[i * size : (i + 1) * size], headers=headers))
    return chunks


def is_chunk(message: Message) -> bool:
    """True if `message` is one chunk of a split message."""
    return CHUNK_ID in message.headers


@dataclass
class _PendingSet:
    count: int
    first: SourcePosition
    parts: dict[int, Message] = field(default_factory=dict)
    failed: str | None = None

    def last_offset(self) -> int:
        return max(m.position.offset if m.position else -1 for m in self.parts.values())


@dataclass
class Released:
    """A message ready for decoding (or, with `reason`, a bad one for dead letters)."""

    message: Message
    reason: str | None = None


class ChunkAssembler:
    """Reassembles chunk sets per partition, releasing messages strictly in offset order.

    A reassembled message is released at the position of its last chunk, and nothing on a
    partition after the first chunk of an incomplete set is released, so the messages
    released so far always cover a contiguous prefix of the partition's offsets. Callers
    must hand each `feed` result to one commit as a whole.
    """

    def __init__(self, max_gap: int = 5000) -> None:
        self.max_gap = max_gap
        self._queue: dict[int, list[tuple[Message, str | None]]] = {}
        self._sets: dict[int, dict[str, _PendingSet]] = {}

    def held(self) -> int:
        """Messages currently held back."""
        return sum(len(v) for v in self._queue.values())

    def reset(self, partition: int | None = None) -> None:
        """Forget held state (all partitions, or one that was revoked or re-seeked)."""
        for d in (self._queue, self._sets):
            if partition is None:
                d.clear()
            else:
                d.pop(partition, None)

    def feed(self, messages: Iterable[Message]) -> list[Released]:
        """Add polled messages; return those that are ready, in offset order per partition."""
        touched: dict[int, None] = {}
        for message in messages:
            partition = message.position.partition if message.position else -1
            reason = self._add_chunk(partition, message) if is_chunk(message) else None
            self._queue.setdefault(partition, []).append((message, reason))
            touched[partition] = None
        out: list[Released] = []
        for partition in touched:
            out.extend(self._release(partition))
        return out

    def _add_chunk(self, partition: int, message: Message) -> str | None:
        headers = message.headers
        set_id = headers[CHUNK_ID]
        try:
            index, count = int(headers.get(CHUNK_INDEX, "")), int(headers.get(CHUNK_COUNT, ""))
        except ValueError:
            return f"chunk of set {set_id} has non-integer {CHUNK_INDEX}/{CHUNK_COUNT} headers"
        if not 0 < count <= MAX_CHUNKS or not 0 <= index < count:
            return f"chunk of set {set_id} has index {index} outside its count {count}"
        sets = self._sets.setdefault(partition, {})
        pending = sets.get(set_id)
        if pending is None:
            pending = sets[set_id] = _PendingSet(count=count, first=message.position or _NOWHERE)
        if pending.count != count:
            return f"chunk {index} of set {set_id} says {count} chunks, its first chunk said {pending.count}"
        if index in pending.parts:
            return f"chunk {index} of set {set_id} arrived twice"
        pending.parts[index] = message
        return None

    def _release(self, partition: int) -> list[Released]:
        queue = self._queue[partition]
        sets = self._sets.get(partition, {})
        out: list[Released] = []
        emitted: list[str] = []
        opened: set[str] = set()  # sets whose first chunk was passed but not yet their last
        safe_out, safe_queue, safe_emitted = 0, 0, 0
        i = 0
        while i < len(queue):
            message, reason = queue[i]
            if reason is not None or not is_chunk(message):
                out.append(Released(message, reason))
            else:
                set_id = message.headers[CHUNK_ID]
                pending = sets[set_id]
                if len(pending.parts) < pending.count and pending.failed is None:
                    if len(queue) - i <= self.max_gap:
                        break  # wait for the rest of the set; hold everything after it
                    missing = sorted(set(range(pending.count)) - set(pending.parts))
                    pending.failed = (
                        f"chunk set {set_id} incomplete: missing chunk(s) {missing[:10]} of {pending.count} "
                        f"after {self.max_gap} later messages on partition {partition}"
                    )
                offset = message.position.offset if message.position else -1
                if offset == pending.last_offset():
                    out.append(self._assemble(set_id, pending))
                    emitted.append(set_id)
                    opened.discard(set_id)
                else:
                    opened.add(set_id)
            i += 1
            if not opened:  # everything up to here is complete: a commit may cover it
                safe_out, safe_queue, safe_emitted = len(out), i, len(emitted)
        for set_id in emitted[:safe_emitted]:
            del sets[set_id]
        del queue[:safe_queue]
        return out[:safe_out]

    def _assemble(self, set_id: str, pending: _PendingSet) -> Released:
        got = sorted(pending.parts)
        ordered = [pending.parts[i] for i in got]
        last = max(ordered, key=lambda m: m.position.offset if m.position else -1)
        headers = dict(ordered[0].headers)
        raw = b"".join(m.value for m in ordered)
        if pending.failed is not None:
            return Released(
                Message(ordered[0].key, raw, headers, last.position, last.timestamp_ms), pending.failed
            )
        headers = {k: v for k, v in headers.items() if k not in CHUNK_HEADERS}
        merged = Message(ordered[0].key, raw, headers, last.position, last.timestamp_ms)
        encoding = ordered[0].headers.get(CHUNK_ENCODING, "identity")
        try:
            value = decompress(raw, encoding)
        except ValueError as err:
            return Released(merged, f"chunk set {set_id} ({pending.count} chunks): {err}")
        if hashlib.sha256(value).hexdigest() != ordered[0].headers.get(CHUNK_SHA256):
            return Released(merged, f"chunk set {set_id} ({pending.count} chunks) fails its sha256 check")
        return Released(replace(merged, value=value))


_NOWHERE = SourcePosition("", -1, -1)
