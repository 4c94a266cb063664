"""Per-token trainer values, kept: what a step computed for each output token it trained on.

A step that keeps them (`TrainerConfig.token_values_every`) records, per trajectory and turn, its
output tokens' trainer logprobs, entropies and importance ratios exp(logπ − logμ), and what the
loss did to each (`PolicyLoss.clipped` / `.masked`: PPO's clip, DPPO's trust-region mask, GLM-5's
and TIS's truncated weights), in `trainer_tokens`, one row per (run, step, trajectory, turn) with
lists aligned with the turn's `output_token_ids` (join `turns` on run, trajectory and `seq`). The
lists are float32 and bool, written as the lake writes token lists (zstd; byte-stream split in the
`compact` token layout).

The trainer sees a trajectory as one sequence (`trainer/tokens.py`); each turn's outputs are found
in it from the turn events' token counts, read without their token lists.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.trainer.errors import TrainerError
from trajlake.trainer.tokens import sequence_start

if TYPE_CHECKING:
    from trajlake.store.lake import Lake
    from trajlake.trainer.batch import Batch

LISTS = ("trainer_logprobs", "entropies", "ratios", "clipped", "masked")
"""The per-token columns, in `TokenValues` order."""


@dataclass
class TokenValues:
    """What one step computed for each token of one sample's sequence (aligned with its `token_ids`)."""

    trainer_logprobs: np.ndarray
    entropies: np.ndarray
    ratios: np.ndarray
    clipped: np.ndarray
    masked: np.ndarray
    trained: np.ndarray
    """The step's loss mask: the other tokens' values were not computed."""


@dataclass(frozen=True)
class StepInfo:
    """The step the values are of, as `trainer_steps` records it (a batch trained again keeps its own `step`)."""

    step: int
    trainer_version: int
    rank: int
    policy_loss: str


def should_keep(step: int, every: int) -> bool:
    """Whether step `step` keeps its token values (every `every`-th step from 0; never with 0)."""
    return every > 0 and step % every == 0


def of_micro_batch(mb: Any, logprobs: Any, entropy: Any, out: Any) -> list[TokenValues]:
    """The values of each row of micro-batch `mb` (in `mb.indices` order), cut to its sequence."""
    import torch

    ratio = torch.exp((logprobs.detach() - mb.rollout_logprobs).clamp(-20.0, 20.0))
    floats = [t.detach().float().cpu().numpy() for t in (logprobs, entropy, ratio)]
    flags = [t.detach().bool().cpu().numpy() for t in (out.clipped, out.masked, mb.loss_mask)]
    lengths = mb.attention_mask.sum(dim=1).tolist()
    return [TokenValues(*(a[r, :n] for a in (*floats, *flags))) for r, n in enumerate(lengths)]


@dataclass(frozen=True)
class TurnSpan:
    """Where a turn's output tokens are in its trajectory's sequence."""

    seq: int
    turn_index: int
    start: int
    length: int


def turn_spans(lake: Lake, run_id: str, trajectory_ids: Sequence[str]) -> dict[str, list[TurnSpan]]:
    """Each trajectory's turns that its sequence holds, with where their outputs are in it.

    Read from the turn events' scalar columns: the token counts the lake stored with each event.
    """
    where = "event_type = 'turn' and run_id = ?"
    among = ("trajectory_id", list(trajectory_ids))
    columns = ["trajectory_id", "seq", "turn_index", "input_is_full", "n_input_tokens", "n_output_tokens"]
    turns = lake.read("events", columns, where, [run_id], among=among)
    if turns.column("n_input_tokens").null_count or turns.column("n_output_tokens").null_count:
        # events an older trajlake stored without their token summary: count the lists themselves
        select = ", ".join(columns[:4]) + ", len(input_token_ids) as n_input_tokens, "
        select += "len(output_token_ids) as n_output_tokens"
        turns = lake.read("events", where=where, params=[run_id], among=among, select=select)
    turns = turns.take(pc.sort_indices(turns, [("trajectory_id", "ascending"), ("seq", "ascending")]))
    rows = turns.to_pydict()
    by_trajectory: dict[str, list[int]] = {}
    for i, tid in enumerate(rows["trajectory_id"]):
        by_trajectory.setdefault(tid, []).append(i)
    spans: dict[str, list[TurnSpan]] = {}
    for tid, at in by_trajectory.items():
        at = at[sequence_start(np.array([bool(rows["input_is_full"][i]) for i in at])) :]
        position, mine = 0, []
        for i in at:
            n_out = rows["n_output_tokens"][i] or 0
            position += rows["n_input_tokens"][i] or 0
            mine.append(TurnSpan(rows["seq"][i], rows["turn_index"][i], position, n_out))
            position += n_out
        spans[tid] = mine
    return spans


def token_values_table(batch: Batch, spans: dict[str, list[TurnSpan]], step: StepInfo) -> pa.Table:
    """The `trainer_tokens` rows of a step on `batch`: one per sample and turn, from `batch.token_values`."""
    from trajlake.schemas.tables import TRAINER_TOKENS_SCHEMA

    if batch.token_values is None:
        raise ValueError("the step kept no token values: call policy_step with keep_token_values=True")
    scalars: dict[str, list[Any]] = {"trajectory_id": [], "seq": [], "turn_index": [], "advantage": []}
    parts: dict[str, list[np.ndarray]] = {name: [] for name in (*LISTS, "trained")}
    lengths: list[int] = []
    advantages = batch.advantages or [None] * len(batch.samples)
    for sample, values, advantage in zip(batch.samples, batch.token_values, advantages, strict=True):
        mine = spans.get(sample.trajectory_id, [])
        end = mine[-1].start + mine[-1].length if mine else 0
        if end != sample.n_tokens:
            raise TrainerError(
                f"trajectory {sample.trajectory_id} of run {batch.run_id}: its turn events hold {end} tokens, "
                f"the trained sequence {sample.n_tokens}; were its events rewritten since the sampler read them?"
            )
        for span in mine:
            cut = slice(span.start, span.start + span.length)
            for name in parts:
                parts[name].append(getattr(values, name)[cut])
            lengths.append(span.length)
            row = (sample.trajectory_id, span.seq, span.turn_index, advantage)
            for name, value in zip(scalars, row, strict=True):
                scalars[name].append(value)
    n = len(lengths)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    untrained = ~np.concatenate(parts.pop("trained")) if n else np.zeros(0, np.bool_)
    columns: dict[str, Any] = {
        "run_id": [batch.run_id] * n, "step": [step.step] * n, "trainer_version": [step.trainer_version] * n,
        "rank": [step.rank] * n, **scalars, "policy_loss": [step.policy_loss] * n,
        "created_at": [dt.datetime.now(dt.UTC)] * n,
    }  # fmt: skip
    for name, type_ in ((c, TRAINER_TOKENS_SCHEMA.field(c).type) for c in LISTS):
        flat = np.concatenate(parts[name]) if n else np.zeros(0)
        values = pa.array(flat.astype(type_.value_type.to_pandas_dtype()), type_.value_type, mask=untrained)
        columns[name] = pa.ListArray.from_arrays(offsets, values)
    return pa.Table.from_pydict(
        {k: columns[k] for k in TRAINER_TOKENS_SCHEMA.names}, schema=TRAINER_TOKENS_SCHEMA
    )


def record_token_values(lake: Lake, batch: Batch, step: StepInfo) -> int:
    """Append the token values a step kept on `batch` to `trainer_tokens`; return the table's version."""
    spans = turn_spans(lake, batch.run_id, batch.trajectory_ids)
    return lake.append("trainer_tokens", token_values_table(batch, spans, step))
