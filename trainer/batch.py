"""Batches the sampler hands out: samples with their token payloads, packed into micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class TrajectorySample:
    """One trajectory as the trainer sees it: scalars plus aligned token arrays."""

    trajectory_id: str
    group_id: str
    task_id: str | None
    reward: float
    policy_version_min: int
    staleness: int
    token_ids: np.ndarray
    logprobs: np.ndarray
    loss_mask: np.ndarray
    overlong: bool = False

    @property
    def n_tokens(self) -> int:
        """Length of the whole sequence."""
        return len(self.token_ids)


@dataclass
class SamplerStats:
    """What the sampler saw in the run, and what it left out, when it built a batch.

    Groups out of reach of the staleness window (every member finished and older than it) are
    not read row by row: their rows count as finished and as system failures, no reward or
    stale by what the lake holds, and `taken` counts leases of the groups within reach only.
    """

    finished: int = 0
    unfinished: int = 0
    taken: int = 0
    system_failures: int = 0
    no_reward: int = 0
    stale: int = 0
    unknown_version: int = 0
    """Finished without a known policy version (a turn recorded without one): staleness untold, left out."""
    overlong: int = 0
    zero_variance_groups: int = 0
    incomplete_groups_waiting: int = 0
    incomplete_groups_dropped: int = 0
    ready_groups: int = 0
    lost_races: int = 0
    late_members: int = 0
    """Samples that finished after their group was handed out incomplete; never trained on."""
    labelled: int = 0
    """Left out for a label the sampler excludes (`SamplerConfig.exclude_labels`: env_bug, reward_hack, …)."""

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain dict (for JSON and metrics)."""
        return dict(self.__dict__)


@dataclass
class MicroBatch:
    """Padded tensors of some samples of a batch (right-padded, [rows, longest])."""

    indices: list[int]
    input_ids: Any
    attention_mask: Any
    rollout_logprobs: Any
    loss_mask: Any
    prompt_index: Any
    rewards: Any


@dataclass
class Batch:
    """Prompt groups for one trainer step at `trainer_version`, with micro-batch packing."""

    run_id: str
    step: int
    trainer_version: int
    samples: list[TrajectorySample]
    micro_batches: list[list[int]]
    stats: SamplerStats = field(default_factory=SamplerStats)
    advantages: list[float] | None = None
    """Each sample's advantage as the step that trained on the batch computed it (sample order);
    None until a step ran. `Sampler.commit` keeps them in `batch_consumption.advantage`."""
    token_values: list[Any] | None = None
    """Each sample's per-token values (`trainer.token_values.TokenValues`, sample order) from the last
    step that kept them; `trainer_tokens` records them."""

    @property
    def trajectory_ids(self) -> list[str]:
        """Ids of the batch's trajectories, in sample order."""
        return [s.trajectory_id for s in self.samples]

    @property
    def n_tokens(self) -> int:
        """Tokens in the batch."""
        return sum(s.n_tokens for s in self.samples)

    @property
    def staleness(self) -> list[int]:
        """Staleness of each sample at `trainer_version`."""
        return [s.staleness for s in self.samples]

    def prompt_index(self) -> np.ndarray:
        """Dense prompt-group index of each sample, [B]."""
        groups: dict[str, int] = {}
        return np.array([groups.setdefault(s.group_id, len(groups)) for s in self.samples], dtype=np.int64)

    def rewards(self) -> np.ndarray:
        """Reward of each sample, [B]."""
        return np.array([s.reward for s in self.samples], dtype=np.float32)

    def tensors(self, indices: list[int] | None = None, vocab_size: int | None = None) -> MicroBatch:
        """Torch tensors of the samples at `indices` (default: all); ids folded mod `vocab_size` if given."""
        import torch

        indices = list(range(len(self.samples))) if indices is None else list(indices)
        rows = [self.samples[i] for i in indices]
        longest = max((s.n_tokens for s in rows), default=0)
        ids = np.zeros((len(rows), longest), dtype=np.int64)
        attn = np.zeros((len(rows), longest), dtype=bool)
        lps = np.zeros((len(rows), longest), dtype=np.float32)
        mask = np.zeros((len(rows), longest), dtype=bool)
        for r, s in enumerate(rows):
            n = s.n_tokens
            ids[r, :n] = s.token_ids
            attn[r, :n] = True
            lps[r, :n] = s.logprobs
            mask[r, :n] = s.loss_mask
        if vocab_size is not None:
            ids %= vocab_size
        mask[:, 0] = False  # no logprob for the first token: nothing predicts it
        prompts = self.prompt_index()[indices] if rows else np.zeros(0, dtype=np.int64)
        return MicroBatch(
            indices=indices,
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(attn),
            rollout_logprobs=torch.from_numpy(lps),
            loss_mask=torch.from_numpy(mask),
            prompt_index=torch.from_numpy(prompts),
            rewards=torch.from_numpy(self.rewards()[indices] if rows else np.zeros(0, dtype=np.float32)),
        )


def pack_micro_batches(lengths: list[int] | np.ndarray, budget: int) -> list[list[int]]:
    """Pack sequences into micro-batches by first-fit-decreasing on padded size.

    A micro-batch is padded to its longest sequence, so its cost is rows × longest; each
    holds at most `budget` tokens that way. A sequence longer than the budget gets a
    micro-batch of its own (nothing is dropped or cut). Returns lists of indices.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    bins: list[list[int]] = []
    longest: list[int] = []  # the first (longest) sequence of each bin, thanks to the order
    for i in order:
        n = int(lengths[i])
        for b, items in enumerate(bins):
            if (len(items) + 1) * longest[b] <= budget:
                items.append(i)
                break
        else:
            bins.append([i])
            longest.append(n)
    return bins
