"""`trajlake demo`: a shortened run learns, fills every table, and shows every failure label."""

from __future__ import annotations

import html
import json
import os
import re
import socket
from pathlib import Path

import pytest

from tests.helpers import tampered_copy
from trajlake.cli import main
from trajlake.dashboards.commands import APP
from trajlake.demo.report import HARNESS_SQL
from trajlake.schemas.events import FAILURE_LABELS
from trajlake.store.lake import Lake

TABLES = ("events", "trajectories", "turns", "tool_calls", "dead_letters", "policy_versions", "trainer_steps",
          "batch_consumption")  # fmt: skip


def run_demo_cli(tmp_path: Path, run_id: str, *args: str) -> tuple[int, dict, Lake]:
    summary_path = tmp_path / "summary.json"
    code = main(
        ["demo", "--lake", str(tmp_path / "lake"), "--run", run_id, "--json", str(summary_path), *args]
    )
    return code, json.loads(summary_path.read_text()), Lake(tmp_path / "lake")


def reward_by_version(lake: Lake, run_id: str) -> list[float]:
    """Mean scored reward per policy version, read straight from the lake."""
    rows = lake.sql(
        """select policy_version_min as v, avg(reward) as r from trajectories
            where run_id = $run and finished and reward is not null and coalesce(failure_origin, '') <> 'system'
            group by v order by v""",
        {"run": run_id},
    )
    return rows.column("r").to_pylist()


def one_of(lake: Lake, run_id: str, query: str) -> dict:
    return lake.sql(query, {"run": run_id}).to_pylist()[0]


def rows_of_run(lake: Lake, table: str, run_id: str) -> int:
    return lake.sql(f"select count(*) from {table} where run_id = $run", {"run": run_id}).column(0)[0].as_py()


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory) -> tuple[int, dict, Lake]:
    """One shortened demo (threads, 24 steps, doubled fault rates) shared by the tests below."""
    tmp_path = tmp_path_factory.mktemp("demo")
    return run_demo_cli(
        tmp_path, "short", "--engine", "tiny", "--no-ray", "--steps", "24", "--fault-rate", "2"
    )


@pytest.mark.integration
@pytest.mark.slow
def test_a_short_demo_learns_and_fills_every_table(short_demo):
    code, summary, lake = short_demo

    assert code == 0, "the demo exits 1 when it did not learn"
    rewards = reward_by_version(lake, "short")
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    assert last >= first + 0.2, f"reward by version did not rise enough: {rewards}"
    assert summary["learned"] and summary["steps"] == 24

    empty = [t for t in TABLES if rows_of_run(lake, t, "short") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    labels = (
        lake.sql("select distinct failure_label from trajectories where run_id = 'short'")
        .column(0)
        .to_pylist()
    )
    assert set(FAILURE_LABELS) <= set(labels)
    spanning = (
        lake.sql(
            "select count(*) from trajectories where run_id = 'short' and policy_version_max > policy_version_min"
        )
        .column(0)[0]
        .as_py()
    )
    assert spanning > 0, "no trajectory picked up a new policy version mid-episode"
    stale = (
        lake.sql("select max(staleness) from batch_consumption where run_id = 'short'").column(0)[0].as_py()
    )
    assert stale <= 2  # the default max_staleness

    overfit = summary["overfit"]
    assert overfit["tasks"] == 32 and overfit["reward_after"] > overfit["reward_before"]
    assert rows_of_run(lake, "trajectories", "short-overfit") >= 32 * 8


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("run_id", ["short", "short-overfit"])
def test_every_consumed_trajectory_keeps_the_advantage_the_trainer_computed(short_demo, run_id):
    import torch

    from trajlake.dashboards import metrics
    from trajlake.trainer.losses import compute_advantages

    _, _, lake = short_demo
    rows = lake.sql(
        """select b.step, b.advantage, t.group_id, t.reward from batch_consumption b
           join trajectories t using (run_id, trajectory_id) where b.run_id = $run order by b.step""",
        {"run": run_id},
    ).to_pylist()
    assert rows and all(r["advantage"] is not None for r in rows)
    zero_signal = []
    for step in sorted({r["step"] for r in rows}):
        mine = [r for r in rows if r["step"] == step]
        groups = sorted({r["group_id"] for r in mine})
        index = torch.tensor([groups.index(r["group_id"]) for r in mine])
        expected = compute_advantages("drgrpo", torch.tensor([r["reward"] for r in mine]), index)
        assert [r["advantage"] for r in mine] == pytest.approx(expected.tolist(), abs=1e-6)
        zero_signal.append(sum(all(r["advantage"] == 0 for r in mine if r["group_id"] == g) for g in groups))
    counted = metrics.zero_signal_groups(lake, run_id).column("n_zero_signal_groups").to_pylist()
    assert counted == zero_signal  # the groups the figure counts are exactly those the trainer gave no signal


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    "page", ["overview", "entropy", "behaviour", "failures", "async", "health", "browser", "sql"]
)
def test_every_dashboard_page_shows_the_demo_run(short_demo, monkeypatch, page):
    from streamlit.testing.v1 import AppTest

    _, _, lake = short_demo
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = page
    at.query_params["run"] = "short"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page in ("overview", "entropy", "behaviour", "failures", "async"):
        assert list(at.get("vega_lite_chart")), f"the {page} page drew no chart of the demo run"


