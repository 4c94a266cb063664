"""`trajlake rescore`: stored demo episodes and an imported Harbor job judged again, the old rewards kept."""

from __future__ import annotations

import json
import random
import textwrap

import pytest

from trajlake.cli import main
from trajlake.demo.envs import EnvConfig, FaultConfig, run_episode
from trajlake.demo.envs import vocab as v
from trajlake.demo.envs.tasks import Task, solve
from trajlake.ingest.recorder import Recorder
from trajlake.trainer.config import SamplerConfig
from trajlake.trainer.sampler import Sampler

RUN = "rescore-demo"


class ScriptedPolicy:
    """Plays fixed turns (lists of token words) at policy version 0."""

    def __init__(self, turns: list[list[str]]) -> None:
        self.turns, self.calls = turns, 0

    def sample(self, context, max_new_tokens, stop_ids):
        ids = v.encode(self.turns[min(self.calls, len(self.turns) - 1)])[:max_new_tokens]
        self.calls += 1
        return ids, [-0.25] * len(ids), 0


EPISODES = [  # (kind, operands, turns): two solved with the right tool, two answered without one
    ("calc", ("7", "*", "8"), [["<call:calc>"], ["<answer>"]]),
    ("reverse", ("a", "b", "c"), [["<call:python>"], ["<answer>"]]),
    ("calc", ("1", "+", "2"), [["<answer>"]]),
    ("reverse", ("c", "a"), [["<answer>"]]),
]

FLIPPED = """
from trajlake.demo.verifiers import exact_match

def flipped(traj):
    return 1.0 - exact_match(traj)["correct"]

def broken(traj):
    raise RuntimeError("the file-diff tool crashed")
"""


@pytest.fixture
def demo_lake(lake, bus, drain):
    """Four demo episodes of run `rescore-demo`, in two groups (one per task kind); rewards 1, 1, 0, 0."""
    recorder = Recorder(bus, RUN, vocab_size=v.VOCAB_SIZE, flush_each_turn=False)
    for i, (kind, operands, turns) in enumerate(EPISODES):
        task = Task(
            f"{kind}-{i}", kind, operands, (v.BOS, *v.encode((kind, *operands))), solve(kind, operands)
        )
        run_episode(recorder, task, ScriptedPolicy(turns), EnvConfig(faults=FaultConfig.none()),
                    random.Random(0), group_id=kind, sample_index=i)  # fmt: skip
    drain()
    return lake


def rescore(lake, capsys, *options: str) -> tuple[int, dict]:
    """Exit code and JSON report (its stderr, when refused) of `trajlake rescore` on the demo run."""
    capsys.readouterr()
    code = main(["rescore", "--lake", lake.root, "--run", RUN, "--format", "json", *options])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code in (0, 1) else {"err": out.err}


def rewards(lake) -> dict[str, float | None]:
    rows = lake.sql("select task_id, reward from trajectories where run_id = $run", {"run": RUN}).to_pylist()
    return {r["task_id"]: r["reward"] for r in rows}


def test_the_demo_verifier_gives_back_the_recorded_rewards(demo_lake, capsys) -> None:
    """What the lake holds is enough to judge the episodes again: the episode's own verifier agrees."""
    before = rewards(demo_lake)
    assert sorted(before.values()) == [0.0, 0.0, 1.0, 1.0]
    code, report = rescore(demo_lake, capsys, "--verifier", "trajlake.demo.verifiers:as_recorded")
    assert code == 0
    assert (report["selected"], report["scored"], report["changed"], report["flips"]) == (4, 4, 0, [])
    assert report["verifier_version"] == "as-recorded-1"
    assert rewards(demo_lake) == before


def test_a_new_verifier_appends_rewards_the_latest_wins_and_the_original_stays(demo_lake, capsys, tmp_path):
    verifier = tmp_path / "fixed.py"
    verifier.write_text(textwrap.dedent(FLIPPED))
    code, report = rescore(demo_lake, capsys, "--verifier", f"{verifier}:flipped", "--verifier-version", "v2")
    assert code == 0
    assert (report["fail_to_pass"], report["pass_to_fail"], report["changed"]) == (2, 2, 4)
    assert sorted(f["task_id"] for f in report["flips"]) == ["calc-0", "calc-2", "reverse-1", "reverse-3"]
    assert rewards(demo_lake) == {"calc-0": 0.0, "reverse-1": 0.0, "calc-2": 1.0, "reverse-3": 1.0}
    kept = demo_lake.sql("select coalesce(verifier_version, 'original') as v, count(*) as n, sum(reward) as r "
                         "from rewards group by all order by v").to_pylist()  # fmt: skip
    assert kept == [{"v": "original", "n": 4, "r": 2.0}, {"v": "v2", "n": 4, "r": 2.0}]

    # the sampler trains on the version it is told (latest by default), and names the ones a run has
    def sampled(version: str) -> dict[str, float]:
        groups, _ = Sampler(demo_lake, None, SamplerConfig(run_id=RUN, group_wait_s=0, verifier_version=version)
                            ).select_groups(0)  # fmt: skip
        return {m.task_id: m.reward for g in groups for m in g.members}

    assert sampled("latest") == sampled("v2") == rewards(demo_lake)
    assert sampled("original") == {"calc-0": 1.0, "reverse-1": 1.0, "calc-2": 0.0, "reverse-3": 0.0}
    with pytest.raises(Exception, match="no rewards of verifier version 'v3'; it has original, v2"):
        sampled("v3")

    # run again: every trajectory is scored once per version
    code, again = rescore(demo_lake, capsys, "--verifier", f"{verifier}:flipped", "--verifier-version", "v2")
    assert (again["skipped"], again["scored"]) == (4, 0)


