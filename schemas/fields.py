"""The event model, declared once: event types and one `EventField` per field.

Everything else is derived from `FIELDS`: the Arrow schema of `events` and of the wire
format (`events.EVENTS_SCHEMA`), `REQUIRED_FIELDS` and the enum checks of validation, the
fed columns of the projection tables (`tables.py`) and the SQL that fills them
(`store/projections.py`), the keywords the Recorder accepts, loadgen's columns, and the
reference pages of the docs (`docs/reference/events.md`, `tables.md`: `make docs` writes them).
Adding a field is adding one `EventField` here, with its `doc`, at the end of `BODY`: its
position is its column's position in `events`, and lakes written before it gain it as a
trailing column.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

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

EVENT_TYPE_DOCS = {
    TRAJECTORY_STARTED: "An episode began: which task, which prompt group and sample, in which environment and "
    "harness, with which model and context budget. Everything after it in the trajectory refers to it.",
    TURN: "The model generated once: the tokens this turn appended to the context and the ids, logprobs and "
    "loss mask of its output, with the weight version that generated them. Stored token-exact, so the "
    "trainer learns from exactly what the engine sampled.",
    TOOL_CALL: "The model called a tool: kept apart from its result so that a call whose result never came "
    "(a crash, a timeout of the harness) is still counted.",
    TOOL_RESULT: "The tool's outcome: ok or which error, timed out, truncated, retried, and how many tokens its "
    "output added. Tool error rates, by tool and by version, come from these.",
    REWARD: "The verifier's score, or why it could not score: a verifier error is the system's failure, "
    "never a reward of 0.",
    TRAJECTORY_FINISHED: "How the episode ended, and whose failure it was (system or model, with a label "
    "from the taxonomy): system failures never reach the trainer as reward 0.",
    POLICY_UPDATED: "The trainer published new weights: rollout workers pick the version up, and staleness "
    "is measured against it.",
    BATCH_CONSUMED: "A trainer step used these trajectories at this version: who trained on what, with which "
    "staleness and advantage (`batch_consumption`), so a run can be audited and replayed.",
}
"""Why each event type exists (the reference pages and `trajlake` docs show it)."""

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
    doc: str = field(kw_only=True)
    """What the field means, in one sentence (the table and event reference pages show it)."""


ALL = EVENT_TYPES
TRAJECTORY = tuple(t for t in EVENT_TYPES if t in TRAJECTORY_EVENT_TYPES)
TS = pa.timestamp("us", tz="UTC")

# fmt: off
ENVELOPE: tuple[EventField, ...] = (
    EventField("event_id", pa.string(), ALL, nullable=False, projected=True,
               doc="Unique id of the event (a UUIDv7, so ids sort by time); an event delivered twice is a replay, dropped and counted."),
    EventField("event_type", pa.string(), ALL, nullable=False, projected=True,
               doc="What happened: one of the event types."),
    EventField("schema_version", pa.int16(), ALL, nullable=False,
               doc="Version of the event model the producer wrote; ingest rejects a version it does not know."),
    EventField("run_id", pa.string(), ALL, nullable=False, projected=True,
               doc="The run the event belongs to (a training run, an import, a loadgen run)."),
    EventField("trajectory_id", pa.string(), TRAJECTORY, required_by=TRAJECTORY, projected=True,
               doc="The trajectory (one agent episode) the event belongs to."),
    EventField("seq", pa.int64(), TRAJECTORY, required_by=TRAJECTORY, projected=True,
               doc="Position of the event within its trajectory: 0, 1, 2, … in emission order, never repeated."),
    EventField("producer_id", pa.string(), ALL,
               doc="Who emitted the event (host:pid unless the producer names itself)."),
    EventField("event_time", TS, ALL, nullable=False, projected=True,
               doc="When the producer emitted the event (UTC, microseconds)."),
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
    EventField("task_id", pa.string(), _STARTED, required_by=_STARTED, feeds=(_FIRST,),
               doc="The task (prompt) the trajectory attempts."),
    EventField("group_id", pa.string(), _STARTED, required_by=_STARTED, feeds=(_FIRST,),
               doc="The prompt group of the sample: GRPO-style advantages compare samples within it (default: the task id)."),
    EventField("sample_index", pa.int32(), _STARTED, required_by=_STARTED, feeds=(_FIRST,),
               doc="Index of this sample within its prompt group."),
    EventField("environment", pa.string(), _STARTED, feeds=(_FIRST,),
               doc="The environment that ran the episode."),
    EventField("harness", pa.string(), _STARTED, feeds=(_FIRST,),
               doc="The agent harness (scaffold) that drove the model."),
    EventField("model", pa.string(), _STARTED, feeds=(_FIRST,),
               doc="The model that generated the turns: a name, or a local directory whose tokenizer `detokenize()` uses."),
    EventField("sampling_params", pa.string(), _STARTED, json=True,
               doc="The sampling parameters (temperature, top_p, max_tokens, …), as JSON."),
    EventField("context_budget_tokens", pa.int64(), _STARTED, feeds=(_FIRST,),
               doc="The context window the episode had, in tokens."),
    EventField("vocab_size", pa.int64(), (TRAJECTORY_STARTED, TURN),
               doc="The model's vocabulary size: ingest rejects a token id at or above it."),
    EventField("tags", pa.list_(pa.string()), _STARTED,
               doc="Free-form labels."),
    # turn
    EventField("turn_index", pa.int32(), _TURN, required_by=_TURN, feeds=(Feed("turns"),),
               doc="Index of the turn within its trajectory: 0, 1, 2, …."),
    # a turn's version may be unknown (null: never taken as version 0); a policy update names its own
    EventField(
        "policy_version",
        pa.int64(),
        (TURN, POLICY_UPDATED),
        required_by=(POLICY_UPDATED,),
        feeds=(Feed("turns"), Feed("policy_versions")),
        doc="A turn: the weight version that generated it (null: unknown, never taken for fresh). A policy update: the new version.",
    ),
    EventField("input_token_ids", pa.list_(pa.int32()), _TURN, tokens=True,
               doc="The token ids this turn appends to the context: the first turn's whole prompt, later turns only what the environment appended after the previous output (the full input when `input_is_full`)."),
    EventField("input_is_full", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),),
               doc="True when the turn stores its whole input, because it broke the prefix invariant (TITO drift)."),
    EventField("output_token_ids", pa.list_(pa.int32()), _TURN, required_by=_TURN, tokens=True,
               doc="The token ids the engine sampled, exactly as it returned them."),
    EventField("output_logprobs", pa.list_(pa.float32()), _TURN, required_by=_TURN, tokens=True,
               doc="The engine's logprob of each output token (finite, <= 0), aligned with `output_token_ids`."),
    EventField("loss_mask", pa.list_(pa.bool_()), _TURN, tokens=True,
               doc="Which output tokens the trainer may learn from, aligned with `output_token_ids` (default: all)."),
    EventField("finish_reason", pa.string(), _TURN, feeds=(Feed("turns"),),
               doc="Why the engine stopped generating (`stop`, `length`, …)."),
    EventField("context_used_fraction", pa.float32(), _TURN, feeds=(Feed("turns"),),
               doc="Share of `context_budget_tokens` the context filled after this turn."),
    EventField("nudged", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),),
               doc="The harness appended a context nudge (the context passed 80% of its budget) to this turn's input."),
    EventField("tito_drift", pa.bool_(), _TURN, feeds=(Feed("turns", default="false"),),
               doc="The turn's input did not extend the previous input + output: re-tokenised history or a re-rendered template."),
    EventField(
        "latency_s",
        pa.float32(),
        (TURN, TOOL_RESULT),
        feeds=(Feed("turns"), Feed("tool_calls", source=TOOL_RESULT)),
        doc="Seconds the engine took for a turn, or the tool for a tool result.",
    ),
    # tool_call / tool_result
    EventField("call_id", pa.string(), _TOOL, required_by=_TOOL, feeds=(Feed("tool_calls"),),
               doc="Links a `tool_result` to its `tool_call`."),
    EventField("tool_name", pa.string(), _TOOL, required_by=_TOOL, feeds=(Feed("tool_calls"),),
               doc="The tool the model called."),
    EventField(
        "arguments", pa.string(), (TOOL_CALL,), json=True, feeds=(Feed("tool_calls", source=TOOL_CALL),),
        doc="The call's arguments, as JSON.",
    ),
    EventField("is_code_execution", pa.bool_(), _TOOL, feeds=(Feed("tool_calls", default="false"),),
               doc="The tool runs code (the code-execution ratio counts these calls)."),
    EventField("ok", pa.bool_(), _RESULT, required_by=_RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),),
               doc="The tool ran and succeeded."),
    EventField("error_type", pa.string(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),),
               doc="What kind of error the tool hit, when not ok."),
    EventField("timed_out", pa.bool_(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "false"),),
               doc="The tool ran past its timeout."),
    EventField("truncated", pa.bool_(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "false"),),
               doc="The tool's output was cut to the runner's limit before it reached the model."),
    EventField("output_tokens", pa.int64(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT),),
               doc="Tokens the tool's output added to the context (the ids arrive once, as the next turn's input)."),
    EventField("retries", pa.int32(), _RESULT, feeds=(Feed("tool_calls", TOOL_RESULT, "0"),),
               doc="Times the runner retried the call (a malformed call, a transient error)."),
    # reward
    EventField("reward", pa.float64(), (REWARD,), feeds=(Feed("trajectories", source=REWARD), Feed("rewards")),
               doc="The verifier's reward; null with a `verifier_error` when there is no valid reward (never trained as 0)."),
    EventField("reward_components", pa.string(), (REWARD,), json=True, feeds=(Feed("rewards"),),
               doc="Named parts of the reward (name -> value), as JSON."),  # name -> value
    EventField("verifier", pa.string(), (REWARD,), feeds=(Feed("rewards"),),
               doc="The verifier that scored the trajectory."),
    EventField("verifier_error", pa.string(), (REWARD,), feeds=(Feed("trajectories", source=REWARD), Feed("rewards")),
               doc="Why the verifier could not score (a system failure, not the model's)."),
    # trajectory_finished
    EventField(
        "status", pa.string(), _FINISHED, required_by=_FINISHED, allowed=STATUSES, feeds=(_LAST_FINISHED,),
        doc="How the trajectory ended: completed, context_exhausted, max_turns, timeout or error.",
    ),
    EventField("failure_origin", pa.string(), _FINISHED, allowed=FAILURE_ORIGINS, feeds=(_LAST_FINISHED,),
               doc="Whose failure it was: `system` (never trained on as reward 0) or `model`; null when it did not fail."),
    EventField("failure_label", pa.string(), _FINISHED, allowed=FAILURE_LABELS, feeds=(_LAST_FINISHED,),
               doc="The failure's label in the taxonomy: model_capability, tool_design, harness_behavior, env_dependency, verifier_error or infra."),
    EventField("message", pa.string(), _FINISHED, feeds=(_LAST_FINISHED,),
               doc="What went wrong, in words."),
    # policy_updated / batch_consumed
    EventField(
        "step",
        pa.int64(),
        (POLICY_UPDATED, BATCH_CONSUMED),
        required_by=(POLICY_UPDATED, BATCH_CONSUMED),
        feeds=(Feed("policy_versions"), Feed("batch_consumption")),
        doc="The trainer step.",
    ),
    EventField("checkpoint", pa.string(), (POLICY_UPDATED,), feeds=(Feed("policy_versions"),),
               doc="Where the step's weights were saved."),
    EventField("metrics", pa.string(), (POLICY_UPDATED,), json=True, feeds=(Feed("policy_versions"),),
               doc="The step's metrics, as JSON."),
    EventField(
        "trainer_version",
        pa.int64(),
        (BATCH_CONSUMED,),
        required_by=(BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption"),),
        doc="The trainer's policy version when it consumed the batch.",
    ),
    EventField(
        "consumed_trajectory_ids",
        pa.list_(pa.string()),
        (BATCH_CONSUMED,),
        required_by=(BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="trajectory_id", sql="unnest(consumed_trajectory_ids)"),),
        doc="The trajectories the step trained on.",
    ),
    EventField(
        "consumed_staleness",
        pa.list_(pa.int64()),
        (BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="staleness", sql="unnest(consumed_staleness)"),),
        doc="Each consumed trajectory's staleness (`trainer_version` − its `policy_version_min`), in `consumed_trajectory_ids` order.",
    ),
    # anything else a producer wants to keep
    EventField("attributes", pa.string(), ALL, json=True,
               doc="Anything else a producer wants to keep, as JSON."),
    # added after the first release: new fields go last, so stored tables gain a trailing column
    EventField("advantage", pa.float64(), _TURN, feeds=(Feed("turns"),),
               doc="The advantage the trainer gave this turn, where it recorded one."),  # the trainer's, for this turn
    EventField(
        "consumed_advantages",
        pa.list_(pa.float64()),
        (BATCH_CONSUMED,),
        feeds=(Feed("batch_consumption", column="advantage", sql="unnest(consumed_advantages)"),),
        doc="The advantage each consumed trajectory got at that step, in `consumed_trajectory_ids` order.",
    ),  # the advantage each consumed trajectory got at that step, in `consumed_trajectory_ids` order
    # re-scoring: a verifier run again on stored trajectories appends rewards of its own version
    EventField(
        "verifier_version",
        pa.string(),
        (REWARD,),
        feeds=(Feed("trajectories", source=REWARD), Feed("rewards")),
        doc="The version of the verifier that gave the reward: null for the reward recorded with the "
        "episode, the version `trajlake rescore` was given for a re-score (the latest reward wins).",
    ),
    EventField("final_answer", pa.string(), _FINISHED,
               doc="What the episode submitted for verification, as text (a re-score judges it again)."),
    EventField("artifacts", pa.string(), _FINISHED, json=True,
               doc="The files the episode left (a list of {name, uri, bytes, sha256}, as JSON): what a "
               "verifier reads again when it re-scores."),
)
"""Type-specific fields, grouped by the event type that introduces them."""

# fmt: on

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
