"""SkyRL 0.4 adapter: a real SkyRLGymGenerator run (its own venv, skyrl's RemoteInferenceClient, the
session's vLLM) recorded through RecordingGenerator; the lake served back to SkyRL by LakeGenerator."""

from __future__ import annotations

import json

import pytest

from tests.fixtures.examples import printed, run_example, stored
from tests.helpers import same_floats, stored_trajectories
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout import taxonomy
from trajlake.rollout.adapters.skyrl import BatchSource, UnsupportedSkyrl, check_version, installed_version
from trajlake.rollout.importers.skyrl import EngineCall, SkyrlStep, SkyrlTrajectory, record_skyrl_trajectory
from trajlake.store.lake import Lake


@pytest.fixture(scope="module")
def live(run_skyrl, _vllm_session, tmp_path_factory) -> dict:
    """SkyRLGymGenerator (built by BasePPOExp.get_generator, wrapped) against vLLM: a batch, a failing batch, its retry."""
    _vllm_session.reset()
    root = tmp_path_factory.mktemp("skyrl")
    result = run_skyrl("live", "--lake", str(root / "lake"), "--run-id", "sky-live", "--url", _vllm_session.url,
                       "--model-dir", str(_vllm_session.model_dir), "--model", _vllm_session.name)  # fmt: skip
    result["root"] = root
    result["lake"] = stored_trajectories(root / "lake", "sky-live")
    return result


def _by_step(live: dict, step: int) -> list[dict]:
    rows = [r for r in live["lake"].values() if r["attributes"]["global_step"] == step]
    return sorted(rows, key=lambda r: (r["task_id"], r["attributes"]["attempt"], r["token_ids"]))


@pytest.mark.integration  # a SkyRL process, the session's vLLM
def test_a_skyrl_gym_run_is_recorded_with_the_ids_and_logprobs_the_server_returned(live):
    assert live["isinstance_generator"] and live["dead_letters"] == 0
    answers = live["engine_answers"]  # what vLLM sent, kept by a proxy in front of it
    first = _by_step(live, 1)
    assert len(first) == 4 and {r["group_id"] for r in first} == {"train:1:q0", "train:1:q1"}
    for row in first:
        assert row["finished_events"] == 1 and row["attributes"]["engine_turns"]
        assert len(row["turns"]) == 2 and not row["tito_drift"]
        for turn in row["turns"]:
            assert any(turn["output_token_ids"] == a["token_ids"] and same_floats(turn["output_logprobs"], a["logprobs"])
                       for a in answers)  # fmt: skip
            assert turn["policy_version"] == 0  # RemoteInferenceClient.weight_version: no weight sync yet
    # what the trainer got from SkyRL and what the lake holds are the same sequences, token for token
    lake_sequences = sorted(r["token_ids"] for r in first)
    assert lake_sequences == sorted(row["prompt"] + row["response"] for row in live["rows"])
    for row in live["rows"]:
        model = [t for t, m in zip(row["response"], row["mask"], strict=True) if m]
        assert any(model[: len(a["token_ids"])] == a["token_ids"] for a in answers)
    # each outcome follows SkyRL's stop reason: `length` (the 8-token limit, what the tiny model mostly
    # hits) is a model failure, `stop` a completed episode
    outcome = {"length": ("context_exhausted", "model"), "stop": ("completed", None)}
    stop_of = {tuple(row["prompt"] + row["response"]): row["stop"] for row in live["rows"]}
    for r in first:
        assert (r["status"], r["failure_origin"]) == outcome[stop_of[tuple(r["token_ids"])]], r[
            "trajectory_id"
        ]
    assert {r["reward"] for r in first} <= {0.0, 1.0}


@pytest.mark.integration
def test_a_generate_that_raises_ends_each_trajectory_once_and_its_retry_is_a_new_attempt(live):
    assert live["error"] == "the env's checker crashed" and live["retry_rows"] == 2
    assert all(r["finished_events"] == 1 for r in live["lake"].values())
    second = _by_step(live, 2)
    failed = [r for r in second if r["attributes"]["attempt"] == 0]
    retried = [r for r in second if r["attributes"]["attempt"] == 1]
    assert len(failed) == len(retried) == 2
    for row in failed:  # never trained on: a system failure without a reward
        assert (row["status"], row["failure_origin"], row["failure_label"]) == (
            "error",
            "system",
            "harness_behavior",
        )
        assert row["reward"] is None and "failed" in row["tags"] and "RuntimeError" in row["message"]
    assert any(r["message"].startswith("this trajectory's agent loop raised") for r in failed)
    assert any(len(r["turns"]) >= 1 for r in failed)  # the engine's answers before the crash are kept
    # the retry runs to its end: both turns, ended by SkyRL's stop reason (`length` or `stop`, as above)
    assert all(r["status"] in ("context_exhausted", "completed") and len(r["turns"]) == 2 for r in retried), [
        (r["status"], len(r["turns"])) for r in retried
    ]