@pytest.mark.integration
@pytest.mark.slow
def test_doctor_raises_no_health_alert_on_the_demo(short_demo, capsys):
    _, _, lake = short_demo
    main(["doctor", "--lake", lake.root, "--run", "short", "--format", "json"])
    health = json.loads(capsys.readouterr().out)["health"]
    assert health["alerts"] == []
    status = {s["name"]: s["status"] for s in health["signals"]}
    judged = ("entropy_collapse", "reward_length", "advantage_drift", "tool_error_spike")
    assert {name: status[name] for name in judged} == dict.fromkeys(judged, "ok")  # computed, and calm


@pytest.mark.integration
@pytest.mark.slow
def test_ablate_replays_the_demo_run(short_demo, capsys):
    _, _, lake = short_demo
    capsys.readouterr()
    assert main(["ablate", "--lake", lake.root, "--run", "short"]) == 0
    table = capsys.readouterr().out
    assert "ablation of run short" in table and "token_mean" in table and "prompt_mean" in table


def first_step_measuring_the_engine(lake: Lake) -> int:
    """A step after the first whose batch held tokens the trainer's own weights generated (mismatch measured)."""
    return one_of(
        lake,
        "short",
        "select min(step) as s from trainer_steps where run_id = $run and step > 0 and mismatch_tokens > 0",
    )["s"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("run_id", ["short", "short-overfit"], ids=["async", "overfit-trained-again"])
def test_a_stored_demo_step_replays_to_what_its_trainer_recorded(short_demo, capsys, run_id):
    _, _, lake = short_demo
    step = first_step_measuring_the_engine(lake) if run_id == "short" else 5
    capsys.readouterr()
    args = ["ablate", "--lake", lake.root, "--run", run_id, "--verify-step", str(step), "--format", "json"]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    values = {v["name"]: v for v in report["values"]}
    assert report["reproduces"] and report["weights_version"] == step
    assert report["checkpoint"].endswith(f"step-{step:06d}.pt")
    assert all(values[n]["recorded"] is not None for n in ("loss", "grad_norm", "advantage"))
    if run_id == "short":  # the engine mismatch of the async run, recomputed
        assert values["mismatch"]["replayed"] is not None and values["mismatch_tokens"]["recorded"] > 0
    else:  # the overfit check's batch of step 0, trained on again: drift, no engine mismatch
        assert report["batch_step"] == 0 and values["mismatch"]["recorded"] is None
        assert values["drift"]["replayed"] > 0.03


def _loss_changed(step: int):
    """trainer_steps' loss of the run's `step`, off by 1e-3."""
    return lambda row: row["loss"] + (1e-3 if (row["run_id"], row["step"]) == ("short", step) else 0)


def _next_versions_checkpoint(step: int):
    """policy_versions' checkpoint of `step`'s weights replaced by the next version's."""
    return lambda row: (
        row["checkpoint"] and row["checkpoint"].replace(f"step-{step:06d}", f"step-{step + 1:06d}")
    )


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(
    ("table", "column", "change"),
    [("trainer_steps", "loss", _loss_changed), ("policy_versions", "checkpoint", _next_versions_checkpoint)],
    ids=["a-recorded-loss-changed", "another-versions-checkpoint"],
)
def test_a_doctored_copy_of_the_demo_lake_fails_the_check_naming_the_value(
    short_demo, tmp_path, capsys, table, column, change
):
    _, _, lake = short_demo
    step = first_step_measuring_the_engine(lake)
    copy = tampered_copy(Path(lake.root), tmp_path / "lake", table, column, change(step))
    capsys.readouterr()
    assert (
        main(["ablate", "--lake", str(copy), "--run", "short", "--verify-step", str(step), "--format", "csv"])
        == 1
    )
    err = capsys.readouterr().err
    assert f"step {step} of run short does NOT reproduce: loss recorded" in err, err
    if table == "policy_versions":  # other weights: the gradient and the engine mismatch differ too
        assert "grad_norm recorded" in err and "mismatch recorded" in err, err


def test_demo_rejects_bad_settings_with_the_option_to_fix(tmp_path, capsys):
    code = main(["demo", "--lake", str(tmp_path / "lake"), "--steps", "1"])
    assert code == 2
    assert "--steps" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_over_kafka_fills_the_same_tables(tmp_path, kafka_topic, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_KAFKA_SPOOL_DIR", str(tmp_path / "spool"))
    code, summary, lake = run_demo_cli(
        tmp_path, "kafka", "--engine", "tiny", "--no-ray", "--steps", "6", "--overfit-tasks", "0", "--fault-rate", "3",
        "--kafka", kafka_topic.bootstrap, "--topic", kafka_topic.topic,
    )  # fmt: skip

    assert code in (0, 1)  # six steps are too few to judge learning; the path through Kafka is under test
    assert summary["steps"] == 6
    empty = [t for t in TABLES if rows_of_run(lake, t, "kafka") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    sources = lake.sql("select distinct topic from dead_letters where run_id = 'kafka'").column(0).to_pylist()
    assert sources == [kafka_topic.topic]
    assert rows_of_run(lake, "trajectories", "kafka") == summary["trajectories"]


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_on_local_ray_workers_fills_the_same_tables(tmp_path):
    code, _, lake = run_demo_cli(
        tmp_path,
        "ray",
        "--engine",
        "tiny",
        "--ray",
        "--steps",
        "8",
        "--overfit-tasks",
        "0",
        "--fault-rate",
        "3",
    )

    assert code in (0, 1)  # eight steps are too few to judge learning; the Ray path is under test
    empty = [t for t in TABLES if rows_of_run(lake, t, "ray") == 0]
    assert not empty, f"tables without rows of the run: {empty}"
    producers = lake.sql(
        "select distinct producer_id from events where run_id = 'ray' and event_type = 'turn'"
    )
    this_process = f"{socket.gethostname()}:{os.getpid()}"
    assert this_process not in producers.column(0).to_pylist()  # episodes ran in Ray worker processes
    versions = lake.sql("select max(policy_version) from turns where run_id = 'ray'").column(0)[0].as_py()
    assert versions >= 4  # the workers picked up the weights the trainer published


@pytest.fixture(scope="module")
def vllm_demo(tmp_path_factory, _vllm_session) -> tuple[int, dict, Lake]:
    """One vLLM demo (threads, 60 steps, no overfit check) shared by the tests below: it warm-starts the
    session server's random model into the lake, serves it, and trains it in place."""
    _vllm_session.reset()
    tmp_path = tmp_path_factory.mktemp("vllm-demo")
    return run_demo_cli(
        tmp_path, "engine", "--engine", "vllm", "--vllm-url", _vllm_session.url, "--model", str(_vllm_session.model_dir),
        "--no-ray", "--overfit-tasks", "0",
    )  # fmt: skip


def one(lake: Lake, query: str) -> dict:
    return one_of(lake, "engine", query)


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_on_vllm_learns_and_turns_carry_the_servers_weight_versions(vllm_demo, monkeypatch):
    code, summary, lake = vllm_demo
    rewards = reward_by_version(lake, "engine")
    # a failure shows each step's (grad norm, entropy) as well: CI keeps no lake to look into
    steps = lake.sql(
        "select round(grad_norm, 2) as grad, round(entropy, 3) as entropy from trainer_steps where run_id = 'engine' order by step"
    ).to_pylist()
    assert code == 0 and summary["learned"], (
        f"reward by version did not rise enough: {rewards}; steps: {steps}"
    )
    # every turn names the weights the server had when it sampled it (its weight_versions spans)
    versions = (
        lake.sql("select distinct policy_version from turns where run_id = 'engine'").column(0).to_pylist()
    )
    assert 0 in versions and max(versions) >= 30
    models = lake.sql("select distinct model from trajectories where run_id = 'engine'").column(0).to_pylist()
    # the warm-started model, whose tokenizer decodes them
    assert models == [str((Path(lake.root) / "model-warm").resolve())]
    assert one(lake, "select count(*) as n from trajectories where run_id = $run and tito_drift")["n"] == 0
    # the mismatch is the engine's against the trainer's: real, and healthy in float32
    mismatch = (
        lake.sql(
            "select mismatch from trainer_steps where run_id = 'engine' and mismatch is not null order by step"
        )
        .column(0)
        .to_pylist()
    )
    assert mismatch and all(m < 0.03 for m in mismatch) and any(m > 0 for m in mismatch)

    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params["page"] = "async"
    at.query_params["run"] = "engine"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = {m.label: m.value for m in at.metric}["Logprob mismatch (latest step)"]
    latest = mismatch[-1]
    assert float(shown) == pytest.approx(latest, rel=0.01, abs=1e-12) and float(shown) < 0.03, shown


@pytest.mark.integration
@pytest.mark.slow
def test_the_vllm_demos_model_writes_its_calls_and_the_harness_handles_what_goes_wrong(vllm_demo):
    _, summary, lake = vllm_demo
    turns = one(
        lake,
        "select avg(n_output_tokens) as mean, count(distinct n_output_tokens) as n from turns where run_id = $run",
    )
    assert turns["mean"] > 5 and turns["n"] > 10  # calls written token by token, not one action token
    calls = lake.sql(
        "select tool_name, arguments from tool_calls where run_id = 'engine' and error_type is null limit 200"
    ).to_pylist()
    arguments = {
        json.loads(c["arguments"])["expression" if c["tool_name"] == "calc" else "code"] for c in calls
    }
    assert len(arguments) > 50  # the arguments are the model's own, copied from each task
    harness = summary["harness"]
    assert harness["malformed"] > 0 and harness["malformed_retried"] > 0 and harness["ok_after_retry"] > 0
    assert harness["truncated"] > 0 and harness["nudged"] > 0
    assert harness == {k: one(lake, q)[k] for q in HARNESS_SQL.values() for k in one(lake, q)}  # as SQL says
    # injected system faults stay system failures, never a trainable reward of 0
    system = lake.sql(
        "select failure_label as label, count(reward) as scored from trajectories "
        "where run_id = 'engine' and failure_origin = 'system' group by all"
    ).to_pylist()
    assert {"verifier_error", "harness_behavior"} <= {r["label"] for r in system}
    # a faulted tool or verifier leaves no reward; an answer cut off by the output budget (tool_design)
    # keeps its score for inspection, and the sampler drops it as a system failure all the same
    assert all(r["scored"] == 0 for r in system if r["label"] != "tool_design")


def app_page(lake: Lake, monkeypatch, page: str, **params: str):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, value in {"page": page, "run": "engine", **params}.items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


@pytest.mark.integration
@pytest.mark.slow
def test_the_dashboard_shows_the_vllm_demos_harness_lessons(vllm_demo, monkeypatch):
    _, summary, lake = vllm_demo
    at = app_page(lake, monkeypatch, "behaviour")
    # AppTest keeps no key of a dataframe: each table is told by its columns
    tools = next(d.value for d in at.dataframe if "n_truncated" in d.value.columns)
    assert tools["n_truncated"].sum() == summary["harness"]["truncated"] > 0
    assert tools["n_retries"].sum() > 0  # calls that ran after malformed ones
    by_version = next(d.value for d in at.dataframe if "nudge_rate" in d.value.columns)
    assert by_version["nudge_rate"].max() > 0 and by_version["assistant_tokens_per_turn"].min() > 5
    failed = app_page(lake, monkeypatch, "failures").get("vega_lite_chart")
    assert any("malformed_call" in chart.proto.spec for chart in failed)
    # the longest trajectory with a malformed call and its retry, its tokens shaded by their sampled logprob
    retried = (
        lake.sql(
            "select trajectory_id from trajectories where run_id = 'engine' and trajectory_id in "
            "(select trajectory_id from tool_calls where run_id = 'engine' and retries > 0) "
            "order by assistant_tokens desc, trajectory_id limit 1"
        )
        .column(0)[0]
        .as_py()
    )
    at = app_page(lake, monkeypatch, "browser", trajectory=retried)
    body = "".join(h.proto.body for h in at.get("html") if 'class="tok' in h.proto.body)
    shades = re.findall(r'class="tok model"[^>]*style="background:([^;]*);', body)
    assert len(shades) > 30 and len(set(shades)) > 5  # many model tokens, their shade varies along the turn
    # the runner's error the model read before its retry, one span per token: read as text
    assert "Malformed tool call" in html.unescape(re.sub(r"<[^>]+>", "", body))


@pytest.mark.integration
@pytest.mark.slow
def test_a_naive_client_re_encoding_the_vllm_demos_text_is_flagged_as_drift(vllm_demo, bus, drain, lake):
    """encode(decode(ids)) != ids on text the demo's model sampled; replaying its trajectories with the
    engine's ids records no drift, a client that re-encodes the conversation's text is flagged."""
    from transformers import AutoTokenizer

    from trajlake.ingest.recorder import Recorder

    _, _, demo = vllm_demo
    tokenizer = AutoTokenizer.from_pretrained(str(Path(demo.root) / "model-warm"))

    def reencoded(ids: list[int]) -> list[int]:
        return tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)

    rows = demo.sql(
        "select trajectory_id, input_token_ids as appended, output_token_ids as ids, output_logprobs as lps "
        "from turns where run_id = 'engine' order by trajectory_id, turn_index"
    ).to_pylist()
    changed = sorted({r["trajectory_id"] for r in rows if reencoded(r["ids"]) != r["ids"]})
    assert changed, "no sampled turn of the demo re-encodes to other ids"
    recorder = Recorder(bus, "replay", vocab_size=len(tokenizer))
    for trajectory_id in changed[:5]:
        turns = [r for r in rows if r["trajectory_id"] == trajectory_id]
        for client in ("tito", "naive"):
            with recorder.start(f"{client}/{trajectory_id}") as traj:
                history: list[int] = []
                more = {"appended": [], "ids": [tokenizer.eos_token_id], "lps": [0.0]}  # the client goes on
                for r in [*turns, more]:
                    history += r["appended"]
                    prompt = reencoded(history) if client == "naive" else history
                    traj.turn(r["ids"], r["lps"], 0, full_input_token_ids=prompt)
                    history += r["ids"]
                traj.finish("completed")
    drain()
    flagged = lake.sql("select task_id, tito_drift from trajectories where run_id = 'replay'").to_pylist()
    assert len(flagged) == 2 * min(5, len(changed))
    assert all(r["tito_drift"] == r["task_id"].startswith("naive/") for r in flagged)


@pytest.mark.integration
@pytest.mark.slow
def test_the_vllm_demo_on_ray_workers_samples_from_the_server_in_worker_processes(
    tmp_path, vllm_server, vllm_demo, monkeypatch
):
    # the other demo's warm-started model, as it is
    monkeypatch.setenv("TRAJLAKE_DEMO_WARM_START__STEPS", "0")
    code, _, lake = run_demo_cli(
        tmp_path, "ray-engine", "--engine", "vllm", "--vllm-url", vllm_server.url,
        "--model", str(Path(vllm_demo[2].root) / "model-warm"), "--ray", "--workers", "4", "--steps", "5",
        "--overfit-tasks", "0",
    )  # fmt: skip

    assert code in (0, 1)  # five steps are too few to judge learning; the Ray path is under test
    producers = (
        lake.sql(
            "select distinct producer_id from events where run_id = 'ray-engine' and event_type = 'turn'"
        )
        .column(0)
        .to_pylist()
    )
    assert f"{socket.gethostname()}:{os.getpid()}" not in producers  # episodes ran in Ray worker processes
    versions = (
        lake.sql("select max(policy_version) from turns where run_id = 'ray-engine'").column(0)[0].as_py()
    )
    assert versions >= 2  # the server's weights changed under the running workers
    tokens = one_of(lake, "ray-engine", "select avg(n_output_tokens) as mean from turns where run_id = $run")
    assert tokens["mean"] > 5
