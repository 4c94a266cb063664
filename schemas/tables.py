"""Arrow schemas of the lake's tables, and what each column means (the contract of docs/design.md#tables).

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
from trajlake.schemas.fields import FIELDS, feeds_into

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

DRIFT_BY_STALENESS = pa.list_(
    pa.struct([("staleness", _I64), ("n_tokens", _I64), ("abs_diff", pa.float64()), ("kl", pa.float64())])
)
"""`trainer_steps.drift_by_staleness`: per staleness (trainer version − the version that generated
the tokens), the tokens, their mean |Δ logprob| and approximate KL."""

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
        # added later, so stored tables gain them as trailing columns
        ("mismatch_tokens", _I64),
        ("drift", pa.float64()),
        ("drift_kl", pa.float64()),
        ("drift_tokens", _I64),
        ("drift_by_staleness", DRIFT_BY_STALENESS),
        ("batch_step", _I64),
    ]
)
"""Per-step trainer metrics, written by the trainer (not a projection).

`mismatch` is the engine mismatch: mean |engine − trainer logprob| over the `mismatch_tokens`
tokens that the weights the trainer held generated (null when none did); `drift` / `drift_kl`
(mean |Δ logprob|, approximate KL(behaviour ‖ trainer)) are the same gaps over the `drift_tokens`
that older weights generated, and `drift_by_staleness` splits them by how many versions older."""

_F32_LIST = pa.list_(pa.float32())
_BOOL_LIST = pa.list_(pa.bool_())

TRAINER_TOKENS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("step", _I64),
        ("trainer_version", _I64),
        ("rank", pa.int32()),
        ("trajectory_id", pa.string()),
        ("seq", _I64),
        ("turn_index", pa.int32()),
        ("policy_loss", pa.string()),
        ("advantage", pa.float32()),
        ("trainer_logprobs", _F32_LIST),
        ("entropies", _F32_LIST),
        ("ratios", _F32_LIST),
        ("clipped", _BOOL_LIST),
        ("masked", _BOOL_LIST),
        ("created_at", _TS),
    ]
)
"""Per-token trainer values, written by the trainer (`trainer/token_values.py`, not a projection): one
row per step, trajectory and turn, each list aligned with the turn's `output_token_ids`; an element is
null where the step did not train on the token (its loss mask was off)."""

REWARDS_SCHEMA = _projection(
    "rewards", "run_id", "trajectory_id", "seq", "verifier", "verifier_version", "reward", "verifier_error",
    "reward_components", "event_time",
)  # fmt: skip
"""One row per `reward` event: the reward recorded with the episode and each re-score's, side by side."""

LABELS_SCHEMA = pa.schema(
    [
        ("label_id", pa.string()),
        ("run_id", pa.string()),
        ("trajectory_id", pa.string()),
        ("turn_index", pa.int32()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("author", pa.string()),
        ("created_at", _TS),
    ]
)
"""Labels people and tools put on trajectories and turns (append-only; written by `trajlake label` and
the browser, not a projection): the latest row per (run, trajectory, turn, key) is the label's value."""

CURRENT_LABELS_SQL = """
select * from (
  select * from {table}
  qualify row_number() over (
    partition by run_id, trajectory_id, turn_index, key order by created_at desc, label_id desc) = 1
) where value is not null
"""
"""The labels in force: the latest row per run, trajectory, turn and key, unless it cleared the label
(the SQL view `current_labels`; `{table}` is the relation of the stored rows)."""

PROJECTION_TABLES = ("trajectories", "turns", "tool_calls", "policy_versions", "batch_consumption", "rewards")
"""Tables that are a pure function of `events`; `trajlake rebuild` recreates them."""

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    "trajectories": TRAJECTORIES_SCHEMA,
    "turns": TURNS_SCHEMA,
    "tool_calls": TOOL_CALLS_SCHEMA,
    "dead_letters": DEAD_LETTERS_SCHEMA,
    "policy_versions": POLICY_VERSIONS_SCHEMA,
    "batch_consumption": BATCH_CONSUMPTION_SCHEMA,
    "trainer_steps": TRAINER_STEPS_SCHEMA,
    "rewards": REWARDS_SCHEMA,
    "labels": LABELS_SCHEMA,
    "trainer_tokens": TRAINER_TOKENS_SCHEMA,
}

