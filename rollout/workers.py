"""Run agent loops in isolation: each one a Ray task (its own process), or a thread.

The driver assigns every task its trajectory id up front. A worker records its trajectory
into a `CollectingBus` and hands the events back; the driver publishes them. A task whose
process dies (os._exit, a segfault, the OOM killer) hands nothing back: the driver then
records `trajectory_started` + `trajectory_finished(status=error, failure_origin=system,
failure_label=infra)` under the same id, so the crash is counted and never trained on.
An exception inside an agent loop is classified by the taxonomy and recorded by the worker.

    pool = AgentPool(WorkerConfig(type="ray"))
    outcomes = pool.run(my_agent, tasks, recorder)       # my_agent(traj, task) -> None
"""

from __future__ import annotations

import functools
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from trajlake.ingest import codec
from trajlake.ingest.bus.base import Message, Publisher, SpoolStats
from trajlake.ingest.recorder import Recorder, TrajectoryRecorder
from trajlake.rollout import taxonomy
from trajlake.rollout.config import WorkerConfig

AgentFn = Callable[[TrajectoryRecorder, "AgentTask"], Any]


@dataclass
class AgentTask:
    """One agent loop to run: which task, which sample of its group, and anything the agent needs."""

    task_id: str
    group_id: str | None = None
    sample_index: int = 0
    environment: str | None = None
    harness: str | None = None
    model: str | None = None
    context_budget_tokens: int | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)
    trajectory_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class TaskOutcome:
    """How one agent loop ended, as the driver saw it."""

    trajectory_id: str
    task_id: str
    crashed: bool = False
    error: str | None = None
    n_events: int = 0


class CollectingBus(Publisher):
    """A publisher that keeps the events it is given, for the driver to publish for real."""

    topic = "collected"

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, events: Sequence[Mapping[str, Any]]) -> int:
        self.events.extend(dict(e) for e in events)
        return 1

    def send(self, message: Message) -> None:
        """Keep the events an encoded message holds (`codec.DecodeError` when it holds none)."""
        table, bad = codec.decode(message.value, message.headers)
        rows = [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]
        # events that would become dead letters go on as they are: the real bus files them
        unreadable = [raw for raw, _ in bad if not isinstance(raw, dict)]
        if unreadable:
            raise codec.DecodeError(f"{len(unreadable)} events in the message are not JSON objects")
        self.events.extend(rows + [raw for raw, _ in bad])

    def flush(self, timeout_s: float | None = None) -> None:
        """Nothing to do: the events are kept when `publish` returns."""

    def spool_stats(self) -> SpoolStats:
        """Always empty: nothing waits for delivery."""
        return SpoolStats()

    def close(self) -> None:
        """Nothing to release; the events stay for the driver."""


def run_agent_loop(
    agent: AgentFn, task: AgentTask, run_id: str, vocab_size: int | None
) -> list[dict[str, Any]]:
    """Run one agent loop and return its events; an exception is classified and recorded."""
    bus = CollectingBus()
    recorder = Recorder(bus, run_id, vocab_size=vocab_size)
    traj = _start(recorder, task)
    try:
        agent(traj, task)
    except Exception as err:  # the loop is over either way; record why, with blame assigned
        if not traj.finished:
            failure = taxonomy.classify_exception(err)
            traj.finish(
                failure.status,
                failure_origin=failure.origin,
                failure_label=failure.label,
                message=f"{type(err).__name__}: {err}"[:2000],
            )
    if not traj.finished:
        traj.finish(
            "error",
            failure_origin=taxonomy.SYSTEM,
            failure_label=taxonomy.HARNESS_BEHAVIOR,
            message="the agent loop returned without finishing its trajectory",
        )
    return bus.events


def _start(recorder: Recorder, task: AgentTask) -> TrajectoryRecorder:
    return recorder.start(
        task.task_id,
        task.group_id,
        task.sample_index,
        environment=task.environment,
        harness=task.harness,
        model=task.model,
        context_budget_tokens=task.context_budget_tokens,
        trajectory_id=task.trajectory_id,
    )


def record_crash(recorder: Recorder, task: AgentTask, reason: str) -> None:
    """Record a task whose worker died as a system infra failure, under its own trajectory id."""
    traj = _start(recorder, task)
    f = taxonomy.WORKER_CRASHED
    traj.finish(f.status, failure_origin=f.origin, failure_label=f.label, message=reason[:2000])


@functools.cache
def _remote_agent_loop() -> Any:
    """`run_agent_loop` as a Ray remote function, made once per process: each `ray.remote` is exported
    to the cluster anew. No retries: a crash is recorded as such rather than silently re-run with new
    samples."""
    import ray

    return ray.remote(max_retries=0)(run_agent_loop)


class AgentPool:
    """Runs agent loops on the configured backend and publishes their events through `recorder`."""

    def __init__(self, config: WorkerConfig | None = None) -> None:
        self.config = config or WorkerConfig()

    def run(self, agent: AgentFn, tasks: Sequence[AgentTask], recorder: Recorder) -> list[TaskOutcome]:
        """Run every task; return one outcome per task, in order. Never raises for a task's failure."""
        if self.config.type == "ray":
            return self._run_ray(agent, tasks, recorder)
        return self._run_threads(agent, tasks, recorder)

    def _publish(self, recorder: Recorder, task: AgentTask, events: list[dict[str, Any]]) -> TaskOutcome:
        recorder.bus.publish(events)
        return TaskOutcome(task.trajectory_id, task.task_id, n_events=len(events))

    def _run_threads(
        self, agent: AgentFn, tasks: Sequence[AgentTask], recorder: Recorder
    ) -> list[TaskOutcome]:
        with ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="agent") as pool:
            futures = [
                pool.submit(run_agent_loop, agent, t, recorder.run_id, recorder.vocab_size) for t in tasks
            ]
            return [self._publish(recorder, t, f.result()) for t, f in zip(tasks, futures, strict=True)]

    def _run_ray(self, agent: AgentFn, tasks: Sequence[AgentTask], recorder: Recorder) -> list[TaskOutcome]:
        import ray
        from ray import cloudpickle

        if not ray.is_initialized():
            ray.init(num_cpus=self.config.num_cpus, include_dashboard=False, log_to_driver=False)
        module = sys.modules.get(getattr(agent, "__module__", ""), None)
        if (
            module is not None
            and module.__name__ not in ("__main__",)
            and not module.__name__.startswith("trajlake.")
        ):
            # harness code (a script, a test module) may not be importable in Ray's workers: ship it by value
            cloudpickle.register_pickle_by_value(module)
        refs = [_remote_agent_loop().remote(agent, t, recorder.run_id, recorder.vocab_size) for t in tasks]
        outcomes = []
        for task, ref in zip(tasks, refs, strict=True):
            try:
                events = ray.get(ref, timeout=self.config.task_timeout_s)
            except (
                ray.exceptions.WorkerCrashedError,
                ray.exceptions.RayTaskError,
                ray.exceptions.GetTimeoutError,
                ray.exceptions.NodeDiedError,
                ray.exceptions.ObjectLostError,
            ) as err:
                # the worker process died (or hung): its events are gone, the crash must not be
                reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                if isinstance(err, ray.exceptions.GetTimeoutError):
                    ray.cancel(ref, force=True)
                record_crash(recorder, task, reason)
                outcomes.append(
                    TaskOutcome(task.trajectory_id, task.task_id, crashed=True, error=reason, n_events=2)
                )
                continue
            outcomes.append(self._publish(recorder, task, events))
        return outcomes
