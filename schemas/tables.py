"""Arrow schemas of the lake's tables (the table contract of DESIGN.md).

`events` stores each event in the wire's `EVENTS_SCHEMA`, then `TOKEN_SUMMARY`: what the
lake derives from the event's token lists as it writes it (`store/summaries.py`).

`trajectories` and `turns` are stored without their token payloads; SQL users see the
token columns (`token_ids`, `logprobs`, `loss_mask`; per turn the raw lists) through views
that assemble them from `events`, so tokens are stored exactly once.

A projection's layout fixes the order of its columns (the contract); a column named by a
bare string has the type of the `events` field of that name. A field whose declaration
feeds a projection column the layout does not name gets that column appended, so adding a
field to `fields.py` is all it takes, and an existing table evolves by a trailing column.
"""

from __future__ import annotations

import pyarrow as pa

from trajlake.schemas.events import EVENT_FIELDS, EVENTS_SCHEMA
from trajlake.schemas.fields import feeds_into

_TS = pa.timestamp("us", tz="UTC")


def _projection(table: str, *layout: str | tuple[str, pa.DataType]) -> pa.Schema:
    """The schema of projection `table`: `layout` in order, then columns fed by newer fields."""
    columns = [(c, EVENT_FIELDS[c].type) if isinstance(c, str) else c for c in layout]
    named = {name for name, _ in columns}
    for field, feed in feeds_into(table):
        if (feed.column or field.name) not in named:
            unnested = feed.sql is not None and pa.types.is_list(field.type)  # one row per list item
            columns.append((feed.column or field.name, field.type.value_type if unnested else field.type))
            named.add(feed.column or field.name)
    return pa.schema(columns)


_I64 = pa.int64()
TURNS_BY_VERSION = pa.list_(
    pa.struct(
        [
            ("policy_version", _I64),
            ("n_turns", _I64),
            ("n_output_tokens", _I64),
            ("sum_logprob", pa.float64()),
        ]
    )
)
"""`trajectories.turns_by_version`: per policy version of a trajectory's turns, their count and sums."""

TRAJECTORIES_SCHEMA = _projection(
    "trajectories",
    "run_id", "trajectory_id", "task_id", "group_id", "sample_index", "environment", "harness", "model",
    "context_budget_tokens", ("policy_version_min", _I64), ("policy_version_max", _I64), "reward",
    "verifier_error", "status", "failure_origin", "failure_label", "message", ("finished", pa.bool_()),
    ("n_turns", _I64), ("n_tool_calls", _I64), ("n_tool_errors", _I64), ("n_tool_timeouts", _I64),
    ("n_tool_truncated", _I64), ("n_tool_retries", _I64), ("n_code_exec", _I64),
    ("assistant_tokens", _I64), ("env_tokens", _I64), ("total_tokens", _I64), ("sum_logprob", pa.float64()),
    ("context_peak_fraction", pa.float32()), "nudged", ("n_nudges", _I64), "tito_drift",
    ("n_drift_turns", _I64), ("started_at", _TS), ("finished_at", _TS), ("turns_by_version", TURNS_BY_VERSION),
    ("generation_s", pa.float64()), ("slowest_turn_s", pa.float64()), ("n_timed_turns", _I64),
)  # fmt: skip
"""Scalar columns of `trajectories`; the SQL view adds `token_ids`, `logprobs`, `loss_mask`.

`turns_by_version` sums the trajectory's turns per policy version (a trajectory may span
versions), so per-version figures such as rollout entropy read one row per trajectory, not
one per turn; `generation_s`, `slowest_turn_s` and `n_timed_turns` sum its turns' `latency_s`
(the latency page's slowest trajectories)."""

TOKEN_SUMMARY = pa.schema(
    [
        ("n_input_tokens", _I64),
        ("n_output_tokens", _I64),
        ("n_loss_tokens", _I64),
        ("sum_logprob", pa.float64()),
        ("output_repetition", pa.float64()),
    ]
)
"""Per stored event: its token lists' lengths, its loss tokens, its output logprobs' sum and its
output's repetition (zeros and null for an event without tokens); `turns` carries them per turn."""

STORED_EVENTS_SCHEMA = pa.schema([*EVENTS_SCHEMA, *TOKEN_SUMMARY])
"""The `events` table: the events as they arrived, then their `TOKEN_SUMMARY`."""

_SUMMARY = tuple((f.name, f.type) for f in TOKEN_SUMMARY)

TURNS_SCHEMA = _projection(
    "turns",
    "run_id", "trajectory_id", "event_id", "seq", "turn_index", "policy_version",
    *_SUMMARY[:3],
    "input_is_full", "finish_reason", "context_used_fraction", "nudged", "tito_drift", "latency_s",
    *_SUMMARY[3:], "event_time",
)  # fmt: skip
"""Scalar columns of `turns`; the SQL view adds the turn's token lists from `events`.
`output_repetition`: the share of the output's 4-grams that repeat an earlier one of the turn
(null under 4 tokens; `store.summaries.ngram_repetition`), which the health check reads."""

TOOL_CALLS_SCHEMA = _projection(
    "tool_calls",
    "run_id", "trajectory_id", "call_id", "tool_name", "arguments", "is_code_execution",
    ("has_result", pa.bool_()), "ok", "error_type", "timed_out", "truncated", "output_tokens", "retries",
    "latency_s", ("call_seq", _I64), ("result_seq", _I64), ("called_at", _TS), ("finished_at", _TS),
)  # fmt: skip

DEAD_LETTERS_SCHEMA = pa.schema(
    [
        ("dead_letter_id", pa.string()),
        ("received_at", _TS),
        ("source", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.string()),
        ("content_type", pa.string()),
        ("raw", pa.binary()),
        ("reason", pa.string()),
        ("event_id", pa.string()),
        ("event_type", pa.string()),
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
    ]
)
"""One row per rejected message or event: its raw bytes, where it came from, and why."""

POLICY_VERSIONS_SCHEMA = _projection(
    "policy_versions", "run_id", "policy_version", "step", "checkpoint", "metrics", "event_time"
)

BATCH_CONSUMPTION_SCHEMA = _projection(
    "batch_consumption", "run_id", "step", "trainer_version", "trajectory_id", ("staleness", _I64), "event_time",
)  # fmt: skip

TRAINER_STEPS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("trainer_version", pa.int64()),
        ("rank", pa.int32()),
        ("loss", pa.float64()),
        ("entropy", pa.float64()),
        ("grad_norm", pa.float64()),
        ("clip_fraction", pa.float64()),
        ("masked_fraction", pa.float64()),
        ("mismatch", pa.float64()),
        ("mismatch_healthy", pa.bool_()),
        ("staleness_mean", pa.float64()),
        ("staleness_max", pa.int64()),
        ("n_trajectories", pa.int64()),
        ("n_tokens", pa.int64()),
        ("reward_mean", pa.float64()),
        ("duration_s", pa.float64()),
        ("created_at", _TS),
    ]
)
"""Per-step trainer metrics, written by the trainer (not a projection)."""

PROJECTION_TABLES = ("trajectories", "turns", "tool_calls", "policy_versions", "batch_consumption")
"""Tables that are a pure function of `events`; `trajlake rebuild` recreates them."""

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORIES_SCHEMA,
    "turns": TURNS_SCHEMA,
    "tool_calls": TOOL_CALLS_SCHEMA,
    "dead_letters": DEAD_LETTERS_SCHEMA,
    "policy_versions": POLICY_VERSIONS_SCHEMA,
    "batch_consumption": BATCH_CONSUMPTION_SCHEMA,
    "trainer_steps": TRAINER_STEPS_SCHEMA,
}
