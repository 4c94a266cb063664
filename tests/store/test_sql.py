"""`trajlake sql` and `Lake.sql`: every table by name, three output formats, strictly read-only."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pytest

from tests.helpers import trajlake
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.loadgen import LoadgenConfig, generate
from trajlake.store.errors import ReadOnlyQueryError
from trajlake.store.lake import TABLES, Lake


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """24 loadgen trajectories, shared by the module's tests (they only read: writes are refused)."""
    lake, bus = Lake(tmp_path_factory.mktemp("sql") / "lake"), InProcessBus()
    generate(bus, LoadgenConfig(trajectories=24, seed=5))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def test_every_table_is_queryable_by_name(filled) -> None:
    for name in TABLES:
        assert isinstance(filled.sql(f"select * from {name} limit 1"), pa.Table)
    assert filled.sql("select count(*) from trajectories").column(0)[0].as_py() == 24


@pytest.mark.parametrize(
    "query", ["select avg(reward) from trajectories", "select avg(n_output_tokens) from turns"]
)
def test_a_query_without_tokens_does_not_join_events(filled, query: str) -> None:
    plan = "\n".join(r for r in filled.sql(f"explain {query}").column(1).to_pylist())
    assert "JOIN" not in plan.upper()


@pytest.mark.parametrize(
    "query, refused",
    [
        ("insert into events select * from events", "INSERT statements are refused"),
        ("delete from trajectories", "DELETE statements are refused"),
        ("create table x as select 1", "CREATE statements are refused"),
        ("copy trajectories to '/tmp/out.csv'", "COPY statements are refused"),
        ("attach '/tmp/other.db'", "ATTACH statements are refused"),
        ("select * from read_csv('/etc/passwd')", "files and URLs outside the lake are refused"),
        ("select * from read_parquet('https://example.com/x.parquet')", "outside the lake are refused"),
        ("set enable_external_access = true", "SET statements are refused"),
        ("select 1; select 2", "one statement at a time"),
    ],
    ids=["insert", "delete", "create", "copy", "attach", "local-file", "url", "set", "two-statements"],
)
def test_writes_and_outside_reads_are_refused(filled, query: str, refused: str) -> None:
    with pytest.raises(ReadOnlyQueryError, match=refused):
        filled.sql(query)


@pytest.mark.integration
def test_cli_formats(filled) -> None:
    q = "select status, count(*) as n from trajectories group by status order by status"
    rows = json.loads(trajlake("sql", "--lake", filled.root, "--format", "json", q).stdout)
    assert sum(r["n"] for r in rows) == 24
    table = list(
        csv.DictReader(io.StringIO(trajlake("sql", "--lake", filled.root, "--format", "csv", q).stdout))
    )
    assert [r["status"] for r in table] == [r["status"] for r in rows]
    text = trajlake("sql", "--lake", filled.root, q).stdout
    assert text.splitlines()[0].split() == ["status", "|", "n"] and text.rstrip().endswith(
        f"({len(rows)} row{'s' if len(rows) != 1 else ''})"
    )


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_cli_refusal_goes_to_stderr_with_exit_2(filled) -> None:
    out = trajlake("sql", "--lake", filled.root, "drop table events", check=False)
    assert out.returncode == 2 and out.stdout == ""
    assert "read-only: DROP statements are refused" in out.stderr


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_cli_bad_column_is_an_error_not_a_traceback(filled) -> None:
    out = trajlake("sql", "--lake", filled.root, "select no_such_column from trajectories", check=False)
    assert out.returncode == 2 and "no_such_column" in out.stderr and "Traceback" not in out.stderr


def test_internal_connections_share_a_database_but_not_each_others_objects() -> None:
    from trajlake.store.sql import connection

    first, second = connection(), connection()
    first.register("e", pa.table({"x": [1, 2]}))
    second.register("e", pa.table({"x": [10]}))
    assert first.sql("select sum(x) from e").fetchall() == [(3,)]
    assert second.sql("select sum(x) from e").fetchall() == [(10,)]
    first.close()
    assert second.sql("select sum(x) from e").fetchall() == [(10,)]
    second.close()
