"""Rollout workers on a local Ray runtime, through the platform's `AgentPool`.

Each episode runs as its own Ray task (a crash kills one episode, which the pool records as
an infra failure). Weights travel through Ray's object store: a small `PolicyBoard` actor
holds the newest version and the object ref of its snapshot; an episode asks it (at most
every `refresh_s`) before each turn and loads newer weights, so an episode can span
versions exactly as with threads. Driver threads feed prompt groups to the pool and
publish the events the tasks hand back.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

from trajlake.demo.envs.config import EnvConfig
from trajlake.demo.envs.episode import ENVIRONMENT, HARNESS, Episode, EpisodeResult
from trajlake.demo.envs.loop import PolicyStore, TaskFeed
from trajlake.demo.envs.tasks import Task
from trajlake.demo.envs.vocab import VOCAB_SIZE
from trajlake.ingest.recorder import Recorder, TrajectoryRecorder
from trajlake.rollout.workers import AgentTask


class PolicyBoard:
    """Ray actor state: the newest policy version and the object ref of its weights snapshot."""

    def __init__(self) -> None:
        self.version = -1
        self.ref: list[Any] = []

    def set(self, version: int, ref: list[Any]) -> None:
        """Announce new weights (`ref` is `[ObjectRef]`, wrapped so Ray does not resolve it)."""
        if version > self.version:
            self.version, self.ref = version, ref

    def latest(self) -> tuple[int, list[Any]]:
        """(version, [ObjectRef of the snapshot])."""
        return self.version, self.ref


class BoardPolicyClient:
    """A policy client inside a Ray worker process: weights from the board, cached per process."""

    _policy: Any = None

    def __init__(self, board: Any, seed: int, temperature: float, refresh_s: float = 0.01) -> None:
        import torch

        self.board, self.temperature, self.refresh_s = board, temperature, refresh_s
        self.generator = torch.Generator().manual_seed(seed)
        self.checked_at = 0.0
        if BoardPolicyClient._policy is None:
            from trajlake.trainer.policy import TinyPolicy

            torch.set_num_threads(1)
            BoardPolicyClient._policy = TinyPolicy(VOCAB_SIZE, d_model=64, seed=0)
            BoardPolicyClient._policy.version = -1

    def _refresh(self) -> None:
        import ray

        now = time.monotonic()
        policy = BoardPolicyClient._policy
        if policy.version >= 0 and now - self.checked_at < self.refresh_s:
            return
        self.checked_at = now
        version, ref = ray.get(self.board.latest.remote())
        if version != policy.version:
            policy.load_snapshot(ray.get(ref[0]))

    def sample(
        self, context: list[int], max_new_tokens: int, stop_ids: tuple[int, ...]
    ) -> tuple[list[int], list[float], int]:
        """Sample with the newest weights the board announced; return (ids, logprobs, version)."""
        self._refresh()
        policy = BoardPolicyClient._policy
        ids, logprobs = policy.generate(context, max_new_tokens, self.temperature, stop_ids, self.generator)
        return ids, logprobs, policy.version


def demo_agent(traj: TrajectoryRecorder, task: AgentTask) -> None:
    """The agent loop a Ray task runs: one episode of the demo environment."""
    p = task.payload
    env = EnvConfig.model_validate(p["env"])
    client = BoardPolicyClient(p["board"], p["seed"], env.temperature)
    demo_task = Task(
        task.task_id, p["kind"], tuple(p["operands"]), tuple(p["prompt_ids"]), tuple(p["answer"])
    )
    result = EpisodeResult(traj.trajectory_id, task.task_id, task.group_id or task.task_id)
    Episode(demo_task, client, traj, env, random.Random(p["seed"]), result).run()


_CHAT_POLICIES: dict[tuple[str, str], Any] = {}
"""Per worker process: one chat policy (tokenizer, pooled TITO client) per server and model."""


def chat_agent(traj: TrajectoryRecorder, task: AgentTask) -> None:
    """The agent loop a Ray task runs with a vLLM-served chat model: one `ChatEpisode`."""
    from trajlake.demo.envs.chat_episode import ChatEpisode, ChatPolicy
    from trajlake.rollout.tito import TitoClient

    p = task.payload
    env = EnvConfig.model_validate(p["env"])
    key = (p["base_url"], p["model_dir"])
    if key not in _CHAT_POLICIES:
        from trajlake.rollout.config import TitoConfig

        client = TitoClient(TitoConfig(base_url=p["base_url"], model=p["served_name"], route="generate"))
        _CHAT_POLICIES[key] = ChatPolicy.from_model_dir(client, p["model_dir"], env.temperature)
    demo_task = Task(
        task.task_id, p["kind"], tuple(p["operands"]), tuple(p["prompt_ids"]), tuple(p["answer"])
    )
    result = EpisodeResult(traj.trajectory_id, task.task_id, task.group_id or task.task_id)
    ChatEpisode(demo_task, _CHAT_POLICIES[key], traj, env, random.Random(p["seed"]), result).run()


def results_from_events(events: list[dict[str, Any]]) -> list[EpisodeResult]:
    """Episode outcomes read back from a group's events (what the feed needs to know)."""
    by_id: dict[str, EpisodeResult] = {}
    for e in events:
        tid = e.get("trajectory_id")
        if tid is None:
            continue
        result = by_id.setdefault(tid, EpisodeResult(tid, e.get("task_id") or "", e.get("group_id") or ""))
        if e["event_type"] == "reward":
            result.reward = e.get("reward")
        elif e["event_type"] == "trajectory_finished":
            result.status, result.failure_origin = e["status"], e.get("failure_origin")
            result.failure_label = e.get("failure_label")
    return list(by_id.values())


