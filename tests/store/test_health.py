"""Health signals on synthetic runs: each pathology raises its own alert at the step where it began,
the healthy run raises none, and `trajlake doctor` prints and exits on them."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest

from tests.health_runs import HEALTHY, ONSET, PATHOLOGIES, STEPS, build_health_lake
from trajlake.cli import main
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.store.config import HealthSettings
from trajlake.store.health import (
    ALERT,
    NOT_RECORDED,
    OK,
    RunFigures,
    diagnose_health,
    entropy_collapse,
    unprintable,
)
from trajlake.store.summaries import ngram_repetition

WORDS = ["the", "model", "reads", "a", "file", "then", "calls", "tool", "and", "writes", "its", "answer",
         "in", "plain", "words", "for", "user"]  # fmt: skip


@pytest.fixture(scope="module")
def health_lake(tmp_path_factory):
    """Every synthetic run in one lake (shared, read-only)."""
    return build_health_lake(tmp_path_factory.mktemp("health") / "lake")


@pytest.mark.parametrize("run_id", HEALTHY, ids=HEALTHY)
def test_a_healthy_run_raises_no_alert(health_lake, run_id):
    report = diagnose_health(health_lake, run_id)
    assert report.alerts == []
    assert {s.name: s.status for s in report.signals} == {
        "entropy_collapse": OK, "mismatch_acceleration": OK, "reward_length": OK,
        "advantage_drift": OK, "tool_error_spike": OK, "garbled_output": OK,
    }  # fmt: skip


@pytest.mark.parametrize("run_id", list(PATHOLOGIES), ids=list(PATHOLOGIES))
def test_each_pathology_raises_its_alert_where_it_began(health_lake, run_id):
    report = diagnose_health(health_lake, run_id)
    assert [a.signal for a in report.alerts] == [PATHOLOGIES[run_id]]
    alert = report.alerts[0]
    assert alert.start == ONSET
    if alert.axis == "step":
        assert alert.step == ONSET and f"steps {ONSET}–{ONSET + 4}" in alert.message
    else:  # rollouts of policy version ONSET came from the weights of trainer step ONSET - 1
        assert (
            alert.step == ONSET - 1
            and f"policy versions {ONSET}–{ONSET + 4} (trained from step {ONSET - 1})" in alert.message
        )


def test_an_agent_learning_a_tool_call_is_not_read_as_length_exploitation(health_lake):
    """Its reward rises with output tokens per trajectory and with turns (what the signal read
    before it compared like with like), not with length among samples that took as many turns."""
    raw = health_lake.sql(
        """select policy_version_min // 5 * 5 as start, avg(reward) as reward, avg(assistant_tokens) as tokens,
                  corr(reward, assistant_tokens) as corr_tokens, corr(reward, n_turns) as corr_turns
           from trajectories where run_id = 'learns-tools' group by start order by start"""
    ).to_pylist()
    first = raw[0]
    assert any(
        w["reward"] > first["reward"] + 0.3 and w["tokens"] > 1.5 * first["tokens"] and w["corr_tokens"] > 0.5
        and w["corr_turns"] > 0.5
        for w in raw
    )  # fmt: skip
    signal = diagnose_health(health_lake, "learns-tools").signal("reward_length")
    assert signal.status == OK and all(abs(w["corr_alike"]) < 0.5 for w in signal.windows)
    hacked = diagnose_health(health_lake, "tools-then-length").signal("reward_length")
    assert [w["corr_alike"] > 0.5 for w in hacked.windows] == [False, False, True, True]


@pytest.mark.parametrize("consumed_every_step", [False, True], ids=["overfit-check", "new-batch-each-step"])
def test_steps_again_on_one_batch_say_nothing_of_the_policys_entropy(lake, bus, drain, consumed_every_step):
    """The overfit check trains 8 steps on the batch it consumed once: its entropy on that batch
    falls as it fits it, which is the check working. A run whose every step took a new batch and saw
    the same fall has collapsed."""
    from trajlake.trainer.mismatch import write_trainer_steps

    rollouts, trainer = (
        Recorder(bus, "fit", flush_each_turn=False),
        Recorder(bus, "fit", producer_id="trainer"),
    )
    ids = []
    for i in range(32):
        with rollouts.start(f"task-{i // 8}", f"g{i // 8}", i % 8) as traj:
            traj.turn([5, 6, 7], [-0.7] * 3, 0, input_token_ids=[1, 2])
            traj.reward(float(i % 2))
            traj.finish("completed")
        ids.append(traj.trajectory_id)
    for step in range(8 if consumed_every_step else 1):
        trainer.batch_consumed(step, step, ids, [step] * len(ids), [0.5 - i % 2 for i in range(32)])
    drain()
    write_trainer_steps(lake, [
        {"run_id": "fit", "step": step, "trainer_version": step + 1, "entropy": 0.5**step,
         "mismatch": 1e-7 if step == 0 else None, "mismatch_tokens": 96 if step == 0 else 0}
        for step in range(8)
    ])  # fmt: skip
    signal = diagnose_health(lake, "fit").signal("entropy_collapse")
    if consumed_every_step:
        assert signal.status == ALERT and signal.alert.start == 0
    else:
        assert signal.status == OK and [w["points"] for w in signal.windows] == [1]


def test_a_trainer_without_advantages_says_not_recorded(health_lake):
    signal = diagnose_health(health_lake, "no-advantages").signal("advantage_drift")
    assert signal.status == NOT_RECORDED and "recorded no advantages" in signal.note
    assert signal.alert is None


def test_thresholds_are_settings(health_lake):
    lenient = HealthSettings(mismatch_growth=100.0)
    assert diagnose_health(health_lake, "mismatch", lenient).alerts == []
    strict = HealthSettings(tool_error_increase=0.01, tool_error_z=0.01, min_samples=1)
    signal = diagnose_health(health_lake, "healthy", strict).signal("tool_error_spike")
    assert signal.status == ALERT  # noise alone crosses a threshold this low


def test_windows_show_the_figures_behind_an_alert(health_lake):
    signal = diagnose_health(health_lake, "garbled").signal("garbled_output")
    by_start = {w["start"]: w for w in signal.windows}
    assert by_start[ONSET - 5]["share"] == 0 and by_start[ONSET]["share"] == 1
    assert by_start[ONSET]["repetition"] > 0.5


def entropy_signal(entropies: list[float]):
    """The entropy-collapse signal of a trainer that logged `entropies`, one per step from 0."""
    trainer = [{"step": step, "entropy": e, "mismatch": None} for step, e in enumerate(entropies)]
    return entropy_collapse(RunFigures(None, "run", HealthSettings(), None, trainer=trainer))


def test_a_steep_fall_in_the_last_unfinished_window_waits_for_the_window():
    calm = [1.0 - 0.02 * step for step in range(20)]
    steep = [0.6, 0.45, 0.3]  # 15% of the start per step, but over 3 of the window's 5 steps
    signal = entropy_signal(calm + steep)
    assert signal.alert is None and signal.windows[-1]["slope"] is None
    assert entropy_signal(calm + steep + [0.15, 0.05]).alert.start == 20  # complete: judged


def test_a_dip_within_a_window_that_leaves_the_level_is_no_collapse():
    """Per-step entropy of a healthy run with small batches (the vLLM demo's): noisy around 0.37."""
    noisy = [0.30, 0.38, 0.37, 0.31, 0.47, 0.36, 0.33, 0.35, 0.39, 0.26, 0.43, 0.41, 0.39, 0.40, 0.34]
    dip = [0.47, 0.36, 0.32, 0.34, 0.26]  # −0.045 a step: 12% of the start a step, for five steps
    assert entropy_signal(noisy + dip).alert is None
    collapse = [0.3, 0.2, 0.12, 0.08, 0.05]  # the same steps falling and staying down
    assert entropy_signal(noisy + collapse).alert.start == 15
    early = [0.8, 0.67, 0.55, 0.42, 0.3]  # a fall in the first window: no earlier level to compare
    assert entropy_signal(early + [0.25] * 5).alert.start == 0


def test_repetition_is_the_share_of_repeated_ngrams():
    rng = random.Random(3)
    rows = [
        [1, 2, 3, 4, 5, 6],
        [7, 8, 9] * 6,
        [1, 2, 3, 4, 1, 2, 3],  # its last 1 2 3 and the next row's 4 make no 4-gram
        [4, 9],
        None,
        [],
    ]
    rows += [[rng.randrange(40) for _ in range(rng.randrange(60))] for _ in range(3000)]  # repeats
    rows.insert(1000, [rng.randrange(3000) for _ in range(100_000)])  # longer than a block of 4,096
    column = pa.array([[5, 5, 5, 5, 5], *rows], pa.list_(pa.int32())).slice(1)  # offsets not from 0
    scores = ngram_repetition(column)
    assert scores[:3].tolist() == [0.0, pytest.approx(1 - 3 / 15), 0.0]
    assert np.isnan(scores[3:6]).all()  # under 4 tokens, or none: no 4-gram to judge
    for ids, score in zip(rows[6:], scores[6:], strict=True):
        grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
        assert score == pytest.approx(1 - len(set(grams)) / len(grams)) if grams else np.isnan(score)


def test_unprintable_counts_control_and_replacement_characters():
    assert unprintable("hello world\n") == 0
    assert unprintable("ab\x00\x01\ufffd") == pytest.approx(3 / 5)


def test_doctor_names_the_alert_and_fails(health_lake, capsys):
    code = main(["doctor", "--lake", health_lake.root, "--run", "entropy"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"ALERT entropy collapse from steps {ONSET}–{ONSET + 4}" in out
    assert "FAIL: health alerts: entropy_collapse" in out


def test_doctor_passes_a_healthy_run_and_reports_json(health_lake, capsys):
    assert main(["doctor", "--lake", health_lake.root, "--run", "healthy"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")
    code = main(["doctor", "--lake", health_lake.root, "--run", "tools", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["healthy"] is False
    assert [(a["signal"], a["start"]) for a in report["health"]["alerts"]] == [("tool_error_spike", ONSET)]


def test_doctor_thresholds_are_options(health_lake, capsys):
    code = main(["doctor", "--lake", health_lake.root, "--run", "tools", "--tool-error-increase", "0.9"])
    assert code == 0, capsys.readouterr().out


def test_unprintable_text_is_found_with_the_runs_tokenizer(lake, bus, drain, model_dir, tokenizer):
    rng = random.Random(5)
    recorder = Recorder(bus, "text", flush_each_turn=False)
    for version in range(STEPS):
        for i in range(8):
            if version < ONSET:  # prose, each turn its own words
                text = " ".join(rng.choice(WORDS) for _ in range(24))
            else:  # control characters: unprintable, yet no n-gram repeats
                text = "".join(chr(rng.randrange(1, 32)) + rng.choice("abcdefgh") for _ in range(24))
            with recorder.start(f"t{i}", model=str(model_dir)) as traj:
                out = tokenizer.encode(text)
                traj.turn(out, [-0.5] * len(out), version, input_token_ids=[1, 2, 3])
                traj.finish("completed")
    drain()
    report = diagnose_health(lake, "text")
    entropy = report.signal("entropy_collapse")  # no trainer here: −mean sampled logprob per version
    assert (entropy.axis, entropy.status) == ("policy version", "ok") and "no entropy" in entropy.note
    assert entropy.windows[0]["entropy"] == pytest.approx(0.5)
    signal = report.signal("garbled_output")
    assert signal.note == "repetition and unprintable text"
    assert signal.alert is not None and signal.alert.start == ONSET
    assert {w["start"]: w["unprintable"] > 0.3 for w in signal.windows} == {
        0: False,
        5: False,
        10: True,
        15: True,
    }
    assert all(w["repetition"] < 0.2 for w in signal.windows)


def test_a_tokenizer_that_does_not_load_is_an_error_naming_the_fix(health_lake, tmp_path, capsys):
    code = main(
        ["doctor", "--lake", health_lake.root, "--run", "healthy", "--tokenizer", str(tmp_path / "none")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "does not load" in err and "pass a local model or tokenizer directory" in err


def test_turns_projected_before_their_repetition_are_named_and_a_rebuild_scores_them(tmp_path, monkeypatch):
    from trajlake.ingest.sink import DeltaSink, SinkConfig
    from trajlake.store import lake as lake_module
    from trajlake.store.lake import Lake
    from trajlake.store.projections import rebuild

    bus = InProcessBus()
    recorder = Recorder(bus, "old", flush_each_turn=False)
    for version in range(2):
        for i in range(8):
            with recorder.start(f"t{i}") as traj:
                traj.turn([7, 8, 9] * 8, [-0.5] * 24, version, input_token_ids=[1])
                traj.finish("completed")
    root = tmp_path / "lake"
    schema = lake_module.SCHEMAS["turns"]
    with monkeypatch.context() as m:
        m.setitem(
            lake_module.SCHEMAS, "turns", pa.schema([f for f in schema if f.name != "output_repetition"])
        )
        DeltaSink(Lake(root), bus, SinkConfig()).run(until_idle_s=0.0)
    signal = diagnose_health(Lake(root), "old").signal("garbled_output")
    assert signal.status == NOT_RECORDED and "`trajlake rebuild` scores them" in signal.note
    rebuild(Lake(root))
    signal = diagnose_health(Lake(root), "old", HealthSettings(min_samples=8)).signal("garbled_output")
    assert signal.status == ALERT and signal.windows[0]["turns"] == 16 and signal.windows[0]["share"] == 1