TOKEN_VIEW_COLUMNS: dict[str, tuple[str, ...]] = {
    "trajectories": ("token_ids", "logprobs", "loss_mask"),
    "turns": ("input_token_ids", "output_token_ids", "output_logprobs", "loss_mask"),
}
"""Columns the SQL views add to a stored table, assembled from `events` (`store/sql.py`)."""

_TOKEN_SUMMARY_DOCS = {
    "n_input_tokens": "Tokens in the event's `input_token_ids` (what the turn appended to the context).",
    "n_output_tokens": "Tokens the model generated in the turn.",
    "n_loss_tokens": "Output tokens the loss mask keeps.",
    "sum_logprob": "Sum of the output tokens' logprobs (the engine's).",
    "output_repetition": "Share of the output's 4-grams that repeat an earlier one of the same output "
    "(null under 4 tokens): garbled, looping output scores high.",
}

COLUMN_DOCS: dict[str, dict[str, str]] = {
    "events": _TOKEN_SUMMARY_DOCS,
    "trajectories": {
        "policy_version_min": "Oldest weight version among the trajectory's turns (null if a turn's is "
        "unknown); staleness at trainer version v is v minus this.",
        "policy_version_max": "Newest weight version among its turns: above the min, weights changed mid-trajectory.",
        "finished": "A `trajectory_finished` event arrived.",
        "n_turns": "Model turns.",
        "n_tool_calls": "Tool calls.",
        "n_tool_errors": "Tool calls whose result was not ok.",
        "n_tool_timeouts": "Tool calls that timed out.",
        "n_tool_truncated": "Tool results cut to the runner's limit.",
        "n_tool_retries": "Retries of its tool calls, summed.",
        "n_code_exec": "Tool calls that executed code.",
        "assistant_tokens": "Tokens the model generated, over every turn.",
        "env_tokens": "Tokens the environment appended after the first turn (tool results, user messages).",
        "total_tokens": "Length of the whole sequence: prompt + assistant + environment tokens.",
        "sum_logprob": "Sum of the engine's logprobs of every generated token.",
        "context_peak_fraction": "Largest share of the context budget any turn used.",
        "nudged": "Any turn was nudged about the context budget.",
        "n_nudges": "Turns that were nudged.",
        "tito_drift": "Any turn broke the prefix invariant (TITO drift).",
        "n_drift_turns": "Turns that broke the prefix invariant.",
        "started_at": "`event_time` of its `trajectory_started`.",
        "finished_at": "`event_time` of its `trajectory_finished` (null while it runs).",
        "turns_by_version": "Per weight version among its turns: their count, output tokens and logprob sum "
        "(per-version figures such as rollout entropy read this row, not the turns).",
        "generation_s": "Seconds the engine spent on its turns (the sum of their `latency_s`).",
        "slowest_turn_s": "The longest turn's `latency_s`.",
        "n_timed_turns": "Turns that recorded a latency.",
        "token_ids": "View column: the whole sequence in order (prompt, each output, each appended "
        "environment token), as the engine saw and sampled it.",
        "logprobs": "View column: aligned with `token_ids`; the engine's logprob of each sampled token, "
        "0 for a token the policy did not sample.",
        "loss_mask": "View column: aligned with `token_ids`; true where the trainer may learn (sampled and "
        "kept by the turn's mask), false elsewhere.",
    },
    "turns": {
        "event_id": "The `turn` event's id in `events`.",
        "seq": "The turn event's `seq` in its trajectory.",
        "event_time": "When the turn was recorded.",
        **_TOKEN_SUMMARY_DOCS,
    },
    "tool_calls": {
        "has_result": "A `tool_result` arrived for the call.",
        "call_seq": "`seq` of the `tool_call` event.",
        "result_seq": "`seq` of the `tool_result` event (null without one).",
        "called_at": "When the call was recorded.",
        "finished_at": "When its result was recorded (null without one).",
        "latency_s": "Seconds the tool took (from its result).",
    },
    "dead_letters": {
        "dead_letter_id": "Id of the dead letter.",
        "received_at": "When the sink rejected it.",
        "source": "Where it came from (`kafka`, `inprocess`, an importer).",
        "topic": "Kafka topic, where it came from Kafka.",
        "partition": "Kafka partition.",
        "offset": "Kafka offset: with the partition, where to find the message again.",
        "key": "The message key (the trajectory id, as producers write it).",
        "content_type": "The message's content type (Arrow IPC or JSON).",
        "raw": "The raw bytes as received (the whole message, or the one event), so nothing is lost.",
        "reason": "Why it was rejected: the invariant it broke, with the facts.",
        "event_id": "The rejected event's id, where it could be read.",
        "event_type": "The rejected event's type, where it could be read.",
        "run_id": "The rejected event's run, where it could be read.",
        "trajectory_id": "The rejected event's trajectory, where it could be read.",
    },
    "policy_versions": {"event_time": "When the trainer published the version."},
    "batch_consumption": {
        "trajectory_id": "A trajectory the step trained on (one row per consumed trajectory).",
        "staleness": "Its staleness at that step: `trainer_version` − its `policy_version_min`.",
        "advantage": "The advantage the step gave it (null when the trainer recorded none).",
        "event_time": "When the trainer committed the batch.",
    },
    "rewards": {
        "seq": "The reward event's `seq` in its trajectory: a later one is a later score.",
        "event_time": "When the reward was recorded (for a re-score: when `trajlake rescore` ran).",
    },
    "labels": {
        "label_id": "Id of the label row.",
        "run_id": "The run of the labelled trajectory.",
        "trajectory_id": "The labelled trajectory.",
        "turn_index": "The labelled turn (null: the whole trajectory).",
        "key": "What the label says, e.g. `env_bug` or `reward_hack`.",
        "value": "Its value (free text, `true` by default); null clears the label.",
        "author": "Who put it there (a person, or a tool).",
        "created_at": "When; the latest row per run, trajectory, turn and key is the label's value.",
    },
    "trainer_tokens": {
        "run_id": "The run the trainer trains on.",
        "step": "The trainer step (`TrainerConfig.token_values_every` picks which steps keep their values).",
        "trainer_version": "The policy version the step trained (as in `trainer_steps`).",
        "rank": "The trainer rank that took the step.",
        "trajectory_id": "A trajectory the step trained on.",
        "seq": "The `turn` event's `seq`: joins `turns` (and its `output_token_ids`) on run, trajectory and seq.",
        "turn_index": "The turn's index in its trajectory.",
        "policy_loss": "The loss the step trained with (ppo, dppo, dppo_kl, glm5, tis): what `clipped` and "
        "`masked` mean.",
        "advantage": "The advantage of every token of the turn (the step's losses broadcast the sequence's).",
        "trainer_logprobs": "Per output token: the trainer's logprob of it under the weights the step trained.",
        "entropies": "Per output token: the entropy of the trainer's distribution at it.",
        "ratios": "Per output token: the importance ratio exp(trainer − engine logprob) the loss weighed.",
        "clipped": "Per output token: the loss's trust region intervened (PPO clipped the ratio, DPPO masked "
        "the token, GLM-5 or TIS truncated its weight).",
        "masked": "Per output token: the loss zeroed its gradient (DPPO's trust-region mask, PPO's clip).",
        "created_at": "When the step recorded them.",
    },
    "trainer_steps": {
        "run_id": "The run the trainer trains on.",
        "step": "The trainer step.",
        "trainer_version": "The policy version the step produced (its weights were the version before).",
        "rank": "The trainer rank that took the step.",
        "loss": "The step's loss.",
        "entropy": "Mean entropy of the policy over the trained tokens.",
        "grad_norm": "Gradient norm before clipping.",
        "clip_fraction": "Share of trained tokens whose importance ratio the loss clipped.",
        "masked_fraction": "Share of trained tokens whose gradient the trust region zeroed.",
        "mismatch": "Engine mismatch: mean |engine − trainer logprob| over the tokens the trainer's own "
        "weights generated (null when none did); healthy below 0.03.",
        "mismatch_healthy": "`mismatch` is below the configured threshold.",
        "staleness_mean": "Mean staleness of the batch's trajectories.",
        "staleness_max": "Largest staleness in the batch.",
        "n_trajectories": "Trajectories in the batch.",
        "n_tokens": "Tokens in the batch.",
        "reward_mean": "Mean reward of the batch.",
        "duration_s": "Seconds the step took.",
        "created_at": "When the step finished.",
        "mismatch_tokens": "Tokens the mismatch is measured on.",
        "drift": "Policy drift: mean |Δ logprob| on the tokens older weights generated.",
        "drift_kl": "Approximate KL(behaviour ‖ trainer) on those tokens.",
        "drift_tokens": "Tokens the drift is measured on.",
        "drift_by_staleness": "Drift split by staleness: per staleness, its tokens, mean |Δ logprob| and KL.",
        "batch_step": "The step whose hand-out (`batch_consumption.step`) the step trained on: its own, or an "
        "earlier one for a batch trained on again (the overfit check); null in rows written before it was kept.",
    },
}
"""What each column means, where the event field of its name (`EventField.doc`) does not say it:
columns the projections derive, the view columns, and the tables that are not projections.
`docs/reference/tables.md` is generated from these and the fields."""

