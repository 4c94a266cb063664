"""Agent Lightning 1.0 adapter: the real server (its own venv) proxying the session's vLLM, polled into a lake."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.fixtures.examples import printed, run_example, stored
from trajlake.rollout.adapters.agent_lightning import (
    AglClient,
    AglPoller,
    UnsupportedAgentLightning,
    import_agent_lightning,
    trajectory_id_of,
)
from trajlake.rollout.config import AgentLightningSettings
from trajlake.store.catalog import Catalog
from trajlake.store.lake import Lake

RUN = "agl-run"


def finished_rollout(
    agl, rollout_id: str, *, reward: float = 1.0, data_id: str = "q1", sample: int = 0
) -> dict:
    """A rollout as an agent runner makes it: one call through the proxy, a reward, succeeded; the engine's answer."""
    agl.rollout(rollout_id, data_id=data_id, sample=sample)
    answer = agl.chat(rollout_id, f"Say something about {rollout_id}")
    answer.raise_for_status()
    agl.event(rollout_id, "reward", {"value": reward, "source": "agent"})
    agl.patch(rollout_id, state="succeeded")
    return answer.json()


def stored_turns(lake_root: Path) -> dict[str, list[dict]]:
    """Rollout id -> its turn events in the lake, read with a fresh Lake (another process may have written it)."""
    lake = Lake(lake_root)
    try:
        rows = lake.sql(
            "select s.rollout_id, t.input_token_ids, t.output_token_ids, t.output_logprobs, t.loss_mask, "
            "t.attributes from events t join (select trajectory_id, "
            "json_extract_string(attributes, '$.rollout_id') as rollout_id from events "
            "where event_type = 'trajectory_started' and run_id = $run) s using (trajectory_id) "
            "where t.event_type = 'turn' order by t.seq",
            {"run": RUN},
        ).to_pylist()
    finally:
        lake.close()
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row.pop("rollout_id"), []).append(row)
    return out


def stored_trajectories(lake_root: Path) -> list[dict]:
    lake = Lake(lake_root)
    try:
        return lake.sql(
            "select trajectory_id, status, failure_origin, failure_label, reward, verifier_error "
            "from trajectories where run_id = $run",
            {"run": RUN},
        ).to_pylist()
    finally:
        lake.close()


def assert_engine_tokens(turn: dict, answer: dict) -> None:
    """The lake holds the ids and logprobs the engine returned (read from vLLM's own answer)."""
    choice = answer["choices"][0]
    assert turn["input_token_ids"] == answer["prompt_token_ids"]
    assert turn["output_token_ids"] == choice["token_ids"]
    expected = np.array([c["logprob"] for c in choice["logprobs"]["content"]], dtype=np.float32)
    assert np.array_equal(np.array(turn["output_logprobs"], dtype=np.float32), expected)
    assert all(turn["loss_mask"])


@pytest.mark.integration
def test_a_rollout_through_the_proxy_is_stored_once_with_the_engine_s_tokens(agl_server, tmp_path):
    answer = finished_rollout(agl_server, "r-1")
    config = AgentLightningSettings(server=agl_server.url)
    lake = Lake(tmp_path / "lake")
    report = import_agent_lightning(lake, config, RUN)
    again = import_agent_lightning(lake, config, RUN)
    lake.close()
    assert (report.trajectories, report.turns, report.dead_letters) == (1, 1, 0)
    assert again.trajectories == 0  # the cursor is past it
    turns = stored_turns(tmp_path / "lake")
    assert list(turns) == ["r-1"] and len(turns["r-1"]) == 1
    assert_engine_tokens(turns["r-1"][0], answer)
    [traj] = stored_trajectories(tmp_path / "lake")
    assert traj["trajectory_id"] == trajectory_id_of(RUN, "r-1")
    assert (traj["status"], traj["reward"], traj["failure_origin"]) == ("completed", 1.0, None)


