"""The disk spool: records are checksummed; a torn or corrupt one is reported and the rest delivered."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trajlake.ingest.bus.base import Message
from trajlake.ingest.spool import MAGIC, Spool


def message(i: int) -> Message:
    return Message(key=f"traj-{i}", value=f"payload {i} ".encode() * 20, headers={"n": str(i)})


def spooled(directory: Path, n: int) -> Path:
    spool = Spool(directory, max_bytes=10_000_000)
    for i in range(n):
        spool.put(message(i))
    spool.close()  # as a dead producer leaves it: the files stay on disk
    (path,) = directory.glob("spool-*.bin")
    return path


def delivered(spool: Spool) -> list[str | None]:
    out = spool.peek(1000)
    spool.pop([size for _, size in out])
    return [m.key for m, _ in out]


def record_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    offsets, at = [], data.find(MAGIC)
    while at != -1:
        offsets.append(at)
        at = data.find(MAGIC, at + 1)
    return offsets


def test_a_clean_spool_is_taken_over_whole(tmp_path):
    spooled(tmp_path, 5)
    later = Spool(tmp_path, max_bytes=10_000_000)
    assert len(later) == 5 and later.corrupt_total == 0
    assert delivered(later) == [f"traj-{i}" for i in range(5)]
    assert not list(tmp_path.glob("spool-*.bin"))


def test_a_torn_tail_is_reported_and_every_whole_record_delivered(tmp_path, caplog):
    path = spooled(tmp_path, 5)
    size, last = path.stat().st_size, record_offsets(path)[4]
    with path.open("r+b") as f:
        f.truncate(size - 7)  # a crash mid-write of the last record
    with caplog.at_level(logging.ERROR, logger="trajlake.ingest.spool"):
        later = Spool(tmp_path, max_bytes=10_000_000)
    assert later.corrupt_total == 1
    assert f"{path}" in caplog.text and f"offset {last}" in caplog.text
    assert "torn" in caplog.text
    assert delivered(later) == [f"traj-{i}" for i in range(4)]


@pytest.mark.parametrize("where", ["value", "header"], ids=["flipped-value-byte", "flipped-header-byte"])
def test_a_corrupt_record_in_the_middle_is_reported_and_the_rest_delivered(tmp_path, caplog, where):
    path = spooled(tmp_path, 5)
    bad = record_offsets(path)[2]
    data = bytearray(path.read_bytes())
    data[bad + (60 if where == "value" else 6)] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.ERROR, logger="trajlake.ingest.spool"):
        later = Spool(tmp_path, max_bytes=10_000_000)
    assert later.corrupt_total == 1
    assert f"offset {bad}" in caplog.text and str(path) in caplog.text
    assert len(later) == 4
    assert delivered(later) == ["traj-0", "traj-1", "traj-3", "traj-4"]
    assert not list(tmp_path.glob("spool-*.bin"))  # drained files go, the bad bytes with them


def test_records_written_after_a_takeover_follow_the_good_ones(tmp_path):
    path = spooled(tmp_path, 3)
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size - 3)
    later = Spool(tmp_path, max_bytes=10_000_000)
    later.put(message(99))
    assert delivered(later) == ["traj-0", "traj-1", "traj-99"]
