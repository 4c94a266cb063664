"""Faults of the real engine: the vLLM server killed during a batch of chat rollouts."""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from trajlake.demo.envs.chat_episode import ChatPolicy
from trajlake.demo.envs.config import EnvConfig, FaultConfig
from trajlake.demo.envs.episode import run_episode
from trajlake.demo.envs.tasks import make_tasks
from trajlake.ingest.recorder import Recorder
from trajlake.rollout.tito import TitoClient

pytestmark = pytest.mark.integration

ENV = EnvConfig(context_budget_tokens=112, faults=FaultConfig.none())


class KillingPolicy(ChatPolicy):
    """A chat policy whose `kill_at`-th request, counted over every thread, first SIGKILLs the server."""

    calls = 0
    lock = threading.Lock()
    kill: Any = None
    kill_at: int | None = None

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Any:
        with KillingPolicy.lock:
            KillingPolicy.calls += 1
            if KillingPolicy.calls == KillingPolicy.kill_at:
                KillingPolicy.kill()
        return super().sample(prompt_ids, max_new_tokens)


def play_batch(vllm_server, recorder, tasks, seed: int, kill_at: int | None = None) -> list:
    """Play one episode of each task on 8 threads; the `kill_at`-th request kills the server first."""
    KillingPolicy.calls, KillingPolicy.kill_at, KillingPolicy.kill = 0, kill_at, vllm_server.kill
    policies = [KillingPolicy.from_model_dir(TitoClient(vllm_server.tito_config("generate")), vllm_server.model_dir)
                for _ in range(len(tasks))]  # fmt: skip
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(
            lambda i: run_episode(recorder, tasks[i], policies[i], ENV, random.Random(seed + i), model="tiny"),
            range(len(tasks)),
        ))  # fmt: skip
    for policy in policies:
        policy.client.close()
    return results


def test_a_server_killed_mid_batch_ends_those_trajectories_as_infra_failures_and_the_rest_complete(
    vllm_server, tiny_tokenizer, bus, drain, lake
):
    recorder = Recorder(bus, "engine-fault", vocab_size=len(tiny_tokenizer), flush_each_turn=False)
    tasks = make_tasks(16, seed=4, config=ENV)
    hit = play_batch(vllm_server, recorder, tasks[:8], seed=0, kill_at=6)  # every episode makes >= 1 request
    vllm_server.start()
    rest = play_batch(vllm_server, recorder, tasks[8:], seed=100)
    drain()

    failed = [r for r in hit if r.failure_label == "infra"]
    assert failed, [r.status for r in hit]
    assert all(r.failure_label == "infra" or not r.is_system_failure for r in hit)
    assert all(r.failure_origin == "system" and r.reward is None for r in failed)
    assert not any(r.is_system_failure for r in rest), [r.failure_label for r in rest]
    rows = {r["trajectory_id"]: r for r in lake.sql(
        "select trajectory_id, finished, failure_origin, failure_label, reward, n_turns from trajectories "
        "where run_id = 'engine-fault'").to_pylist()}  # fmt: skip
    assert len(rows) == 16 and all(r["finished"] for r in rows.values())
    for result in failed:
        row = rows[result.trajectory_id]
        assert (row["failure_origin"], row["failure_label"], row["reward"]) == ("system", "infra", None)
    # nothing half-written: every stored turn has its ids and one logprob per id
    turns = lake.sql(
        "select trajectory_id, len(output_token_ids) as n, len(output_logprobs) as m from turns "
        "where run_id = 'engine-fault'"
    ).to_pylist()
    assert all(t["n"] == t["m"] >= 1 for t in turns)  # the chat model writes turns of several tokens
    per_traj = {tid: sum(t["trajectory_id"] == tid for t in turns) for tid in rows}
    assert all(per_traj[tid] == rows[tid]["n_turns"] for tid in rows)