@pytest.fixture(scope="module")
def served(run_skyrl, live) -> dict:
    """LakeGenerator on the live run's lake: two trainer steps' batches, checked by validate_generator_output."""
    result = run_skyrl("reverse", "--lake", str(live["root"] / "lake"), "--run-id", "sky-live")
    lake = Lake(live["root"] / "lake")
    try:
        result["consumed"] = lake.sql(
            "select trajectory_id, step from batch_consumption where run_id = 'sky-live'"
        ).to_pylist()
    finally:
        lake.close()
    return result


@pytest.mark.integration  # a SkyRL process
def test_the_lake_serves_a_skyrl_trainer_batches_that_pass_validate_generator_output(live, served):
    assert served["isinstance_generator"]
    trainable = {tuple(r["token_ids"]) for r in live["lake"].values() if r["failure_origin"] != "system"}
    handed = []
    for batch in served["batches"]:  # validate_generator_output passed on both inside the SkyRL process
        assert (
            len(batch["response"]) == 2 and len({t.rsplit("_", 1)[0] for t in batch["trajectory_ids"]}) == 1
        )
        for prompt, response, mask, logprobs in zip(batch["prompt"], batch["response"], batch["mask"],
                                                    batch["logprobs"], strict=True):  # fmt: skip
            assert tuple(prompt + response) in trainable  # the recorded rollout, token for token
            assert len(mask) == len(logprobs) == len(response) and any(mask)
            assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
            handed.append(tuple(prompt + response))
        assert batch["metrics"]["trajlake/sampler_system_failures"] == 2
    assert len(set(handed)) == 4  # two steps, two different groups: nothing handed out twice
    assert len(served["consumed"]) == 4  # both batches committed to batch_consumption


@pytest.mark.integration  # a SkyRL process, the session's vLLM
def test_step_wise_rows_become_one_trajectory_and_their_re_templated_prompts_are_flagged_as_drift(
    run_skyrl, vllm_server, tmp_path
):
    result = run_skyrl("stepwise", "--lake", str(tmp_path / "lake"), "--run-id", "sky-steps", "--url", vllm_server.url,
                       "--model-dir", str(vllm_server.model_dir), "--model", vllm_server.name)  # fmt: skip
    assert len(result["rows"]) == 4 and result["is_last_step"] == [False, True, False, True]
    rows = stored_trajectories(tmp_path / "lake", "sky-steps")
    assert len(rows) == 2 and result["dead_letters"] == 0
    by_sample = {r["sample_index"]: r for r in rows.values()}
    for k, row in by_sample.items():
        assert row["finished_events"] == 1 and len(row["turns"]) == 2
        for turn in row["turns"]:  # the engine's answers, as it returned them
            assert any(turn["output_token_ids"] == a["token_ids"] and same_floats(turn["output_logprobs"], a["logprobs"])
                       for a in result["engine_answers"])  # fmt: skip
        # SkyRL renders each step's prompt from the chat history again (re-tokenising the first
        # answer's text): the lake flags drift exactly when the second prompt does not extend the
        # first prompt + the engine's first output
        first, second = [r for r in result["rows"] if r["trajectory_id"] == f"q0_{k}"]
        output = [t for t, m in zip(first["response"], first["mask"], strict=True) if m]
        extends = second["prompt"][: len(first["prompt"]) + len(output)] == first["prompt"] + output
        assert [t["tito_drift"] for t in row["turns"]] == [False, not extends]
        assert row["tito_drift"] == (not extends)


