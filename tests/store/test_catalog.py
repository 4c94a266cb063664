"""The SQL catalog on SQLite and on a real PostgreSQL: migrations, runs, versions, leases."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import inspect, text

from trajlake.store.catalog import Catalog, default_url


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
    ids=["sqlite", "postgresql"],
)
def catalog_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return default_url(tmp_path / "lake")
    return request.getfixturevalue("pg_catalog_url")


@pytest.fixture
def catalog(catalog_url):
    cat = Catalog(catalog_url)
    yield cat
    cat.close()


def test_opening_migrates_to_head_and_reopening_is_a_no_op(catalog_url):
    first = Catalog(catalog_url)
    first.register_run("r1", {"lr": 0.1})
    first.close()
    second = Catalog(catalog_url)
    tables = set(inspect(second.engine).get_table_names())
    assert {
        "runs", "policy_versions", "sampler_leases", "source_cursors", "trajectory_file_counts", "alembic_version"
    } <= tables  # fmt: skip
    with second.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar_one() == "0003"
    assert second.get_run("r1")["config"] == {"lr": 0.1}
    second.close()


def test_runs_and_policy_versions(catalog):
    catalog.register_run("r1", {"seed": 3})
    catalog.set_run_status("r1", "finished")
    assert catalog.get_run("r1")["status"] == "finished"
    assert catalog.get_run("nope") is None
    assert catalog.latest_policy_version("r1") is None
    catalog.record_policy_version("r1", 1, step=10, checkpoint="/c/1.pt")
    catalog.record_policy_version("r1", 2, step=20, checkpoint="/c/2.pt")
    assert catalog.latest_policy_version("r1") == {"version": 2, "step": 20, "checkpoint": "/c/2.pt"}


def test_ranks_registering_one_run_at_once_all_succeed(catalog_url):
    catalogs = [Catalog(catalog_url) for _ in range(6)]
    barrier = threading.Barrier(len(catalogs))

    def register(catalog: Catalog) -> None:
        barrier.wait()
        catalog.register_run("r1", {"rank": 0})

    with ThreadPoolExecutor(len(catalogs)) as pool:
        list(pool.map(register, catalogs))  # raises what any rank raised
    catalogs[0].register_run("r1", status="finished")  # no config: the stored one stays
    assert {k: catalogs[1].get_run("r1")[k] for k in ("config", "status")} == {
        "config": {"rank": 0}, "status": "finished"}  # fmt: skip
    for catalog in catalogs:
        catalog.close()


def test_a_claimed_trajectory_is_not_claimed_again(catalog):
    assert sorted(catalog.claim("r", ["a", "b", "c"], "rank0")) == ["a", "b", "c"]
    assert sorted(catalog.claim("r", ["b", "c", "d"], "rank1")) == ["d"]
    assert catalog.claim("other-run", ["a"], "rank1") == ["a"]  # leases are per run
    assert catalog.unavailable_ids("r") == {"a", "b", "c", "d"}
    assert catalog.lease_counts("r") == {"consumed": 0, "live": 4, "expired": 0}


def test_an_expired_lease_comes_back_but_a_consumed_one_never_does(catalog):
    catalog.claim("r", ["a", "b"], "dead-rank", ttl_s=-1)  # already expired: the rank died
    assert catalog.mark_consumed("r", ["b"], "dead-rank", step=1) == ["b"]
    assert catalog.unavailable_ids("r") == {"b"}
    assert catalog.claim("r", ["a", "b"], "rank1") == ["a"]
    assert catalog.mark_consumed("r", ["a"], "dead-rank") == []  # it lost the lease
    assert catalog.mark_consumed("r", ["a"], "rank1", step=2) == ["a"]
    assert sorted(catalog.consumed_ids("r")) == ["a", "b"]


def test_release_and_renew(catalog):
    catalog.claim("r", ["a", "b"], "rank0", ttl_s=-1)
    assert catalog.renew("r", "rank0", ttl_s=60) == 2
    assert catalog.claim("r", ["a"], "rank1") == []  # renewed: live again
    assert catalog.release("r", ["a"], "rank0") == 1
    assert catalog.claim("r", ["a"], "rank1") == ["a"]


RACE = textwrap.dedent(
    """
    import json, random, sys
    from trajlake.store.catalog import Catalog
    url, owner = sys.argv[1], sys.argv[2]
    ids = [f"t{i:04d}" for i in range(300)]
    random.Random(owner).shuffle(ids)
    cat = Catalog(url)
    won = []
    for i in range(0, len(ids), 7):
        won += cat.claim("race", ids[i:i + 7], owner)
    print(json.dumps(won))
    """
)


@pytest.mark.integration
def test_processes_racing_for_the_same_ids_never_share_one(catalog_url):
    Catalog(catalog_url).close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACE, catalog_url, f"rank{r}"], stdout=subprocess.PIPE, text=True
        )
        for r in range(4)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        results.append(json.loads(out))
    claimed = [tid for won in results for tid in won]
    assert len(claimed) == len(set(claimed)) == 300


def test_a_source_cursor_survives_reopening_the_catalog(catalog_url):
    first = Catalog(catalog_url)
    assert first.source_cursor("r", "agent-lightning:http://agl") is None
    first.save_source_cursor("r", "agent-lightning:http://agl", 3, "rollout-3")
    first.save_source_cursor("r", "agent-lightning:http://agl", 5, "rollout-5")
    first.save_source_cursor("other-run", "agent-lightning:http://agl", 1, "rollout-1")
    first.close()
    second = Catalog(catalog_url)
    assert second.source_cursor("r", "agent-lightning:http://agl") == (5, "rollout-5")
    assert second.source_cursor("other-run", "agent-lightning:http://agl") == (1, "rollout-1")
    second.close()


def test_file_counts_are_kept_per_run_and_a_file_counted_twice_keeps_its_first_row(catalog_url):
    """Ranks may count one file at once: the second save is no error, and a file's count never changes."""
    first = Catalog(catalog_url)
    assert first.file_counts("r", ["a.parquet"]) == {}
    first.save_file_counts("r", {"a.parquet": {"finished": 5, "system_failures": 1, "no_reward": 2}})
    first.save_file_counts("other-run", {"a.parquet": {"finished": 7, "system_failures": 0, "no_reward": 0}})
    many = {f"{i}.parquet": {"finished": i, "system_failures": 0, "no_reward": 0} for i in range(1200)}
    first.save_file_counts("r", many)  # more rows than one statement binds
    first.close()
    second = Catalog(catalog_url)
    second.save_file_counts("r", {"a.parquet": {"finished": 9, "system_failures": 0, "no_reward": 0}})
    assert second.file_counts("r", ["a.parquet", "b.parquet"]) == {
        "a.parquet": {"finished": 5, "system_failures": 1, "no_reward": 2}
    }
    assert second.file_counts("other-run", ["a.parquet"])["a.parquet"]["finished"] == 7
    stored = second.file_counts("r", sorted(many))
    assert {p: c["finished"] for p, c in stored.items()} == {p: c["finished"] for p, c in many.items()}
    second.close()
