"""A sink's `Decoder` reads every Arrow stream a producer may send exactly as pyarrow's own reader does."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tests.helpers import started_event, turn_event
from trajlake.ingest import codec
from trajlake.schemas import conform, events_to_table

ARROW = {codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE}


def stream(table: pa.Table, batches: int = 1) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        size = max(1, -(-table.num_rows // batches))
        for batch in table.to_batches(max_chunksize=size):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def events(n: int = 3) -> pa.Table:
    return events_to_table(
        [started_event(trajectory_id="t")] + [turn_event(trajectory_id="t", seq=i) for i in range(1, n)]
    )


def some_columns(table: pa.Table) -> pa.Table:
    return table.select(["event_id", "event_type", "schema_version", "run_id", "trajectory_id", "seq"])


def with_dictionary(table: pa.Table) -> pa.Table:
    i = table.schema.get_field_index("event_type")
    return table.set_column(i, "event_type", table.column("event_type").dictionary_encode())


@pytest.mark.parametrize(
    ("table", "batches"),
    [
        (events(), 1),
        (events(5), 3),
        (some_columns(events()), 1),
        (with_dictionary(some_columns(events())), 2),
        (events(0).slice(0, 0), 1),
    ],
    ids=["one-batch", "three-batches", "subset-of-columns", "dictionary-column", "empty"],
)
def test_the_decoder_reads_what_pyarrow_reads(table: pa.Table, batches: int) -> None:
    value = stream(table, batches)
    expected = conform(pa.ipc.open_stream(pa.py_buffer(value)).read_all())
    decoder = codec.Decoder()
    for _ in range(3):  # the schema is parsed once, then served from the cache
        decoded, bad = decoder.decode(value, ARROW)
        assert bad == [] and decoded.equals(expected)


def test_a_cached_schema_does_not_leak_into_a_different_stream() -> None:
    decoder = codec.Decoder()
    full, subset = events(), some_columns(events())
    decoder.decode(stream(full), ARROW)
    decoded, _ = decoder.decode(stream(subset), ARROW)
    assert decoded.column("input_token_ids").null_count == decoded.num_rows  # filled in, not misread
    assert decoded.column("seq").to_pylist() == subset.column("seq").to_pylist()


@pytest.mark.parametrize(
    "value",
    [b"", b"\x00garbage", stream(events())[:100], stream(events())[:-120]],
    ids=["empty", "garbage", "truncated-schema", "truncated-batch"],
)
def test_an_unreadable_stream_is_a_decode_error(value: bytes) -> None:
    with pytest.raises(codec.DecodeError, match="not a readable Arrow IPC stream"):
        codec.Decoder().decode(value, ARROW)