def poller(lake_root: Path, server: str, *extra: str) -> subprocess.Popen:
    """`trajlake import agent-lightning` in its own process (the CLI a user runs)."""
    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", "import", "agent-lightning",
           "--server", server, "--lake", str(lake_root), "--run", RUN, "--page-size", "1", "--json", *extra]  # fmt: skip
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cursor(lake_root: Path, server: str) -> int:
    catalog = Catalog.for_lake(lake_root)
    try:
        saved = catalog.source_cursor(RUN, f"agent-lightning:{server}")
    finally:
        catalog.close()
    return 0 if saved is None else saved[0]


@pytest.mark.integration
def test_a_poller_killed_mid_stream_resumes_without_loss_or_duplicates(agl_server, tmp_path):
    lake_root = tmp_path / "lake"
    answers = {f"r-{i}": finished_rollout(agl_server, f"r-{i}", reward=i % 2, sample=i) for i in range(8)}
    follow = poller(lake_root, agl_server.url, "--follow", "--poll-interval", "0.2")
    deadline = time.monotonic() + 180
    while cursor(lake_root, agl_server.url) < 2:  # two pages committed: the poller is mid-stream
        assert follow.poll() is None, follow.communicate()
        assert time.monotonic() < deadline, "the poller stored nothing in 180 s"
        time.sleep(0.05)
    follow.send_signal(signal.SIGKILL)
    follow.communicate()
    killed_at = cursor(lake_root, agl_server.url)
    assert killed_at < 8  # it had not reached the end
    answers.update({f"r-{i}": finished_rollout(agl_server, f"r-{i}", sample=i) for i in range(8, 11)})

    done = poller(lake_root, agl_server.url)
    out, err = done.communicate(timeout=300)
    assert done.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["dead_letters"] == 0
    assert report["trajectories"] + report["skipped_existing"] == 11 - killed_at  # the uncommitted page again

    turns = stored_turns(lake_root)
    assert sorted(turns) == sorted(answers)  # no loss
    for rollout_id, answer in answers.items():
        assert len(turns[rollout_id]) == 1, rollout_id  # no duplicates
        assert_engine_tokens(turns[rollout_id][0], answer)
    trajs = stored_trajectories(lake_root)
    assert len(trajs) == 11 and len({t["trajectory_id"] for t in trajs}) == 11
    assert cursor(lake_root, agl_server.url) == 11


