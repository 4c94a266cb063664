"""The wire format and table contract, written out literally: derived schemas must equal these."""

from __future__ import annotations

import pyarrow as pa
import pytest

from trajlake.schemas import events as ev
from trajlake.schemas.tables import TABLE_SCHEMAS

TS = pa.timestamp("us", tz="UTC")

EVENTS = [
    ("event_id", pa.string(), False),
    ("event_type", pa.string(), False),
    ("schema_version", pa.int16(), False),
    ("run_id", pa.string(), False),
    ("trajectory_id", pa.string()),
    ("seq", pa.int64()),
    ("producer_id", pa.string()),
    ("event_time", TS, False),
    ("task_id", pa.string()),
    ("group_id", pa.string()),
    ("sample_index", pa.int32()),
    ("environment", pa.string()),
    ("harness", pa.string()),
    ("model", pa.string()),
    ("sampling_params", pa.string()),
    ("context_budget_tokens", pa.int64()),
    ("vocab_size", pa.int64()),
    ("tags", pa.list_(pa.string())),
    ("turn_index", pa.int32()),
    ("policy_version", pa.int64()),
    ("input_token_ids", pa.list_(pa.int32())),
    ("input_is_full", pa.bool_()),
    ("output_token_ids", pa.list_(pa.int32())),
    ("output_logprobs", pa.list_(pa.float32())),
    ("loss_mask", pa.list_(pa.bool_())),
    ("finish_reason", pa.string()),
    ("context_used_fraction", pa.float32()),
    ("nudged", pa.bool_()),
    ("tito_drift", pa.bool_()),
    ("latency_s", pa.float32()),
    ("call_id", pa.string()),
    ("tool_name", pa.string()),
    ("arguments", pa.string()),
    ("is_code_execution", pa.bool_()),
    ("ok", pa.bool_()),
    ("error_type", pa.string()),
    ("timed_out", pa.bool_()),
    ("truncated", pa.bool_()),
    ("output_tokens", pa.int64()),
    ("retries", pa.int32()),
    ("reward", pa.float64()),
    ("reward_components", pa.string()),
    ("verifier", pa.string()),
    ("verifier_error", pa.string()),
    ("status", pa.string()),
    ("failure_origin", pa.string()),
    ("failure_label", pa.string()),
    ("message", pa.string()),
    ("step", pa.int64()),
    ("checkpoint", pa.string()),
    ("metrics", pa.string()),
    ("trainer_version", pa.int64()),
    ("consumed_trajectory_ids", pa.list_(pa.string())),
    ("consumed_staleness", pa.list_(pa.int64())),
    ("attributes", pa.string()),
    ("advantage", pa.float64()),
    ("consumed_advantages", pa.list_(pa.float64())),
    ("verifier_version", pa.string()),
    ("final_answer", pa.string()),
    ("artifacts", pa.string()),
]

TABLES = {
    "trajectories": [
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
        ("started_at", TS),
        ("finished_at", TS),
        (
            "turns_by_version",
            pa.list_(
                pa.struct(
                    [
                        ("policy_version", pa.int64()),
                        ("n_turns", pa.int64()),
                        ("n_output_tokens", pa.int64()),
                        ("sum_logprob", pa.float64()),
                    ]
                )
            ),
        ),
        ("generation_s", pa.float64()),
        ("slowest_turn_s", pa.float64()),
        ("n_timed_turns", pa.int64()),
        ("verifier_version", pa.string()),
    ],
    "turns": [
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
        ("output_repetition", pa.float64()),
        ("event_time", TS),
        ("advantage", pa.float64()),
    ],
    "tool_calls": [
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
        ("called_at", TS),
        ("finished_at", TS),
    ],
    "dead_letters": [
        ("dead_letter_id", pa.string()),
        ("received_at", TS),
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
    ],
    "policy_versions": [
        ("run_id", pa.string()),
        ("policy_version", pa.int64()),
        ("step", pa.int64()),
        ("checkpoint", pa.string()),
        ("metrics", pa.string()),
        ("event_time", TS),
    ],
    "batch_consumption": [
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("trainer_version", pa.int64()),
        ("trajectory_id", pa.string()),
        ("staleness", pa.int64()),
        ("event_time", TS),
        ("advantage", pa.float64()),
    ],
    "trainer_steps": [
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
        ("created_at", TS),
        ("mismatch_tokens", pa.int64()),
        ("drift", pa.float64()),
        ("drift_kl", pa.float64()),
        ("drift_tokens", pa.int64()),
        (
            "drift_by_staleness",
            pa.list_(
                pa.struct(
                    [
                        ("staleness", pa.int64()),
                        ("n_tokens", pa.int64()),
                        ("abs_diff", pa.float64()),
                        ("kl", pa.float64()),
                    ]
                )
            ),
        ),
        ("batch_step", pa.int64()),
    ],
    "rewards": [
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("seq", pa.int64()),
        ("verifier", pa.string()),
        ("verifier_version", pa.string()),
        ("reward", pa.float64()),
        ("verifier_error", pa.string()),
        ("reward_components", pa.string()),
        ("event_time", TS),
    ],
    "labels": [
        ("label_id", pa.string()),
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("turn_index", pa.int32()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("author", pa.string()),
        ("created_at", TS),
    ],
}

REQUIRED = {
    "trajectory_started": ("trajectory_id", "seq", "task_id", "group_id", "sample_index"),
    # a turn's policy_version may be unknown (null); a policy update always names its version
    "turn": ("trajectory_id", "seq", "turn_index", "output_token_ids", "output_logprobs"),
    "tool_call": ("trajectory_id", "seq", "call_id", "tool_name"),
    "tool_result": ("trajectory_id", "seq", "call_id", "tool_name", "ok"),
    "reward": ("trajectory_id", "seq"),
    "trajectory_finished": ("trajectory_id", "seq", "status"),
    "policy_updated": ("policy_version", "step"),
    "batch_consumed": ("step", "trainer_version", "consumed_trajectory_ids"),
}


def _schema(columns: list[tuple]) -> pa.Schema:
    return pa.schema([pa.field(*column) for column in columns])


def test_the_events_schema_is_the_wire_format() -> None:
    assert ev.EVENTS_SCHEMA.equals(_schema(EVENTS), check_metadata=True)


@pytest.mark.parametrize("name", sorted(TABLES), ids=sorted(TABLES))
def test_each_table_keeps_its_columns_types_and_order(name: str) -> None:
    assert TABLE_SCHEMAS[name].equals(_schema(TABLES[name]), check_metadata=True)


def test_required_fields_per_event_type() -> None:
    assert ev.REQUIRED_FIELDS == REQUIRED
    assert list(ev.REQUIRED_FIELDS) == list(ev.EVENT_TYPES)


JSON = {"sampling_params", "arguments", "reward_components", "metrics", "attributes", "artifacts"}


def test_fields_sent_as_json_objects() -> None:
    assert ev.JSON_FIELDS == JSON
