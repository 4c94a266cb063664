"""The event model: event types, their fields, and the Arrow schema of the `events` table.

Every event is a flat mapping. The envelope fields are shared by all types; each type adds
its own fields, and everything a type does not use is null in the `events` table. Token
payloads (`input_token_ids`, `output_token_ids`, `output_logprobs`, `loss_mask`) are stored
once, here; projections reference them rather than copying them.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import time
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 1
"""The schema version producers write today."""

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})

# Event types -----------------------------------------------------------------------------
TRAJECTORY_STARTED = "trajectory_started"
TURN = "turn"
TOOL_CALL = "tool_call"
TOOL_RESULT = "tool_result"
REWARD = "reward"
TRAJECTORY_FINISHED = "trajectory_finished"
POLICY_UPDATED = "policy_updated"
BATCH_CONSUMED = "batch_consumed"

EVENT_TYPES = (
    TRAJECTORY_STARTED,
    TURN,
    TOOL_CALL,
    TOOL_RESULT,
    REWARD,
    TRAJECTORY_FINISHED,
    POLICY_UPDATED,
    BATCH_CONSUMED,
)
TRAJECTORY_EVENT_TYPES = frozenset(EVENT_TYPES[:6])
"""Types that belong to one trajectory and carry a per-trajectory `seq`."""

# Enumerations -----------------------------------------------------------------------------
STATUSES = ("completed", "context_exhausted", "max_turns", "timeout", "error")
FAILURE_ORIGINS = ("system", "model")
FAILURE_LABELS = (
    "model_capability",
    "tool_design",
    "harness_behavior",
    "env_dependency",
    "verifier_error",
    "infra",
)

# Fields -----------------------------------------------------------------------------------
_ENVELOPE: list[pa.Field] = [
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("event_type", pa.string(), nullable=False),
    pa.field("schema_version", pa.int16(), nullable=False),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("trajectory_id", pa.string()),
    pa.field("seq", pa.int64()),
    pa.field("producer_id", pa.string()),
    pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
]

_BODY: list[pa.Field] = [
    # trajectory_started
    pa.field("task_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("sample_index", pa.int32()),
    pa.field("environment", pa.string()),
    pa.field("harness", pa.string()),
    pa.field("model", pa.string()),
    pa.field("sampling_params", pa.string()),  # JSON object
    pa.field("context_budget_tokens", pa.int64()),
    pa.field("vocab_size", pa.int64()),
    pa.field("tags", pa.list_(pa.string())),
    # turn
    pa.field("turn_index", pa.int32()),
    pa.field("policy_version", pa.int64()),
    pa.field("input_token_ids", pa.list_(pa.int32())),
    pa.field("input_is_full", pa.bool_()),
    pa.field("output_token_ids", pa.list_(pa.int32())),
    pa.field("output_logprobs", pa.list_(pa.float32())),
    pa.field("loss_mask", pa.list_(pa.bool_())),
    pa.field("finish_reason", pa.string()),
    pa.field("context_used_fraction", pa.float32()),
    pa.field("nudged", pa.bool_()),
    pa.field("tito_drift", pa.bool_()),
    pa.field("latency_s", pa.float32()),
    # tool_call / tool_result
    pa.field("call_id", pa.string()),
    pa.field("tool_name", pa.string()),
    pa.field("arguments", pa.string()),  # JSON
    pa.field("is_code_execution", pa.bool_()),
    pa.field("ok", pa.bool_()),
    pa.field("error_type", pa.string()),
    pa.field("timed_out", pa.bool_()),
    pa.field("truncated", pa.bool_()),
    pa.field("output_tokens", pa.int64()),
    pa.field("retries", pa.int32()),
    # reward
    pa.field("reward", pa.float64()),
    pa.field("reward_components", pa.string()),  # JSON object name -> value
    pa.field("verifier", pa.string()),
    pa.field("verifier_error", pa.string()),
    # trajectory_finished
    pa.field("status", pa.string()),
    pa.field("failure_origin", pa.string()),
    pa.field("failure_label", pa.string()),
    pa.field("message", pa.string()),
    # policy_updated / batch_consumed
    pa.field("step", pa.int64()),
    pa.field("checkpoint", pa.string()),
    pa.field("metrics", pa.string()),  # JSON object
    pa.field("trainer_version", pa.int64()),
    pa.field("consumed_trajectory_ids", pa.list_(pa.string())),
    pa.field("consumed_staleness", pa.list_(pa.int64())),
    # anything else a producer wants to keep
    pa.field("attributes", pa.string()),  # JSON object
]

EVENTS_SCHEMA = pa.schema(_ENVELOPE + _BODY)
"""Arrow schema of the `events` table and of the Arrow IPC wire format."""

EVENT_FIELDS = {f.name: f for f in EVENTS_SCHEMA}

JSON_FIELDS = frozenset({"sampling_params", "arguments", "reward_components", "metrics", "attributes"})
"""Fields stored as JSON text; producers may hand over dicts and lists."""

TOKEN_FIELDS = ("input_token_ids", "output_token_ids", "output_logprobs", "loss_mask")

REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    TRAJECTORY_STARTED: ("trajectory_id", "seq", "task_id", "group_id", "sample_index"),
    TURN: ("trajectory_id", "seq", "turn_index", "policy_version", "output_token_ids", "output_logprobs"),
    TOOL_CALL: ("trajectory_id", "seq", "call_id", "tool_name"),
    TOOL_RESULT: ("trajectory_id", "seq", "call_id", "tool_name", "ok"),
    REWARD: ("trajectory_id", "seq"),
    TRAJECTORY_FINISHED: ("trajectory_id", "seq", "status"),
    POLICY_UPDATED: ("policy_version", "step"),
    BATCH_CONSUMED: ("step", "trainer_version", "consumed_trajectory_ids"),
}
"""Fields (besides the envelope) that each type must carry, non-null."""


_rand = random.Random(int.from_bytes(os.urandom(16), "big"))


def _reseed() -> None:
    """A forked child must not repeat its parent's random stream."""
    _rand.seed(int.from_bytes(os.urandom(16), "big"))


os.register_at_fork(after_in_child=_reseed)


def new_event_id() -> str:
    """A UUIDv7 string: unique, and sortable by creation time."""
    ms = time.time_ns() // 1_000_000
    value = (
        (ms & 0xFFFFFFFFFFFF) << 80
        | 0x7 << 76
        | _rand.getrandbits(12) << 64
        | 0b10 << 62
        | _rand.getrandbits(62)
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utc_now() -> dt.datetime:
    """The current time, timezone-aware UTC (the type of `event_time`)."""
    return dt.datetime.now(dt.UTC)


def make_event(event_type: str, run_id: str, **fields: Any) -> dict[str, Any]:
    """Build an event dict with a fresh envelope; unknown field names raise `TypeError`."""
    unknown = set(fields) - set(EVENT_FIELDS)
    if unknown:
        raise TypeError(f"unknown event field(s) {sorted(unknown)}; known fields: {sorted(EVENT_FIELDS)}")
    event: dict[str, Any] = {
        "event_id": new_event_id(),
        "event_type": event_type,
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "event_time": utc_now(),
    }
    event.update(fields)
    return event