@pytest.mark.integration
def test_failures_are_classified_and_a_call_without_token_ids_is_kept_as_text(agl_server, tmp_path):
    # the runner crashed after one good call
    agl_server.rollout("crashed", data_id="q2")
    agl_server.chat("crashed", "hello").raise_for_status()
    agl_server.patch("crashed", state="failed", error_message="KeyError: 'answer' in the agent loop")
    # the conversation outgrew the engine's context: vLLM answers 400 through the proxy
    agl_server.rollout("too-long", data_id="q3")
    assert agl_server.chat("too-long", "hello " * 5000).status_code == 400
    agl_server.patch("too-long", state="failed", error_message="the model call failed")
    # a record the runner made itself, with text and no token ids
    agl_server.rollout("text-only", data_id="q4")
    agl_server.event("text-only", "model_request", {"request": {"messages": [{"role": "user", "content": "2+2?"}]},
                     "response": {"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}]}})  # fmt: skip
    agl_server.event("text-only", "reward", {"value": 1.0})
    agl_server.patch("text-only", state="succeeded")
    # succeeded, but nothing scored it
    agl_server.rollout("unscored", data_id="q5")
    agl_server.chat("unscored", "hello").raise_for_status()
    agl_server.patch("unscored", state="succeeded")

    lake = Lake(tmp_path / "lake")
    report = import_agent_lightning(lake, AgentLightningSettings(server=agl_server.url), RUN)
    lake.close()
    assert (report.trajectories, report.dead_letters) == (4, 0)
    by_id = {t["trajectory_id"]: t for t in stored_trajectories(tmp_path / "lake")}
    outcome = {
        rid: (t["status"], t["failure_origin"], t["failure_label"], t["reward"])
        for rid in ("crashed", "too-long", "text-only", "unscored")
        for t in [by_id[trajectory_id_of(RUN, rid)]]
    }
    assert outcome == {
        "crashed": ("error", "system", "harness_behavior", None),
        "too-long": ("context_exhausted", "model", "model_capability", None),
        "text-only": ("completed", None, None, 1.0),
        "unscored": ("error", "system", "verifier_error", None),
    }
    [text_turn] = stored_turns(tmp_path / "lake")["text-only"]
    assert text_turn["output_token_ids"] == [] and text_turn["input_token_ids"] == []
    kept = json.loads(text_turn["attributes"])
    assert kept == {
        "tokens_recorded": False,
        "prompt": [{"role": "user", "content": "2+2?"}],
        "completion": "4",
    }
    assert any("no token ids" in w for w in report.warnings)


def _mock_server(version: str, title: str = "Agent Lightning") -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/openapi.json":
            return httpx.Response(
                200, json={"openapi": "3.1.0", "info": {"title": title, "version": version}}
            )
        if request.url.path == "/api/rollouts/terminal":
            return httpx.Response(200, json={"items": [], "next_after": 0, "total_terminal": 0})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(answer)


@pytest.mark.parametrize(
    ("version", "title"), [("2.0.0", "Agent Lightning"), ("0.3.1", "Agent Lightning"), ("1.0.0", "Other")],
    ids=["newer", "older", "not-agl"],
)  # fmt: skip
def test_an_unknown_server_version_names_the_supported_ones(version, title):
    client = AglClient(
        AgentLightningSettings(server="http://agl.test"), transport=_mock_server(version, title)
    )
    with pytest.raises(
        UnsupportedAgentLightning,
        match=r"supports Agent Lightning API version 1\.0\.0 \(agentlightning 1\.0\.x\)",
    ):
        client.check_version()


def test_a_supported_server_passes_the_version_check():
    client = AglClient(AgentLightningSettings(server="http://agl.test"), transport=_mock_server("1.0.0"))
    assert client.check_version() == "1.0.0"


@pytest.mark.integration  # a CLI process
def test_the_cli_names_the_server_it_cannot_reach(tmp_path):
    env = {**os.environ, "NO_PROXY": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", "from trajlake.cli import run; run()", "import", "agent-lightning", "--server",
         "http://127.0.0.1:9", "--lake", str(tmp_path / "lake"), "--run", RUN],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 2
    assert "http://127.0.0.1:9: cannot reach the server" in done.stderr and "--server" in done.stderr


@pytest.mark.integration
def test_a_retried_rollout_is_one_trajectory_with_the_last_attempt_s_calls(agl_server, tmp_path):
    agl_server.rollout("retried", data_id="q6", attempt="a0")
    agl_server.chat("retried", "first try", attempt="a0").raise_for_status()
    agl_server.patch("retried", last_attempt_id="a1")  # the runner gave up on a0 and started again
    answer = agl_server.chat("retried", "second try", attempt="a1").json()
    agl_server.event("retried", "reward", {"value": 0.5}, attempt="a1")
    agl_server.patch("retried", state="succeeded")

    lake = Lake(tmp_path / "lake")
    report = import_agent_lightning(lake, AgentLightningSettings(server=agl_server.url), RUN)
    lake.close()
    assert report.trajectories == 1
    [turn] = stored_turns(tmp_path / "lake")["retried"]
    assert_engine_tokens(turn, answer)
    [traj] = stored_trajectories(tmp_path / "lake")
    assert (traj["status"], traj["reward"]) == ("completed", 0.5)


class FakeAgl:
    """An Agent Lightning 1.0 API in memory (httpx MockTransport): a log that a restart empties.

    `server`: what each model call's record says served it (default: model "m" at version 2).
    """

    def __init__(self, server: dict | None = None) -> None:
        self.log: list[str] = []
        self.server = server or {"model": "m", "version": 2}

    def finish(self, rollout_id: str) -> None:
        self.log.append(rollout_id)

    def restart(self) -> None:
        self.log = []

    def transport(self) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            path, q = request.url.path, request.url.params
            if path == "/openapi.json":
                return httpx.Response(200, json={"info": {"title": "Agent Lightning", "version": "1.0.0"}})
            if path == "/api/rollouts/terminal":
                after, limit = int(q.get("after", 0)), int(q.get("limit", 1000))
                ids = self.log[after : after + limit]
                items = [
                    {"rollout_id": r, "state": "succeeded", "data_id": "d", "is_train": True} for r in ids
                ]
                return httpx.Response(
                    200,
                    json={"items": items, "next_after": after + len(ids), "total_terminal": len(self.log)},
                )
            rid = path.split("/")[3]
            if path.endswith("/events"):
                call = {"prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5], "response_log_probs": [-0.5, -0.25],
                        "server": self.server, "http_status": 200, "status": "ok"}  # fmt: skip
                data = call if q.get("format") == "triplet" else {"response": {}, "finish_reason": "stop"}
                return httpx.Response(200, json=[
                    {"event_type": "model_request", "rollout_id": rid, "attempt_id": "0", "timestamp": 1.0, "data": data},
                    {"event_type": "reward", "rollout_id": rid, "attempt_id": "0", "timestamp": 2.0, "data": {"value": 1.0}},
                ])  # fmt: skip
            status = {"state": "succeeded", "last_attempt_id": None, "error_message": None}
            return httpx.Response(200, json={"rollout": {"rollout_id": rid, "input": {"data_id": "d"}, "is_train": True,
                                                         "metadata": {}, "status": status}, "attempts": ["0"]})  # fmt: skip

        return httpx.MockTransport(answer)


def test_after_the_server_restarts_its_new_log_is_read_from_the_start(tmp_path, monkeypatch):
    from trajlake.rollout.adapters import agent_lightning

    fake = FakeAgl()
    real_client = agent_lightning.AglClient
    monkeypatch.setattr(
        agent_lightning, "AglClient", lambda config: real_client(config, transport=fake.transport())
    )
    config = AgentLightningSettings(server="http://agl.test", page_size=2)
    lake = Lake(tmp_path / "lake")
    for rid in ("a", "b", "c"):
        fake.finish(rid)
    assert import_agent_lightning(lake, config, RUN).trajectories == 3
    fake.restart()  # in-memory store: the log starts again, with new rollouts and one seen before
    for rid in ("d", "a", "e", "f"):
        fake.finish(rid)
    report = import_agent_lightning(lake, config, RUN)
    assert (report.trajectories, report.skipped_existing) == (3, 1)
    assert any("reading its log from 0" in w for w in report.warnings)
    lake.close()
    turns = stored_turns(tmp_path / "lake")
    assert sorted(turns) == ["a", "b", "c", "d", "e", "f"] and all(len(t) == 1 for t in turns.values())
    assert turns["a"][0]["output_token_ids"] == [4, 5] and turns["a"][0]["input_token_ids"] == [1, 2, 3]


@pytest.mark.integration  # the example as its docs say: a plain `python`, from outside the checkout
def test_the_example_runs_from_a_plain_python_and_reports_what_the_lake_stored(
    agl_venv, vllm_server, tmp_path
):
    lake_root = tmp_path / "lake"
    done = run_example("agent_lightning", "--lake", str(lake_root), "--vllm-url", vllm_server.url,
                       "--samples", "1", "--run-id", RUN, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]  # not: No module named 'httpx'
    assert "3 rollouts through Agent Lightning" in done.stdout and "imported 3 trajectories" in done.stdout
    assert printed(done.stdout) == stored(lake_root, RUN)  # status, tokens as the lake counts them
    assert printed(done.stdout)["trajectories"] == 3


@pytest.mark.integration
def test_the_example_keeps_the_model_version_the_user_registered(agl_server, vllm_server, tmp_path):
    # the user's server serves their vLLM at policy version 7 (an upsert of the fixture's registration)
    upstream = [{"model": vllm_server.name, "endpoint": f"{vllm_server.url}/v1", "version": 7}]
    agl_server.http.post("/api/models", json=upstream).raise_for_status()
    done = run_example("agent_lightning", "--lake", str(tmp_path / "lake"), "--vllm-url", vllm_server.url,
                       "--agl-server", agl_server.url, "--samples", "1", "--run-id", RUN, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    finished_rollout(agl_server, "after-the-example")  # a later rollout of the user's: still version 7
    lake = Lake(tmp_path / "lake")
    import_agent_lightning(lake, AgentLightningSettings(server=agl_server.url), RUN)
    versions = lake.sql("select policy_version, count(*) as n from turns group by all").to_pylist()
    lake.close()
    assert versions == [{"policy_version": 7, "n": 4}]


def test_a_call_recorded_without_a_model_version_is_stored_as_unknown_not_as_0(tmp_path):
    lake = Lake(tmp_path / "lake")
    for run, server, fallback in [("none", {"model": "m"}, None), ("zero", {"model": "m", "version": 0}, None),
                                  ("named", {"model": "m"}, 5)]:  # fmt: skip
        fake = FakeAgl(server=server)
        fake.finish(f"{run}-1")
        config = AgentLightningSettings(server=f"http://{run}.test")
        client = AglClient(config, transport=fake.transport())
        AglPoller(lake, Catalog.for_lake(lake.root), client, run, config, policy_version=fallback).run()
    got = lake.sql("select run_id, policy_version from turns order by run_id").to_pylist()
    lake.close()
    assert got == [
        {"run_id": "named", "policy_version": 5},  # the import's --policy-version, for records without one
        {"run_id": "none", "policy_version": None},  # unknown: never taken as version 0
        {"run_id": "zero", "policy_version": 0},
    ]


@pytest.mark.integration  # the CLI in a process of its own, under a "supervisor": stderr to a file, SIGTERM
def test_a_follower_reports_progress_off_a_terminal_and_a_summary_on_sigterm(
    agl_server_without_engine, tmp_path
):
    agl = agl_server_without_engine
    for i in range(3):  # rollouts a runner recorded itself: a reward, no model call
        agl.rollout(f"r-{i}", data_id="q")
        agl.event(f"r-{i}", "reward", {"value": 1.0, "source": "agent"})
        agl.patch(f"r-{i}", state="succeeded")
    log = tmp_path / "follower.log"
    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", "import", "agent-lightning",
           "--server", agl.url, "--lake", str(tmp_path / "lake"), "--run", RUN, "--follow"]  # fmt: skip
    env = {**os.environ, "TRAJLAKE_AGL_PROGRESS_INTERVAL_S": "0.2", "TRAJLAKE_AGL_POLL_INTERVAL_S": "0.1"}
    with log.open("w") as err:
        follower = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    deadline = time.monotonic() + 120
    while log.read_text().count("agent-lightning rollouts: 3 rollouts") < 2:  # a line even while idle
        assert follower.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    follower.send_signal(signal.SIGTERM)
    out, _ = follower.communicate(timeout=60)
    assert follower.returncode == 0, log.read_text()  # SIGTERM is how a follower is stopped: not a failure
    assert "imported 3 trajectories" in out
    said = log.read_text()
    assert said.startswith(f"trajlake import agent-lightning: following {agl.url} into run {RUN!r}")
    assert "stopped by SIGTERM; every trajectory it read is committed" in said
    assert len(stored_trajectories(tmp_path / "lake")) == 3


def test_a_follower_notices_a_restart_even_when_the_new_log_is_longer(tmp_path):
    from trajlake.rollout.adapters.agent_lightning import AglPoller

    fake = FakeAgl()
    config = AgentLightningSettings(server="http://agl.test", page_size=10, follow=True)
    lake = Lake(tmp_path / "lake")
    catalog = Catalog.for_lake(lake.root)
    follower = AglPoller(lake, catalog, AglClient(config, transport=fake.transport()), RUN, config)
    fake.finish("a")
    fake.finish("b")
    assert follower.poll_once() is True
    fake.restart()
    for rid in ("c", "d", "e", "f"):  # more than the cursor (2) before the follower looks again
        fake.finish(rid)
    while not follower.poll_once():
        pass
    report = follower.session.close()
    catalog.close()
    lake.close()
    assert report.trajectories == 6
    assert sorted(stored_turns(tmp_path / "lake")) == ["a", "b", "c", "d", "e", "f"]