class RolloutActors:
    """Rollout workers as Ray tasks on a local Ray runtime, fed by one driver thread per worker."""

    def __init__(
        self,
        n_workers: int,
        feed: TaskFeed,
        recorder: Recorder,
        engine: Any,
        config: EnvConfig,
        samples_per_group: int,
        seed: int,
    ) -> None:
        import ray

        from trajlake.rollout.config import WorkerConfig
        from trajlake.rollout.workers import AgentPool

        if not ray.is_initialized():
            ray.init(
                num_cpus=n_workers, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
            )
        self.ray = ray
        self.pool = AgentPool(WorkerConfig(type="ray", num_cpus=n_workers))
        # the tiny policy's weights travel through a board actor; a vLLM server holds its own
        self.store: PolicyStore | None = getattr(engine, "store", None)
        if self.store is not None:
            self.board: Any = ray.remote(num_cpus=0)(PolicyBoard).remote()
            self.agent, self.engine_payload = demo_agent, {"board": self.board}
        else:
            self.agent, self.engine_payload = chat_agent, engine.payload()
        self.model = engine.model
        self.feed, self.recorder, self.config = feed, recorder, config
        self.samples, self.seed = samples_per_group, seed
        self.errors: list[BaseException] = []
        self.crashed = 0
        self._published = -1
        self._stop = threading.Event()
        self._sync_weights()
        self._threads = [threading.Thread(target=self._drive, args=(i,), name=f"ray-driver-{i}", daemon=True)
                         for i in range(n_workers)]  # fmt: skip
        self._threads.append(threading.Thread(target=self._sync_loop, name="ray-weights", daemon=True))

    def start(self) -> None:
        """Start feeding groups to Ray."""
        for thread in self._threads:
            thread.start()

    def _sync_weights(self) -> None:
        if self.store is None:
            return
        snapshot = self.store.latest()
        version = int(snapshot["version"])
        if version != self._published:
            ref = self.ray.put(snapshot)
            self.ray.get(self.board.set.remote(version, [ref]))
            self._published = version

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync_weights()
            except Exception as err:  # reported by `check`; the run must not go on with frozen weights
                self.errors.append(err)
                self.feed.stop()
                return
            self._stop.wait(0.01)

    def _drive(self, worker: int) -> None:
        rng = random.Random(self.seed * 7919 + worker)
        env = self.config.model_dump(mode="json")
        try:
            while (group := self.feed.next_group()) is not None:
                task, group_id = group
                tasks = [
                    self._agent_task(task, group_id, i, env, rng.randrange(2**31))
                    for i in range(self.samples)
                ]
                collector = _Collector(self.recorder)
                outcomes = self.pool.run(self.agent, tasks, collector.recorder)
                self.crashed += sum(o.crashed for o in outcomes)
                self.recorder.bus.publish(collector.events)
                self.feed.add_results(results_from_events(collector.events))
        except BaseException as err:  # surfaced by `check`, so the demo fails loudly rather than hanging
            self.errors.append(err)
            self.feed.stop()

    def _agent_task(self, task: Task, group_id: str, index: int, env: dict[str, Any], seed: int) -> AgentTask:
        payload = {"env": env, "seed": seed, "kind": task.kind, "operands": list(task.operands),
                   "prompt_ids": list(task.prompt_ids), "answer": list(task.answer), **self.engine_payload}  # fmt: skip
        return AgentTask(task.task_id, group_id, index, environment=ENVIRONMENT, harness=HARNESS, model=self.model,
                         context_budget_tokens=self.config.context_budget_tokens, payload=payload)  # fmt: skip

    def check(self) -> None:
        """Raise the first error a driver thread died of."""
        if self.errors:
            raise RuntimeError(f"a Ray rollout driver died: {self.errors[0]!r}") from self.errors[0]

    def join(self, timeout_s: float = 60.0) -> None:
        """Wait for in-flight groups, stop syncing weights, and shut the local Ray runtime down."""
        for thread in self._threads[:-1]:
            thread.join(timeout_s)
        self._stop.set()
        self._threads[-1].join(timeout_s)
        self.ray.shutdown()
        self.check()


class _Collector:
    """A recorder whose events the driver publishes itself, once per group, after counting them."""

    def __init__(self, recorder: Recorder) -> None:
        from trajlake.rollout.workers import CollectingBus

        self.bus = CollectingBus()
        self.recorder = Recorder(
            self.bus, recorder.run_id, vocab_size=recorder.vocab_size, producer_id=recorder.producer_id
        )

    @property
    def events(self) -> list[dict[str, Any]]:
        """Everything recorded so far."""
        return self.bus.events
