"""The rollout side of the demo's async loop: shared weights, a task feed, and rollout threads.

The trainer publishes each new policy version to a `PolicyStore`; every rollout worker
keeps its own copy of the policy and, before each turn, loads newer weights if there are
any, so a trajectory can span several policy versions (each turn records its own). The
`TaskFeed` hands out prompt groups and holds workers back when they run too far ahead of
the trainer, which keeps staleness bounded without wasting rollouts.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.episode import EpisodeResult, run_episode
from trajlake.demo.envs.tasks import Task
from trajlake.demo.envs.vocab import VOCAB_SIZE
from trajlake.ingest.recorder import Recorder


class PolicyStore:
    """The latest weights snapshot (`TinyPolicy.snapshot()`), shared in memory by threads."""

    def __init__(self, snapshot: dict[str, Any]) -> None:
        self._lock = threading.Lock()
        self._snapshot = snapshot

    @property
    def version(self) -> int:
        """Version of the latest published weights."""
        with self._lock:
            return int(self._snapshot["version"])

    def publish(self, snapshot: dict[str, Any]) -> None:
        """Make `snapshot` the weights every worker loads before its next turn."""
        with self._lock:
            self._snapshot = snapshot

    def latest(self) -> dict[str, Any]:
        """The latest snapshot (shared; callers must not modify it)."""
        with self._lock:
            return self._snapshot


class LocalPolicyClient:
    """A worker's own copy of the policy, refreshed from the store before every turn."""

    def __init__(self, store: PolicyStore, seed: int, temperature: float = 1.0, d_model: int = 64) -> None:
        import torch

        from trajlake.trainer.policy import TinyPolicy

        self.store = store
        self.temperature = temperature
        self.policy = TinyPolicy(VOCAB_SIZE, d_model=d_model, seed=0)
        self.policy.load_snapshot(store.latest())
        self.generator = torch.Generator().manual_seed(seed)

    def sample(
        self, context: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]
    ) -> tuple[list[int], list[float], int]:
        """Sample with the newest weights; return (ids, logprobs, their policy version)."""
        latest = self.store.latest()
        if int(latest["version"]) != self.policy.version:
            self.policy.load_snapshot(latest)
        ids, logprobs = self.policy.generate(
            context, max_new_tokens, self.temperature, stop_ids, self.generator
        )
        return ids, logprobs, self.policy.version


class TaskFeed:
    """Hands out prompt groups to workers, holding them back while enough groups await the trainer.

    A group whose scored samples all got the same reward carries no GRPO signal and will not
    be trained on, so it does not count toward the buffer, up to `max_idle` such groups per
    trainer step (beyond that, workers wait for the trainer like for any other group).
    """

    def __init__(
        self, groups: Iterator[tuple[Task, str]], max_ahead: int, max_idle: int | None = None
    ) -> None:
        self._groups = groups
        self._cond = threading.Condition()
        self.allowance = max_ahead
        self.max_idle = max_ahead if max_idle is None else max_idle
        self.idle_left = self.max_idle
        self.produced = 0
        self.finished = 0
        self.system_failures = 0
        self.stopped = False

    def next_group(self) -> tuple[Task, str] | None:
        """The next (task, group id); None once stopped. Waits while the buffer is full."""
        with self._cond:
            while not self.stopped and self.produced >= self.allowance:
                self._cond.wait(0.5)
            if self.stopped:
                return None
            self.produced += 1
            return next(self._groups, None)

    def release(self, groups: int) -> None:
        """Let workers produce `groups` more groups (the trainer took that many)."""
        with self._cond:
            self.allowance += groups
            self.idle_left = self.max_idle
            self._cond.notify_all()

    def add_results(self, results: list[EpisodeResult]) -> None:
        """Count a finished group; one without reward variance frees its place in the buffer."""
        scored = {r.reward for r in results if r.reward is not None and not r.is_system_failure}
        with self._cond:
            self.finished += len(results)
            self.system_failures += sum(r.is_system_failure for r in results)
            if len(scored) < 2 and self.idle_left > 0:
                self.idle_left -= 1
                self.allowance += 1
                self._cond.notify_all()

    def stop(self) -> None:
        """Wake every worker and make `next_group` return None."""
        with self._cond:
            self.stopped = True
            self._cond.notify_all()


def play_group(
    recorder: Recorder,
    task: Task,
    group_id: str,
    samples: int,
    client: Any,
    config: EnvConfig,
    rng: random.Random,
    model: str,
) -> list[EpisodeResult]:
    """Play `samples` episodes of one task (one GRPO prompt group)."""
    return [
        run_episode(recorder, task, client, config, rng, group_id=group_id, sample_index=i, model=model)
        for i in range(samples)
    ]


class RolloutThreads:
    """Rollout workers as threads in this process (`--no-ray`); `make_policy(seed)` gives each its client."""

    def __init__(
        self,
        n_workers: int,
        feed: TaskFeed,
        make_recorder: Callable[[int], Recorder],
        make_policy: Callable[[int], Any],
        config: EnvConfig,
        samples_per_group: int,
        seed: int,
        model: str = "tinypolicy",
    ) -> None:
        self.feed = feed
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(
                target=self._work,
                args=(
                    make_recorder(i),
                    make_policy(seed * 1000 + i),
                    config,
                    samples_per_group,
                    random.Random(seed * 1000 + i),
                    model,
                ),
                name=f"rollout-{i}",
                daemon=True,
            )
            for i in range(n_workers)
        ]

    def start(self) -> None:
        """Start every worker thread."""
        for thread in self._threads:
            thread.start()

    def _work(
        self,
        recorder: Recorder,
        client: Any,
        config: EnvConfig,
        samples: int,
        rng: random.Random,
        model: str,
    ) -> None:
        try:
            while (group := self.feed.next_group()) is not None:
                task, group_id = group
                self.feed.add_results(
                    play_group(recorder, task, group_id, samples, client, config, rng, model)
                )
        except BaseException as err:  # surfaced by `join`, so the demo fails loudly rather than hanging
            self.errors.append(err)
            self.feed.stop()

    def check(self) -> None:
        """Raise the first error a worker died of."""
        if self.errors:
            raise RuntimeError(f"a rollout worker died: {self.errors[0]!r}") from self.errors[0]

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for the workers to finish their current group; re-raise a worker's error."""
        for thread in self._threads:
            thread.join(timeout_s)
        self.check()
