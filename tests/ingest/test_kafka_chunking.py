"""Chunking of oversized messages: split by the producer, reassembled in offset order by the sink."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from trajlake.ingest import chunking
from trajlake.ingest.bus.base import Message, SourcePosition


def at(messages: list[Message], partition: int = 0) -> list[Message]:
    """The messages as a partition would deliver them, with consecutive offsets."""
    for offset, m in enumerate(messages):
        m.position = SourcePosition("t", partition, offset)
    return messages


def test_a_small_message_is_sent_as_it_is() -> None:
    message = Message("k", b"x" * 100, {"content-type": "application/json"})
    assert chunking.split(message, 1_000_000) == [message]


def test_a_large_message_becomes_chunks_under_the_limit_that_reassemble_exactly() -> None:
    value = os.urandom(3_000_000)  # incompressible: the worst case
    parts = chunking.split(Message("traj-1", value, {"content-type": "application/json"}), 1_000_000)
    assert len(parts) >= 3
    assert all(len(p.value) < 1_000_000 and p.key == "traj-1" for p in parts)
    released = chunking.ChunkAssembler().feed(at(parts))
    assert len(released) == 1 and released[0].reason is None
    assert released[0].message.value == value
    assert released[0].message.headers == {"content-type": "application/json"}
    assert released[0].message.position.offset == len(parts) - 1  # committed at its last chunk


def test_later_messages_wait_behind_an_incomplete_set_so_offsets_stay_a_prefix() -> None:
    parts = chunking.split(Message("big", b"a" * 40_000, {}), 20_000, "identity")
    assert len(parts) == 3
    stream = at([parts[0], Message("s1", b"1"), parts[1], Message("s2", b"2"), parts[2], Message("s3", b"3")])
    assembler = chunking.ChunkAssembler()
    assert [r.message.value for r in assembler.feed(stream[:2])] == []  # held behind chunk 0
    assert assembler.feed(stream[2:4]) == []
    released = assembler.feed(stream[4:])
    assert [r.message.key for r in released] == ["s1", "s2", "big", "s3"]
    assert [r.message.position.offset for r in released] == [1, 3, 4, 5]


def test_a_set_missing_a_chunk_becomes_a_dead_letter_after_max_gap_messages() -> None:
    parts = chunking.split(Message("big", b"a" * 40_000, {}), 20_000, "identity")
    singles = [Message(f"s{i}", b"x") for i in range(5)]
    assembler = chunking.ChunkAssembler(max_gap=3)
    released = assembler.feed(at([parts[0], parts[2], *singles]))
    assert released[0].reason is not None and "missing chunk(s) [1]" in released[0].reason
    assert [r.message.key for r in released[1:]] == [s.key for s in singles]


def test_a_corrupted_chunk_fails_the_checksum() -> None:
    parts = chunking.split(Message("big", b"abc" * 20_000, {}), 20_000, "identity")
    parts[1].value = b"\x00" * len(parts[1].value)
    (released,) = chunking.ChunkAssembler().feed(at(parts))
    assert "sha256" in released.reason


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_released_messages_always_cover_a_contiguous_prefix_of_offsets(data: st.DataObject) -> None:
    sets = [chunking.split(Message(f"big{i}", os.urandom(45_000), {}), 20_000, "identity") for i in range(2)]
    stream: list[Message] = []
    queues = [list(s) for s in sets] + [[Message(f"s{i}", b"x") for i in range(6)]]
    while any(queues):
        q = data.draw(st.sampled_from([q for q in queues if q]))
        stream.append(q.pop(0))
    at(stream)
    last_chunk = {
        m.headers[chunking.CHUNK_ID]: m.position.offset for m in stream if chunking.is_chunk(m)
    }  # later offsets overwrite: the last chunk of each set
    assembler = chunking.ChunkAssembler()
    covered: set[int] = set()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=4)))
    for lo, hi in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        for r in assembler.feed(stream[lo:hi]):
            assert r.reason is None
            m = r.message
            if m.key.startswith("big"):  # a reassembled set covers all its chunks
                set_id = next(k for k, v in last_chunk.items() if v == m.position.offset)
                covered |= {x.position.offset for x in stream if x.headers.get(chunking.CHUNK_ID) == set_id}
            else:
                covered.add(m.position.offset)
        if covered:
            assert covered == set(range(max(covered) + 1))  # what a commit may store is a prefix
    assert covered == set(range(len(stream)))
