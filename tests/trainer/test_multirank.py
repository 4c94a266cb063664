"""Three trainer processes against one lake, with a SQLite and with a PostgreSQL catalog.

A fourth rank leases a batch and is killed with SIGKILL before it commits. The three
trainers must never be handed the same trajectory, never one above max_staleness, and
must get the killed rank's trajectories once its leases expire.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.catalog import Catalog, default_url
from trajlake.store.projections import catch_up

RUN = "multi"
MAX_STALENESS = 3
DOOMED = textwrap.dedent(
    """
    import json, sys, time
    from trajlake.store.catalog import Catalog
    from trajlake.store.lake import Lake
    from trajlake.trainer.config import SamplerConfig
    from trajlake.trainer.sampler import Sampler
    lake, url = Lake(sys.argv[1]), sys.argv[2]
    config = SamplerConfig(run_id="multi", max_staleness=3, groups_per_batch=2, lease_ttl_s=4, group_wait_s=0)
    batch = Sampler(lake, Catalog(url), config, rank=9).next_batch(trainer_version=7, step=0)
    print(json.dumps(batch.trajectory_ids), flush=True)
    time.sleep(600)  # "training": killed before it commits
    """
)


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
    ids=["sqlite", "postgresql"],
)
def catalog_url(request, lake) -> str:
    if request.param == "sqlite":
        return default_url(lake.root)
    return request.getfixturevalue("pg_catalog_url")


@pytest.mark.integration
@pytest.mark.slow
def test_three_ranks_share_a_run_without_overlap_and_recover_a_killed_ranks_leases(
    lake, bus, drain, catalog_url, tmp_path
):
    generate(bus, LoadgenConfig(
        run_id=RUN, trajectories=96, group_size=4, policy_versions=8, turns=2, prompt_tokens=24,
        output_tokens=12, env_tokens=6, vocab_size=512, system_failure_rate=0.1, seed=3,
    ))  # fmt: skip
    drain()
    Catalog(catalog_url).close()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    doomed = subprocess.Popen(
        [sys.executable, "-c", DOOMED, lake.root, catalog_url], stdout=subprocess.PIPE, text=True, env=env
    )
    stolen = json.loads(doomed.stdout.readline())
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    assert stolen, "the doomed rank should have leased a batch"

    trainer_config = json.dumps({
        "checkpoint_dir": str(tmp_path / "ckpt"), "max_vocab_size": 64, "d_model": 8,
        "sampler": {"max_staleness": MAX_STALENESS, "groups_per_batch": 2, "group_wait_s": 0, "micro_batch_tokens": 4096},
    })  # fmt: skip
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from trajlake.cli import run; run()",
                "train",
                "--lake",
                lake.root,
                "--run",
                RUN,
                "--steps",
                "100",
                "--rank",
                str(r),
                "--catalog",
                catalog_url,
                "--config",
                trainer_config,
                "--wait",
                "8",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(3)
    ]
    steps_per_rank = []
    for proc in ranks:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        steps_per_rank.append(len(out.splitlines()))
    # which rank takes how much is a race of process start-up (torch imports for seconds, a step
    # takes milliseconds); that ranks take turns is test_sampler's two-ranks test, in one process
    assert sum(steps_per_rank) > 0

    catch_up(lake)
    used = lake.sql(
        "select b.trajectory_id, b.trainer_version, b.staleness, t.policy_version_min, t.failure_origin "
        "from batch_consumption b join trajectories t using (run_id, trajectory_id) where b.run_id = ?",
        [RUN],
    ).to_pylist()
    ids = [row["trajectory_id"] for row in used]
    assert len(ids) == len(set(ids)), "a trajectory was handed out twice"
    assert all(row["staleness"] == row["trainer_version"] - row["policy_version_min"] for row in used)
    assert max(row["staleness"] for row in used) <= MAX_STALENESS
    assert all(row["failure_origin"] != "system" for row in used)
    assert set(stolen) <= set(ids), "the killed rank's leases did not come back"
    catalog = Catalog(catalog_url)
    assert sorted(catalog.consumed_ids(RUN)) == sorted(ids)
    assert catalog.lease_counts(RUN)["live"] == 0
    catalog.close()
