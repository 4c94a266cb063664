"""Isolation: agent loops as Ray tasks (a real local Ray runtime) and as threads."""

from __future__ import annotations

import ctypes
import os

import pytest

from trajlake.ingest.recorder import Recorder
from trajlake.rollout.config import WorkerConfig
from trajlake.rollout.workers import AgentPool, AgentTask


def toy_agent(traj, task):
    """Two turns and a reward; task 'crash' kills its own process, task 'raise' has a harness bug."""
    if task.payload.get("crash"):
        os._exit(1)
    if task.payload.get("segfault"):
        ctypes.string_at(0)  # reads address 0: SIGSEGV in the worker process
    prompt = [1, 2, 3, task.sample_index]
    traj.turn([10 + task.sample_index, 11], [-0.1, -0.2], policy_version=0, full_input_token_ids=prompt)
    if task.payload.get("raise"):
        raise RuntimeError("harness bug: lost the environment handle")
    traj.turn([12], [-0.3], policy_version=0, input_token_ids=[99])
    traj.reward(1.0)
    traj.finish("completed")


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.integration
@pytest.mark.slow
def test_one_crashing_ray_task_does_not_take_down_the_other_seven(ray_runtime, lake, bus, drain):
    tasks = [
        AgentTask("task-a", sample_index=i, environment="toy", payload={"crash": i == 3}) for i in range(8)
    ]
    recorder = Recorder(bus, run_id="ray-run")
    outcomes = AgentPool(WorkerConfig(type="ray", num_cpus=2)).run(toy_agent, tasks, recorder)
    drain()

    assert [o.crashed for o in outcomes] == [i == 3 for i in range(8)]
    rows = lake.sql(
        "select sample_index, status, failure_origin, failure_label, n_turns, reward, message "
        "from trajectories where run_id = 'ray-run' order by sample_index"
    ).to_pylist()
    assert len(rows) == 8
    complete = [r for r in rows if r["sample_index"] != 3]
    assert all(r["status"] == "completed" and r["n_turns"] == 2 and r["reward"] == 1.0 for r in complete)
    crashed = rows[3]
    assert (crashed["status"], crashed["failure_origin"], crashed["failure_label"]) == (
        "error",
        "system",
        "infra",
    )
    assert crashed["reward"] is None and crashed["n_turns"] == 0
    assert "Worker" in crashed["message"] or "died" in crashed["message"].lower()


@pytest.mark.integration
def test_a_segfaulting_ray_task_is_recorded_as_a_system_failure(ray_runtime, lake, bus, drain):
    tasks = [AgentTask("task-s", sample_index=i, payload={"segfault": i == 0}) for i in range(2)]
    outcomes = AgentPool(WorkerConfig(type="ray")).run(toy_agent, tasks, Recorder(bus, run_id="segv-run"))
    drain()
    assert [o.crashed for o in outcomes] == [True, False]
    rows = lake.sql(
        "select status, failure_origin, failure_label from trajectories where run_id = 'segv-run' order by sample_index"
    ).to_pylist()
    assert [tuple(r.values()) for r in rows] == [("error", "system", "infra"), ("completed", None, None)]


def test_threads_backend_records_a_harness_exception_as_a_system_failure(lake, bus, drain):
    tasks = [AgentTask("task-b", sample_index=i, payload={"raise": i == 1}) for i in range(3)]
    recorder = Recorder(bus, run_id="thread-run")
    outcomes = AgentPool(WorkerConfig(type="threads", max_concurrency=3)).run(toy_agent, tasks, recorder)
    drain()
    assert not any(o.crashed for o in outcomes)
    rows = lake.sql(
        "select sample_index, status, failure_origin, failure_label, n_turns, message from trajectories "
        "where run_id = 'thread-run' order by sample_index"
    ).to_pylist()
    assert [r["status"] for r in rows] == ["completed", "error", "completed"]
    assert (rows[1]["failure_origin"], rows[1]["failure_label"]) == ("system", "harness_behavior")
    assert rows[1]["n_turns"] == 1 and "lost the environment handle" in rows[1]["message"]
