"""Synthetic agent-RL workload: realistic event streams written through a bus.

Token ids follow a Zipf law over the vocabulary (frequent tokens have small ids, as in BPE
vocabularies); logprobs are mostly near 0 with a heavy tail, as sampled tokens are. Tasks
have a difficulty, prompt groups hold several samples of one task, policy versions advance
over the run (some trajectories span two), tools fail, time out and truncate at
configurable rates, and a fraction of trajectories end in system failures.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake.ingest import codec, shutdown
from trajlake.ingest.bus.base import Message, Publisher
from trajlake.ingest.shutdown import StopRequested
from trajlake.rollout.config import LoadgenConfig
from trajlake.schemas import events as ev

TOOLS = (("python", True), ("bash", True), ("search", False), ("calculator", False), ("file_edit", False))
ENVIRONMENTS = ("swe", "math", "web")
SYSTEM_LABELS = ("infra", "env_dependency", "verifier_error", "harness_behavior", "tool_design")


@dataclass
class LoadgenCounts:
    """What a run produced (`stopped`: the signal that ended it early; every trajectory counted was published)."""

    events: int = 0
    trajectories: int = 0
    turns: int = 0
    tokens: int = 0
    messages: int = 0
    stopped: StopRequested | None = None


class TokenSampler:
    """Zipf-distributed token ids and realistic logprobs, drawn in bulk with numpy."""

    FIRST_POOL = 1 << 12
    POOL = 1 << 20

    def __init__(self, vocab_size: int, zipf_a: float, rng: np.random.Generator) -> None:
        self.rng = rng
        ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
        weights = ranks**-zipf_a
        self.cdf = np.cumsum(weights / weights.sum())
        self._ids = np.empty(0, np.int32)
        self._lps = np.empty(0, np.float32)
        self._pools = {"ids": self.FIRST_POOL, "lps": self.FIRST_POOL}

    def _pool(self, kind: str, n: int) -> int:
        """How many to draw: at least `n`; pools double up to POOL, so a small run draws little."""
        size = self._pools[kind]
        self._pools[kind] = min(2 * size, self.POOL)
        return max(n, size)

    def ids(self, n: int) -> np.ndarray:
        if len(self._ids) < n:
            fresh = np.searchsorted(self.cdf, self.rng.random(self._pool("ids", n)))
            self._ids = np.concatenate([self._ids, np.minimum(fresh, len(self.cdf) - 1).astype(np.int32)])
        out, self._ids = self._ids[:n], self._ids[n:]
        return out

    def logprobs(self, n: int) -> np.ndarray:
        """Mostly confident tokens (near 0), some uncertain, a heavy tail of surprising ones."""
        if len(self._lps) < n:
            self._lps = np.concatenate([self._lps, self._draw_logprobs(self._pool("lps", n))])
        out, self._lps = self._lps[:n], self._lps[n:]
        return out

    def _draw_logprobs(self, n: int) -> np.ndarray:
        kind = self.rng.random(n)
        lp = -self.rng.exponential(0.003, n)
        mid = kind > 0.75
        lp[mid] = -self.rng.exponential(0.6, int(mid.sum()))
        tail = kind > 0.96
        lp[tail] = -self.rng.exponential(4.0, int(tail.sum()))
        return np.maximum(lp, -60.0).astype(np.float32)


def _length(rng: np.random.Generator, mean: int) -> int:
    return max(1, int(rng.gamma(4.0, mean / 4.0)))


class _ColumnBatch:
    """Events of many trajectories, kept as sparse columns and turned into Arrow in one go.

    It offers the Recorder's trajectory API (`turn`, `tool_call`, …) without building a
    dict per event, which makes loadgen about ten times faster at millions of events. Its
    columns are `EVENTS_SCHEMA`'s and each event type takes the fields the model gives it.
    """

    def __init__(self, run_id: str, vocab_size: int) -> None:
        self.run_id = run_id
        self.vocab_size = vocab_size
        self.n = 0
        self.cols: dict[str, tuple[list[int], list[Any]]] = {}
        self.spans: list[tuple[str | None, int, int]] = []  # (message key, first row, end row)
        self.trajectory_id: str | None = None
        self.seq = 0
        self.turn_index = 0

    def add(self, event_type: str, **fields: Any) -> None:
        """Append one event; its fields are checked against the event model, JSON ones encoded."""
        unknown = fields.keys() - ev.body_fields_of(event_type)
        if unknown:
            raise TypeError(f"a {event_type} event carries no field(s) {sorted(unknown)}")
        for name in ev.JSON_FIELDS & fields.keys():
            if fields[name] is not None and not isinstance(fields[name], str):
                fields[name] = json.dumps(fields[name], sort_keys=True, separators=(",", ":"))
        row = self.n
        self.n += 1
        fields.update(
            event_id=ev.new_event_id(), event_type=event_type, schema_version=ev.SCHEMA_VERSION,
            run_id=self.run_id, producer_id="loadgen", event_time=time.time_ns() // 1000,
        )  # fmt: skip
        if self.trajectory_id is not None:
            fields.update(trajectory_id=self.trajectory_id, seq=self.seq)
            self.seq += 1
        for name, value in fields.items():
            if value is not None:
                rows, values = self.cols.setdefault(name, ([], []))
                rows.append(row)
                values.append(value)

    # the Recorder's trajectory API ---------------------------------------------------------
    def start(self, **fields: Any) -> _ColumnBatch:
        self.trajectory_id, self.seq, self.turn_index = ev.new_event_id(), 0, 0
        self.spans.append((self.trajectory_id, self.n, -1))
        self.add(ev.TRAJECTORY_STARTED, vocab_size=self.vocab_size, **fields)
        return self

    def turn(self, output_token_ids: np.ndarray, output_logprobs: np.ndarray, policy_version: int,
             *, input_token_ids: np.ndarray, **fields: Any) -> None:  # fmt: skip
        self.add(
            ev.TURN, turn_index=self.turn_index, policy_version=policy_version, input_token_ids=input_token_ids,
            input_is_full=False, output_token_ids=output_token_ids, output_logprobs=output_logprobs,
            loss_mask=np.ones(len(output_token_ids), dtype=bool), tito_drift=False, vocab_size=self.vocab_size,
            **fields,
        )  # fmt: skip
        self.turn_index += 1

    def tool_call(self, tool_name: str, arguments: dict[str, Any], *, is_code_execution: bool) -> str:
        call_id = f"call-{self.seq}"
        self.add(ev.TOOL_CALL, call_id=call_id, tool_name=tool_name, is_code_execution=is_code_execution,
                 arguments=arguments)  # fmt: skip
        return call_id

    def tool_result(self, call_id: str, tool_name: str, **fields: Any) -> None:
        self.add(ev.TOOL_RESULT, call_id=call_id, tool_name=tool_name, **fields)

    def reward(
        self, value: float | None, *, components: dict[str, float] | None = None, **fields: Any
    ) -> None:
        self.add(ev.REWARD, reward=value, reward_components=components or None, **fields)

    def finish(self, status: str, **fields: Any) -> None:
        self.add(ev.TRAJECTORY_FINISHED, status=status, **fields)
        key, first, _ = self.spans[-1]
        self.spans[-1] = (key, first, self.n)
        self.trajectory_id = None

    def policy_updated(self, version: int, step: int, checkpoint: str) -> None:
        first = self.n
        self.add(ev.POLICY_UPDATED, policy_version=version, step=step, checkpoint=checkpoint)
        self.spans.append((self.run_id, first, self.n))

    # -> Arrow ------------------------------------------------------------------------------
    def table(self) -> pa.Table:
        arrays = []
        for f in ev.EVENTS_SCHEMA:
            rows, values = self.cols.get(f.name, ([], []))
            arrays.append(_column(f.type, self.n, np.asarray(rows, dtype=np.int64), values))
        return pa.Table.from_arrays(arrays, schema=ev.EVENTS_SCHEMA)

    def publish(self, bus: Publisher) -> int:
        """Send one message per trajectory (and per policy update), or per pack of them where the
        bus packs (`Publisher.packing`); return messages sent."""
        table = self.table()
        packing = bus.packing()
        if packing is None:
            packs = [[i] for i in range(len(self.spans))]
        else:
            sizes = [table.slice(first, end - first).nbytes for _, first, end in self.spans]
            packs = packing.packs([key for key, _, _ in self.spans], sizes)
        for pack in packs:
            spans = [self.spans[i] for i in pack]
            if len(spans) == 1:
                rows = table.slice(spans[0][1], spans[0][2] - spans[0][1])
            else:  # one contiguous record batch: the sink reads a message's batches one by one
                rows = table.take(np.concatenate([np.arange(first, end) for _, first, end in spans]))
            value = codec.encode_arrow(rows)
            bus.send(
                Message(
                    key=spans[0][0],
                    value=value,
                    headers={codec.CONTENT_TYPE_HEADER: codec.ARROW_CONTENT_TYPE},
                )
            )
        return len(packs)


def _column(type_: pa.DataType, n: int, rows: np.ndarray, values: list[Any]) -> pa.Array:
    valid = np.zeros(n, dtype=bool)
    valid[rows] = True
    if pa.types.is_list(type_):
        lengths = np.zeros(n, dtype=np.int32)
        lengths[rows] = [len(v) for v in values]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        flat = np.concatenate(values) if values else np.empty(0)
        child = pa.array(flat.astype(type_.value_type.to_pandas_dtype()), type=type_.value_type)
        return pa.ListArray.from_arrays(pa.array(offsets), child, type=type_, mask=pa.array(~valid))
    if pa.types.is_string(type_):
        full = np.full(n, None, dtype=object)
        full[rows] = values
        return pa.array(full, type=type_)
    dtype = (
        np.int64
        if pa.types.is_timestamp(type_)
        else (bool if pa.types.is_boolean(type_) else type_.to_pandas_dtype())
    )
    full = np.zeros(n, dtype=dtype)
    full[rows] = values
    return pa.array(full, type=type_, mask=~valid)


def generate(
    bus: Publisher,
    config: LoadgenConfig,
    on_trajectory: Callable[[int], None] | None = None,
    chunk: int = 500,
) -> LoadgenCounts:
    """Write `config.trajectories` synthetic trajectories to `bus`; return what was produced.

    A stop signal (`shutdown.StopRequested`) ends the run between two trajectories: what was
    generated is published, and the counts (with `stopped` set) say how much that was.
    """
    rng = np.random.default_rng(config.seed)
    tokens = TokenSampler(config.vocab_size, config.zipf_a, rng)
    counts = LoadgenCounts()
    n_groups = max(1, -(-config.trajectories // config.group_size))
    difficulty = rng.beta(1.5, 1.5, n_groups)
    per_version = max(1, config.trajectories // config.policy_versions)
    version = -1
    batch = _ColumnBatch(config.run_id, config.vocab_size)
    try:
        for i in range(config.trajectories):
            with shutdown.deferred():  # a trajectory is generated and counted whole
                v = config.first_version + min(i // per_version, config.policy_versions - 1)
                if v != version:
                    version = v
                    batch.policy_updated(version, step=version, checkpoint=f"ckpt/step-{version}")
                group = i // config.group_size
                _trajectory(
                    batch, config, rng, tokens, config.first_group + group, i % config.group_size, version,
                    difficulty[group], counts,
                )  # fmt: skip
                counts.trajectories += 1
                if on_trajectory:
                    on_trajectory(i)
                if len(batch.spans) >= chunk:
                    batch = _publish(batch, bus, counts)
    except shutdown.StopRequested as stop:
        counts.stopped = stop
    try:
        with shutdown.deferred():
            _publish(batch, bus, counts)
        bus.flush()  # a stop here leaves the rest to the bus's own stop: delivered or spooled
    except shutdown.StopRequested as stop:
        counts.stopped = stop
    return counts


def _publish(batch: _ColumnBatch, bus: Publisher, counts: LoadgenCounts) -> _ColumnBatch:
    """Send what `batch` holds and count it; return a fresh batch."""
    if batch.n:
        counts.events += batch.n
        counts.messages += batch.publish(bus)
    return _ColumnBatch(batch.run_id, batch.vocab_size)


def _trajectory(
    recorder: _ColumnBatch,
    config: LoadgenConfig,
    rng: np.random.Generator,
    tokens: TokenSampler,
    group: int,
    sample: int,
    version: int,
    difficulty: float,
    counts: LoadgenCounts,
) -> None:
    env = ENVIRONMENTS[group % len(ENVIRONMENTS)]
    traj = recorder.start(
        task_id=f"task-{group:06d}",
        group_id=f"group-{group:06d}",
        sample_index=sample,
        environment=env,
        harness="loadgen",
        model="synthetic-7b",
        sampling_params={"temperature": 1.0, "top_p": 1.0},
        context_budget_tokens=config.context_budget_tokens,
    )
    n_turns = min(config.max_turns, max(1, int(rng.poisson(config.turns - 1)) + 1))
    system_failure = rng.random() < config.system_failure_rate
    fail_at = int(rng.integers(0, n_turns)) if system_failure else -1
    used = 0
    nudged_once = False
    status, origin, label = "completed", None, None
    appended = tokens.ids(_length(rng, config.prompt_tokens))
    for turn in range(n_turns):
        n_out = _length(rng, config.output_tokens)
        if used + len(appended) + n_out > config.context_budget_tokens:
            status, origin, label = "context_exhausted", "model", "model_capability"
            break
        out = tokens.ids(n_out)
        used += len(appended) + n_out
        fraction = used / config.context_budget_tokens
        nudge = fraction >= 0.8 and not nudged_once
        nudged_once |= nudge
        turn_version = version + (1 if turn > 0 and rng.random() < 0.05 else 0)
        traj.turn(
            out,
            tokens.logprobs(n_out),
            min(turn_version, config.first_version + config.policy_versions - 1),
            input_token_ids=appended,
            finish_reason="stop",
            context_used_fraction=fraction,
            nudged=nudge,
            latency_s=float(rng.gamma(2.0, 0.5)),
        )
        counts.turns += 1
        counts.tokens += len(appended) + n_out
        if turn == fail_at:
            status, origin = rng.choice(["error", "timeout"]), "system"
            label = str(rng.choice(SYSTEM_LABELS))
            break
        appended = tokens.ids(0)
        if turn < n_turns - 1 and rng.random() < config.tool_call_rate:
            appended = _tool(traj, config, rng, tokens)
    if status == "completed" and n_turns == config.max_turns:
        status, origin, label = "max_turns", "model", "model_capability"
    if origin == "system" and label == "verifier_error":
        traj.reward(None, verifier="unit_tests", verifier_error="verifier timed out after 60s")
    elif origin != "system":
        solved = status == "completed" and rng.random() > difficulty
        traj.reward(float(solved), components={"tests_passed": float(solved)}, verifier="unit_tests")
        if not solved and status == "completed":
            origin, label = "model", "model_capability"
    traj.finish(str(status), failure_origin=origin, failure_label=label)


def _tool(
    traj: _ColumnBatch, config: LoadgenConfig, rng: np.random.Generator, tokens: TokenSampler
) -> np.ndarray:
    name, is_code = TOOLS[int(rng.integers(0, len(TOOLS)))]
    call = traj.tool_call(name, {"input": f"arg-{int(rng.integers(0, 1000))}"}, is_code_execution=is_code)
    timed_out = rng.random() < config.tool_timeout_rate
    failed = timed_out or rng.random() < config.tool_error_rate
    truncated = not failed and rng.random() < config.truncation_rate
    output = tokens.ids(_length(rng, config.env_tokens) if config.env_tokens else 0)
    traj.tool_result(
        call,
        name,
        ok=not failed,
        error_type=("timeout" if timed_out else "tool_error") if failed else None,
        timed_out=timed_out,
        truncated=truncated,
        output_tokens=len(output),
        latency_s=float(rng.gamma(2.0, 0.3)),
    )
    return output