def test_the_text_report_lists_the_flips(demo_lake, capsys, tmp_path) -> None:
    verifier = tmp_path / "fixed.py"
    verifier.write_text(textwrap.dedent(FLIPPED))
    capsys.readouterr()
    assert main(["rescore", "--lake", demo_lake.root, "--run", RUN, "--verifier", f"{verifier}:flipped",
                 "--sql", "select trajectory_id from trajectories where task_id like 'calc%'"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "rescored 2 of 2 trajectories" in out
    assert "1 fail -> pass, 1 pass -> fail" in out
    assert "calc-0" in out and "calc-2" in out and "reverse" not in out
    assert rewards(demo_lake)["reverse-1"] == 1.0  # not selected: untouched


def test_a_verifier_that_raises_records_an_error_never_a_zero(demo_lake, capsys, tmp_path) -> None:
    verifier = tmp_path / "fixed.py"
    verifier.write_text(textwrap.dedent(FLIPPED))
    code, report = rescore(demo_lake, capsys, "--verifier", f"{verifier}:broken")
    assert (code, report["errors"], report["scored"]) == (0, 4, 0)
    rows = demo_lake.sql("select reward, verifier_error from trajectories").to_pylist()
    assert all(r["reward"] is None and "the file-diff tool crashed" in r["verifier_error"] for r in rows)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--verifier", "nocolon"], "--verifier 'nocolon' is not MODULE:FUNC"),
        (["--verifier", "no.such.module:f"], "cannot import no.such.module"),
        (["--verifier", "trajlake.demo.verifiers:nope"], "has no function 'nope'"),
        (
            ["--verifier", "trajlake.demo.verifiers:exact_match", "--verifier-version", "latest"],
            "is reserved",
        ),
        (["--verifier", "trajlake.demo.verifiers:exact_match", "--sql", "select 1 as x"], "no trajectory_id"),
    ],
    ids=["not module:func", "no module", "no function", "reserved version", "sql without ids"],
)
def test_a_bad_rescore_is_refused_with_the_fix_and_writes_nothing(demo_lake, capsys, options, says) -> None:
    code, refused = rescore(demo_lake, capsys, *options)
    assert code == 2
    assert says in refused["err"]
    assert demo_lake.sql("select count(*) from rewards").column(0)[0].as_py() == 4


HARBOR_VERIFIER = """
import json

def says_four(traj):
    trial = json.loads(traj.artifact("result.json"))  # the trial's own record, copied into the lake
    assert trial["trial_name"] == traj.attributes["trial_name"]
    return float("4" in (traj.final_answer or ""))
"""


def test_an_imported_harbor_job_is_rescored_from_the_lake_after_its_directory_is_gone(
    tmp_path, capsys
) -> None:
    import shutil

    from tests.rollout.test_import_harbor import write_job
    from trajlake.rollout.importers.harbor import import_harbor
    from trajlake.store.lake import Lake

    lake = Lake(tmp_path / "lake")
    job = write_job(tmp_path)
    import_harbor(lake, job, "harbor-run")
    shutil.rmtree(job)
    recorded = "select trajectory_id, reward, verifier_error from rewards where verifier_version is null order by all"
    before = lake.sql(recorded).to_pylist()
    verifier = tmp_path / "harbor_verifier.py"
    verifier.write_text(textwrap.dedent(HARBOR_VERIFIER))
    capsys.readouterr()
    code = main(["rescore", "--lake", lake.root, "--run", "harbor-run", "--verifier", f"{verifier}:says_four",
                 "--format", "json"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert (code, report["errors"], report["scored"]) == (0, 0, 8)
    rows = lake.sql(
        "select json_extract_string(s.attributes, '$.trial_name') as trial, t.reward from trajectories t "
        "join events s on s.trajectory_id = t.trajectory_id and s.event_type = 'trajectory_started'"
    ).to_pylist()
    passed = sorted(r["trial"] for r in rows if r["reward"] == 1.0)
    assert passed == ["other-task__h8", "sum-task__a1", "sum-task__c3"]  # the trials whose agent said 4
    assert lake.sql(recorded).to_pylist() == before  # the job's own rewards stay beside the re-score
    lake.close()


def test_ablate_refuses_a_verifier_version_the_run_never_had(demo_lake, capsys) -> None:
    capsys.readouterr()
    code = main(["ablate", "--lake", demo_lake.root, "--run", RUN, "--verifier-version", "v9"])
    assert code == 2
    assert (
        "run 'rescore-demo' has no rewards of verifier version 'v9'; it has original"
        in capsys.readouterr().err
    )
