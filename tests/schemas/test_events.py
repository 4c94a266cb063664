"""The event model: invariants are enforced with precise reasons; schemas/ stays light."""

from __future__ import annotations

import math
import subprocess
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import started_event, turn_event
from trajlake.schemas import EVENTS_SCHEMA, EventError, events_to_table, make_event, validate

ids = st.lists(st.integers(0, 99), min_size=0, max_size=20)


def reasons_of(*events: dict) -> list[str]:
    return validate(events_to_table(list(events))).reasons


@given(out=ids, data=st.data())
@settings(max_examples=60, deadline=None)
def test_a_turn_is_valid_exactly_when_its_lists_line_up(out: list[int], data: st.DataObject) -> None:
    n_lp = data.draw(st.integers(0, 22))
    lps = data.draw(st.lists(st.floats(-50, 0, allow_nan=False), min_size=n_lp, max_size=n_lp))
    mask = [True] * len(out)
    reasons = reasons_of(turn_event(output_token_ids=out, output_logprobs=lps, loss_mask=mask))
    assert (reasons == []) == (len(out) == n_lp)
    if reasons:
        assert f"output_token_ids has {len(out)} ids but output_logprobs has {n_lp}" in reasons[0]


@given(bad=st.sampled_from([math.nan, math.inf, -math.inf, 0.5, 1e-3, 7.0]), pos=st.integers(0, 2))
@settings(max_examples=40, deadline=None)
def test_non_finite_or_positive_logprobs_are_rejected(bad: float, pos: int) -> None:
    lps = [-0.1, -0.2, -0.3]
    lps[pos] = bad
    (reason,) = reasons_of(turn_event(output_token_ids=[1, 2, 3], output_logprobs=lps, loss_mask=[True] * 3))
    assert "logprobs must be finite and <= 0" in reason


@given(token=st.integers(-(2**31), 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_token_ids_must_be_below_the_vocab_and_non_negative(token: int) -> None:
    reasons = reasons_of(
        turn_event(output_token_ids=[token], output_logprobs=[-0.1], loss_mask=[True], vocab_size=100)
    )
    assert (reasons == []) == (0 <= token < 100)
    if token < 0:
        assert "must be >= 0" in reasons[0]
    elif token >= 100:
        assert "vocab_size 100" in reasons[0]


def test_a_mask_must_cover_the_output_tokens() -> None:
    (reason,) = reasons_of(turn_event(loss_mask=[True]))
    assert reason.startswith("loss_mask has 1 entries for 2 output tokens")


def test_unknown_type_and_schema_version_name_the_fix() -> None:
    weird = make_event("telepathy", "r", trajectory_id="t", seq=0)
    future = turn_event()
    future["schema_version"] = 99
    reasons = reasons_of(weird, future)
    assert "event_type='telepathy' is unknown; use one of trajectory_started" in reasons[0]
    assert "schema_version=99 is not supported" in reasons[1]


def test_duplicate_seq_rejects_the_later_event_only() -> None:
    result = validate(events_to_table([started_event(), turn_event(seq=1), turn_event(seq=1)]))
    assert result.valid.num_rows == 2
    assert list(result.rejected_index) == [2]
    assert "seq=1 is a duplicate within trajectory t" in result.reasons[0]


def test_seqs_already_stored_count_as_duplicates() -> None:
    result = validate(events_to_table([turn_event(seq=3)]), known_seqs={"t": {1, 2, 3}})
    assert result.valid.num_rows == 0


def test_a_missing_required_field_is_named() -> None:
    (reason,) = reasons_of(make_event("trajectory_finished", "r", trajectory_id="t", seq=4))
    assert reason == "status is missing; a trajectory_finished event must carry status"


def test_unknown_fields_are_refused_at_build_time() -> None:
    try:
        events_to_table([{**turn_event(), "colour": "blue"}])
    except EventError as err:
        assert "unknown field(s) ['colour']" in str(err) and err.index == 0
    else:
        raise AssertionError("an unknown field was accepted")


def test_wrong_types_name_the_field() -> None:
    try:
        events_to_table([turn_event(policy_version="three")])
    except EventError as err:
        assert err.field == "policy_version" and "does not fit type int64" in str(err)
    else:
        raise AssertionError("a string policy_version was accepted")


def test_every_field_has_an_arrow_type() -> None:
    assert EVENTS_SCHEMA.field("output_logprobs").type == pa.list_(pa.float32())
    assert EVENTS_SCHEMA.field("output_token_ids").type == pa.list_(pa.int32())


def test_schemas_import_no_heavy_library() -> None:
    code = (
        "import sys, trajlake.schemas;"
        "heavy = [m for m in ('torch', 'duckdb', 'ray', 'streamlit', 'deltalake') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == ""