TABLE_DOCS: dict[str, str] = {
    "events": "Every event as it arrived, append-only: the source of truth that every projection is a "
    "function of. Token payloads are stored here, once.",
    "trajectories": "One row per trajectory: what it attempted, how it ended, its reward and its counts; the "
    "view adds the whole token sequence with its logprobs and loss mask.",
    "turns": "One row per model turn, with its token counts; the view adds the turn's token lists.",
    "tool_calls": "One row per tool call, joined with its result.",
    "dead_letters": "One row per rejected message or event: its raw bytes, where it came from, and why.",
    "policy_versions": "One row per `policy_updated` event: the weight versions a trainer published.",
    "batch_consumption": "One row per trajectory a trainer step consumed: at which version, how stale, with "
    "which advantage.",
    "trainer_steps": "One row per trainer step and rank, written by the trainer: loss, entropy, clipping, "
    "engine mismatch and policy drift.",
    "rewards": "One row per `reward` event: the reward recorded with the episode and every re-score "
    "(`trajlake rescore`), each with its verifier version; `trajectories.reward` is the latest.",
    "trainer_tokens": "One row per step, trajectory and turn the trainer trained on: per output token, "
    "its trainer logprob, entropy, importance ratio, and whether the loss clipped or masked it.",
    "labels": "Labels on trajectories and turns (`env_bug`, `reward_hack`, …), append-only; the view "
    "`current_labels` keeps the latest value per run, trajectory, turn and key.",
}
"""What each table holds, one sentence each."""


def column_doc(table: str, column: str) -> str | None:
    """What `column` of `table` means: its own entry in `COLUMN_DOCS`, else the doc of the event field
    that feeds it or has its name; None when neither says."""
    own = COLUMN_DOCS.get(table, {}).get(column)
    if own:
        return own
    fed = next((f for f, feed in feeds_into(table) if (feed.column or f.name) == column), None)
    field = fed or next((f for f in FIELDS if f.name == column), None)
    return field.doc if field is not None else None