@pytest.mark.integration  # a SkyRL process (the served model's tokenizer; its engine answers without ids)
def test_an_engine_answer_without_token_ids_is_stored_as_text_and_flagged(run_skyrl, vllm_server, tmp_path):
    result = run_skyrl("objects", "--lake", str(tmp_path / "lake"), "--run-id", "sky-text", "--model-dir",
                       str(vllm_server.model_dir))  # fmt: skip
    (row,) = stored_trajectories(tmp_path / "lake", "sky-text").values()
    assert result["dead_letters"] == 0 and row["finished_events"] == 1
    assert [t["output_token_ids"] for t in row["turns"]] == [[], []]
    for turn in row["turns"]:
        assert json.loads(turn["attributes"]) == {"tokens_recorded": False, "completion": "four"}
        assert turn["policy_version"] == 7  # the engine's weight_version
    assert any("no token ids; stored as text" in w for w in result["warnings"])


@pytest.mark.integration  # the example as its docs say (a plain `python`): the SkyRL venv, the session's vLLM
def test_the_example_records_rollouts_and_serves_them_back(skyrl_venv, vllm_server, tmp_path):
    done = run_example("skyrl", "--lake", str(tmp_path / "lake"), "--vllm-url", vllm_server.url, "--prompts", "2",
                       "--samples", "2", "--run-id", "sky-example", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert printed(done.stdout) == stored(tmp_path / "lake", "sky-example")
    assert printed(done.stdout)["trajectories"] == 4 and "0 dead letters" in done.stdout
    assert (
        "served 4 trajectories from the lake to a SkyRL trainer step (validate_generator_output passed)"
        in done.stdout
    )
    rows = stored_trajectories(tmp_path / "lake", "sky-example")
    assert len(rows) == 4 and all(len(r["turns"]) == 2 and r["finished_events"] == 1 for r in rows.values())


def test_the_trainer_s_sampler_is_what_lake_generator_reads_from(lake):
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler

    assert isinstance(Sampler(lake, None, SamplerConfig()), BatchSource)


def test_an_unknown_skyrl_version_names_the_supported_one():
    with pytest.raises(
        UnsupportedSkyrl, match=r"skyrl 0\.3\.1 is not supported; this adapter supports skyrl 0\.4\.x"
    ):
        check_version("0.3.1")
    check_version("0.4.0")


def test_without_skyrl_installed_the_adapter_says_how_to_get_it():
    try:
        import skyrl  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedSkyrl, match=r"skyrl is not installed here.*framework-venv\.sh skyrl"):
            installed_version()
    else:
        assert installed_version().startswith("0.4")


def test_engine_turns_that_break_the_prefix_are_flagged_as_tito_drift(lake):
    # a second turn whose input is not the first turn's input + output: SkyRL re-templated the history
    calls = [
        EngineCall([1, 2, 3], [4, 5], [-0.5, -0.25], "stop", policy_version=2),
        EngineCall([1, 2, 3, 9, 9, 6], [7], [-0.125], "stop", policy_version=3),
    ]
    traj = SkyrlTrajectory(
        "task", 0, [SkyrlStep([1, 2, 3], [4, 5, 6, 7], [1, 1, 0, 1], None, 1.0, "stop", "task", 0)]
    )
    bus = InProcessBus()
    record_skyrl_trajectory(Recorder(bus, "drift"), traj, "t-1", calls=calls)
    DeltaSink(lake, bus, SinkConfig(exactly_once=False)).run(until_idle_s=0.0)
    turns = lake.sql(
        "select tito_drift, input_token_ids, output_logprobs, policy_version from events where event_type = 'turn' "
        "order by turn_index"
    ).to_pylist()
    assert [t["tito_drift"] for t in turns] == [False, True]
    assert turns[1]["input_token_ids"] == [1, 2, 3, 9, 9, 6]  # stored whole where the prefix broke
    assert [t["policy_version"] for t in turns] == [2, 3] and turns[1]["output_logprobs"] == [-0.125]
    (row,) = lake.sql("select reward, status, tito_drift from trajectories").to_pylist()
    assert row == {"reward": 1.0, "status": "completed", "tito_drift": True}


@pytest.mark.parametrize(
    ("name", "base", "expected"),
    [
        ("ClientConnectorError", OSError, taxonomy.INFRA_FAILED),  # aiohttp: vLLM is down
        ("ServerDisconnectedError", Exception, taxonomy.INFRA_FAILED),
        ("RuntimeError", RuntimeError, taxonomy.HARNESS_FAILED),  # an env or generator bug
    ],
    ids=["engine-unreachable", "engine-disconnected", "env-bug"],
)
def test_the_exceptions_a_skyrl_generate_raises_map_to_the_failure_taxonomy(name, base, expected):
    assert taxonomy.classify_exception(type(name, (base,), {})("boom")) is expected
