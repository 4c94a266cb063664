"""Arrow schemas of the lake's tables other than `events` (the table contract of DESIGN.md).

`trajectories` and `turns` are stored without their token payloads; SQL users see the
token columns (`token_ids`, `logprobs`, `loss_mask`; per turn the raw lists) through views
that assemble them from `events`, so tokens are stored exactly once.
"""

from __future__ import annotations

import pyarrow as pa

_TS = pa.timestamp("us", tz="UTC")

TRAJECTORIES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("sample_index", pa.int32()),
        ("environment", pa.string()),
        ("harness", pa.string()),
        ("model", pa.string()),
        ("context_budget_tokens", pa.int64()),
        ("policy_version_min", pa.int64()),
        ("policy_version_max", pa.int64()),
        ("reward", pa.float64()),
        ("verifier_error", pa.string()),
        ("status", pa.string()),
        ("failure_origin", pa.string()),
        ("failure_label", pa.string()),
        ("message", pa.string()),
        ("finished", pa.bool_()),
        ("n_turns", pa.int64()),
        ("n_tool_calls", pa.int64()),
        ("n_tool_errors", pa.int64()),
        ("n_tool_timeouts", pa.int64()),
        ("n_tool_truncated", pa.int64()),
        ("n_tool_retries", pa.int64()),
        ("n_code_exec", pa.int64()),
        ("assistant_tokens", pa.int64()),
        ("env_tokens", pa.int64()),
        ("total_tokens", pa.int64()),
        ("sum_logprob", pa.float64()),
        ("context_peak_fraction", pa.float32()),
        ("nudged", pa.bool_()),
        ("n_nudges", pa.int64()),
        ("tito_drift", pa.bool_()),
        ("n_drift_turns", pa.int64()),
        ("started_at", _TS),
        ("finished_at", _TS),
    ]
)
"""Scalar columns of `trajectories`; the SQL view adds `token_ids`, `logprobs`, `loss_mask`."""

TURNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("event_id", pa.string()),
        ("seq", pa.int64()),
        ("turn_index", pa.int32()),
        ("policy_version", pa.int64()),
        ("n_input_tokens", pa.int64()),
        ("n_output_tokens", pa.int64()),
        ("n_loss_tokens", pa.int64()),
        ("input_is_full", pa.bool_()),
        ("finish_reason", pa.string()),
        ("context_used_fraction", pa.float32()),
        ("nudged", pa.bool_()),
        ("tito_drift", pa.bool_()),
        ("latency_s", pa.float32()),
        ("sum_logprob", pa.float64()),
        ("event_time", _TS),
    ]
)
"""Scalar columns of `turns`; the SQL view adds the turn's token lists from `events`."""

TOOL_CALLS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("call_id", pa.string()),
        ("tool_name", pa.string()),
        ("arguments", pa.string()),
        ("is_code_execution", pa.bool_()),
        ("has_result", pa.bool_()),
        ("ok", pa.bool_()),
        ("error_type", pa.string()),
        ("timed_out", pa.bool_()),
        ("truncated", pa.bool_()),
        ("output_tokens", pa.int64()),
        ("retries", pa.int32()),
        ("latency_s", pa.float32()),
        ("call_seq", pa.int64()),
        ("result_seq", pa.int64()),
        ("called_at", _TS),
        ("finished_at", _TS),
    ]
)

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

POLICY_VERSIONS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("policy_version", pa.int64()),
        ("step", pa.int64()),
        ("checkpoint", pa.string()),
        ("metrics", pa.string()),
        ("event_time", _TS),
    ]
)

BATCH_CONSUMPTION_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("trainer_version", pa.int64()),
        ("trajectory_id", pa.string()),
        ("staleness", pa.int64()),
        ("event_time", _TS),
    ]
)

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
