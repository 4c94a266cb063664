"""The event model, declared once: event types and one `EventField` per field.

Everything else is derived from `FIELDS`: the Arrow schema of `events` and of the wire
format (`events.EVENTS_SCHEMA`), `REQUIRED_FIELDS` and the enum checks of validation, the
fed columns of the projection tables (`tables.py`) and the SQL that fills them
(`store/projections.py`), the keywords the Recorder accepts and loadgen's columns.
Adding a field is adding one `EventField` here, at the end of `BODY`: its position is its
column's position in `events`, and lakes written before it gain it as a trailing column.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pyarrow as pa

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


# The declaration's shape -----------------------------------------------------------------
@dataclass(frozen=True)
class Feed:
    """A projection column filled from an event field.

    By default the column has the field's name and type and takes the field's value as is.
    """

    table: str
    source: str | None = None
    """The event type the value comes from, where a table joins several (`trajectories`:
    the first `trajectory_started`, or the last `reward` / `trajectory_finished`;
    `tool_calls`: the `tool_call`, the `tool_result`, or None for whichever has it)."""
    default: str | None = None
    """SQL literal stored when no event carries a value (e.g. `false`)."""
    column: str | None = None
    """The column's name, when not the field's."""
    sql: str | None = None
    """The select expression, when not the field (e.g. an `unnest`)."""


@dataclass(frozen=True)
class EventField:
    """One field of the event model: its Arrow type, who carries it, and where it goes."""

    name: str
    type: pa.DataType
    carried_by: tuple[str, ...]
    """Event types that carry the field; every other type leaves it null."""
    required_by: tuple[str, ...] = ()
    """Event types that must carry it non-null (checked at ingest)."""
    nullable: bool = True
    """False only for envelope fields every event has (the Arrow field is non-nullable)."""
    json: bool = False
    """Stored as JSON text; producers may hand over dicts and lists."""
    allowed: tuple[str, ...] = ()
    """The values it may take, when it is an enumeration (checked at ingest)."""
    tokens: bool = False
    """A token payload: stored once, in `events`; projections keep only lengths and sums."""
    projected: bool = False
    """Projections read it to key, order or time their rows (envelope fields)."""
    feeds: tuple[Feed, ...] = ()
    """The projection columns it fills."""


ALL = EVENT_TYPES
TRAJECTORY = tuple(t for t in EVENT_TYPES if t in TRAJECTORY_EVENT_TYPES)
TS = pa.timestamp("us", tz="UTC")

ENVELOPE: tuple[EventField, ...] = (
    EventField("event_id", pa.string(), ALL, nullable=False, projected=True),
    EventField("event_type", pa.string(), ALL, nullable=False, projected=True),
    EventField("schema_version", pa.int16(), ALL, nullable=False),
    EventField("run_id", pa.string(), ALL, nullable=False, projected=True),
    EventField("trajectory_id", pa.string(), TRAJECTORY, required_by=TRAJECTORY, projected=True),
    EventField("seq", pa.int64(), TRAJECTORY, required_by=TRAJECTORY, projected=True),
    EventField("producer_id", pa.string(), ALL),
    EventField("event_time", TS, ALL, nullable=False, projected=True),
)
"""Fields every event has (`trajectory_id` and `seq`: every trajectory event)."""

_STARTED = (TRAJECTORY_STARTED,)
_FIRST = Feed("trajectories", source=TRAJECTORY_STARTED)
_TURN = (TURN,)
_TOOL = (TOOL_CALL, TOOL_RESULT)
_RESULT = (TOOL_RESULT,)
_FINISHED = (TRAJECTORY_FINISHED,)
_LAST_FINISHED = Feed("trajectories", source=TRAJECTORY_FINISHED)

BODY: tuple[EventField, ...] = (
    # trajectory_started
    EventField("task_id", pa.string(), _STARTED, required_by=_STARTED, feeds=(_FIRST,)),
    EventField("group_id", pa.string(), _STARTED, required_by=_STARTED, feeds=(_FIRST,)),
    EventField("sample_index", pa.int32(), _STARTED, required_by=_STARTED, feeds=(_FIRST,)),
    EventField("environment", pa.string(), _STARTED, feeds=(_FIRST,)),
    EventField("harness", pa.string(), _STARTED, feeds=(_FIRST,)),
    EventField("model", pa.string(), _STARTED, feeds=(_FIRST,)),
    EventField("sampling_params", pa.string(), _STARTED, json=True),
    EventField("context_budget_tokens", pa.int64(), _STARTED, feeds=(_FIRST,)),
    EventField("vocab_size", pa.int64(), (TRAJECTORY_STARTED, TURN)),
    EventField("tags", pa.list_(pa.string()), _STARTED),
    # turn
    EventField("turn_index", pa.int32(), _TURN, required_by=_TURN, feeds=(Feed("turns"),)),
    EventField(
        "policy_version",
        pa.int64(),
        (TURN, POLICY_UPDATED),
        required_by=(TURN, POLICY_UPDATED),
        feeds=(Feed("turns"), Feed("policy_versions")),
    ),
    EventField("input_token_ids", pa.list_(pa.int32()), _TURN, tokens=True),
    EventField("input_is_full", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),)),
    EventField("output_token_ids", pa.list_(pa.int32()), _TURN, required_by=_TURN, tokens=True),
    EventField("output_logprobs", pa.list_(pa.float32()), _TURN, required_by=_TURN, tokens=True),
    EventField("loss_mask", pa.list_(pa.bool_()), _TURN, tokens=True),
    EventField("finish_reason", pa.string(), _TURN, feeds=(Feed("turns"),)),
    EventField("context_used_fraction", pa.float32(), _TURN, feeds=(Feed("turns"),)),
    EventField("nudged", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),)),
    EventField("tito_drift", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),)),
    EventField(
        "latency_s",
        pa.float32(),
        (TURN, TOOL_RESULT),
        feeds=(Feed("turns"), Feed("tool_calls", source=TOOL_RESULT)),
    ),
    # tool_call / tool_result
    EventField("call_id", pa.string(), _TOOL, required_by=_TOOL, feeds=(Feed("tool_calls"),)),
    EventField("tool_name", pa.string(), _TOOL, required_by=_TOOL, feeds=(Feed("tool_calls"),)),
    EventField(
        "arguments", pa.string(), (TOOL_CALL,), json=True, feeds=(Feed("tool_calls", source=TOOL_CALL),)
    ),
    EventField("is_code_execution", pa.bool_(), _TOOL, feeds=(Feed("tool_calls", default="false"),)),
    EventField("ok", pa.bool_(), _RESULT, required_by=_RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),)),
    EventField("error_type", pa.string(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),)),
    EventField("timed_out", pa.bool_(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "false"),)),
    EventField("truncated", pa.bool_(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "false"),)),
    EventField("output_tokens", pa.int64(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),)),
    EventField("retries", pa.int32(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "0"),)),
    # reward
    EventField("reward", pa.float64(), (REWARD,), feeds=(Feed("trajectories", source=REWARD),)),
    EventField("reward_components", pa.string(), (REWARD,), json=True),  # name -> value
    EventField("verifier", pa.string(), (REWARD,)),
    EventField("verifier_error", pa.string(), (REWARD,), feeds=(Feed("trajectories", source=REWARD),)),
    # trajectory_finished
    EventField(
        "status", pa.string(), _FINISHED, required_by=_FINISHED, allowed=STATUSES, feeds=(_LAST_FINISHED,)
    ),
    EventField("failure_origin", pa.string(), _FINISHED, allowed=FAILURE_ORIGINS, feeds=(_LAST_FINISHED,)),
    EventField("failure_label", pa.string(), _FINISHED, allowed=FAILURE_LABELS, feeds=(_LAST_FINISHED,)),
    EventField("message", pa.string(), _FINISHED, feeds=(_LAST_FINISHED,)),
    # policy_updated / batch_consumed
    EventField(
        "step",
        pa.int64(),
        (POLICY_UPDATED, BATCH_CONSUMED),
        required_by=(POLICY_UPDATED, BATCH_CONSUMED),
        feeds=(Feed("policy_versions"), Feed("batch_consumption")),
    ),
    EventField("checkpoint", pa.string(), (POLICY_UPDATED,), feeds=(Feed("policy_versions"),)),
    EventField("metrics", pa.string(), (POLICY_UPDATED,), json=True, feeds=(Feed("policy_versions"),)),
    EventField(
        "trainer_version",
        pa.int64(),
        (BATCH_CONSUMED,),
        required_by=(BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption"),),
    ),
    EventField(
        "consumed_trajectory_ids",
        pa.list_(pa.string()),
        (BATCH_CONSUMED,),
        required_by=(BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="trajectory_id", sql="unnest(consumed_trajectory_ids)"),),
    ),
    EventField(
        "consumed_staleness",
        pa.list_(pa.int64()),
        (BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="staleness", sql="unnest(consumed_staleness)"),),
    ),
    # anything else a producer wants to keep
    EventField("attributes", pa.string(), ALL, json=True),
    # added after the first release: new fields go last, so stored tables gain a trailing column
    EventField("advantage", pa.float64(), _TURN, feeds=(Feed("turns"),)),  # the trainer's, for this turn
    EventField(
        "consumed_advantages",
        pa.list_(pa.float64()),
        (BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="advantage", sql="unnest(consumed_advantages)"),),
    ),  # the advantage each consumed trajectory got at that step, in `consumed_trajectory_ids` order
)
"""Type-specific fields, grouped by the event type that introduces them."""

FIELDS: tuple[EventField, ...] = ENVELOPE + BODY
"""Every field, in the column order of `events`."""


def feeds_into(table: str, source: str | None = None) -> list[tuple[EventField, Feed]]:
    """The fields that fill columns of projection `table` (from event type `source`, if given)."""
    return [
        (f, feed)
        for f in FIELDS
        for feed in f.feeds
        if feed.table == table and (source is None or feed.source == source)
    ]


@functools.cache
def body_fields_of(event_type: str) -> frozenset[str]:
    """Names of the type-specific fields an event of `event_type` may carry."""
    return frozenset(f.name for f in BODY if event_type in f.carried_by)
