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
from trajlake.store.sql import DERIVED_VIEWS, INTERNAL_SCHEMA, SCALAR_SCHEMA, names_tokens

RUN = "sql-a"


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """24 loadgen trajectories of run `sql-a`, 8 of `sql-b`, shared by the module's tests (they only
    read: writes are refused)."""
    lake, bus = Lake(tmp_path_factory.mktemp("sql") / "lake"), InProcessBus()
    generate(bus, LoadgenConfig(trajectories=24, seed=5, run_id=RUN))
    generate(bus, LoadgenConfig(trajectories=8, seed=6, run_id="sql-b"))
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    yield lake
    lake.close()


def test_every_table_is_queryable_by_name(filled) -> None:
    for name in TABLES:
        assert isinstance(filled.sql(f"select * from {name} limit 1"), pa.Table)
    assert (
        filled.sql("select count(*) from trajectories where run_id = $run", {"run": RUN}).column(0)[0].as_py()
        == 24
    )


@pytest.mark.parametrize("query", ["show tables", "SHOW TABLES;", "  show\n tables "])
def test_show_tables_lists_the_lakes_tables_once_each(filled, query: str) -> None:
    """It listed 20 names for 8 tables: the stored `_t_*` views, the token views, and `trajectories`
    and `turns` twice (the token-free views' schema)."""
    assert sorted(filled.sql(query).column("name").to_pylist()) == sorted([*TABLES, *DERIVED_VIEWS])


def test_every_other_listing_names_the_internal_relations_as_internal(filled) -> None:
    shown = filled.sql("show all tables").select(["schema", "name"]).to_pylist()
    listed = filled.sql("select table_schema as schema, table_name as name from information_schema.tables")
    for rows in (shown, listed.to_pylist()):
        users = sorted(r["name"] for r in rows if r["schema"] == "main")
        assert users == sorted([*TABLES, *DERIVED_VIEWS])
        assert {r["schema"] for r in rows if r["schema"] != "main"} <= {INTERNAL_SCHEMA, SCALAR_SCHEMA}
        assert all(r["schema"].startswith("trajlake_internal") for r in rows if r["schema"] != "main")
    # the stored tables stay queryable by the name the README gives them
    assert filled.sql("select count(*) as n from _t_trajectories").column("n").to_pylist() == [32]


@pytest.mark.parametrize("query", ["describe trajectories", "show turns", "summarize trajectories"])
def test_describe_shows_a_table_as_users_see_it_token_columns_too(filled, query: str) -> None:
    described = filled.sql(query).column("column_name").to_pylist()
    name = query.split()[-1]
    assert described == filled.sql(f"select * from {name} limit 0").column_names
    assert {"loss_mask"} <= set(described)


NO_TOKENS = [
    "select avg(reward) from trajectories",
    "select avg(n_output_tokens) from turns",
    # a filter on a join key keeps DuckDB's join with `events`: the engine reads the stored columns
    "select count(*), avg(reward) from trajectories where run_id = $run",
    "select quantile_cont(n_output_tokens, [0.5, 0.9]) as p from turns where run_id = $run",
    "select trajectory_id, sum(n_output_tokens) * 2 from turns where run_id = $run and seq > 1 group by all order by 1",
    "select count(*) from turns t join trajectories j using (run_id, trajectory_id) where j.run_id = $run",
]


@pytest.mark.parametrize("query", NO_TOKENS)
def test_a_query_without_tokens_does_not_join_events(filled, query: str) -> None:
    params = {"run": RUN} if "$run" in query else None
    plan = "\n".join(r for r in filled.sql(f"explain {query}", params).column(1).to_pylist())
    assert "JOIN" not in plan.upper() or " join " in query
    assert "events" not in plan
    # the same answer as the views with tokens (named in full, so the engine cannot pick)
    full = query.replace("from turns", "from main.turns").replace(
        "from trajectories", "from main.trajectories"
    )
    full = full.replace("join trajectories", "join main.trajectories")
    assert filled.sql(query, params).to_pylist() == filled.sql(full, params).to_pylist() != []


def test_a_query_that_names_tokens_or_expands_star_gets_them(filled) -> None:
    star = filled.sql("select * from turns where run_id = $run limit 1", {"run": RUN})
    assert {"input_token_ids", "output_token_ids", "output_logprobs", "loss_mask"} <= set(star.column_names)
    lengths = filled.sql(
        "select sum(len(output_token_ids)) as n, sum(n_output_tokens) as stored from turns where run_id = $run",
        {"run": RUN},
    ).to_pylist()[0]
    assert lengths["n"] == lengths["stored"] > 0
    t = filled.sql("select t.* from trajectories t where run_id = $run limit 1", {"run": RUN})
    assert "token_ids" in t.column_names


@pytest.mark.parametrize(
    "query, reads_tokens",
    [
        ("select count(*) from turns where run_id = $run", False),
        ("SELECT COUNT( * ) FROM turns", False),
        ("select a * 2, (b)*3 from turns", False),
        ("select x from turns where m = 'loss_mask' -- token_ids", False),
        ("select * from turns", True),
        ("select t.* from turns t", True),
        ("select * exclude (loss_mask) from turns", True),
        ('select "Output_Token_Ids" from turns', True),
        ("select len(token_ids) from trajectories", True),
        ("select max(columns('.*')) from turns", True),
        ("select struct_pack(*) from turns", True),
    ],
)
def test_which_queries_read_token_columns(query: str, reads_tokens: bool) -> None:
    tokens = {"token_ids", "logprobs", "loss_mask", "input_token_ids", "output_token_ids", "output_logprobs"}
    assert names_tokens(query, frozenset(tokens)) is reads_tokens


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
    q = f"select status, count(*) as n from trajectories where run_id = '{RUN}' group by status order by status"
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
    from trajlake.store.reads import connection

    first, second = connection(), connection()
    first.register("e", pa.table({"x": [1, 2]}))
    second.register("e", pa.table({"x": [10]}))
    assert first.sql("select sum(x) from e").fetchall() == [(3,)]
    assert second.sql("select sum(x) from e").fetchall() == [(10,)]
    first.close()
    assert second.sql("select sum(x) from e").fetchall() == [(10,)]
    second.close()


def test_duckdb_threads_and_memory_come_from_the_settings(filled, tmp_path, monkeypatch) -> None:
    from trajlake.store.files import cores

    settings = "select current_setting('threads') as threads, current_setting('memory_limit') as memory"
    monkeypatch.delenv("TRAJLAKE_DUCKDB_THREADS", raising=False)
    monkeypatch.delenv("TRAJLAKE_DUCKDB_MEMORY_LIMIT", raising=False)
    assert Lake(tmp_path / "a").sql(settings).to_pylist()[0]["threads"] == cores()  # every core by default
    monkeypatch.setenv("TRAJLAKE_DUCKDB_THREADS", "3")
    monkeypatch.setenv("TRAJLAKE_DUCKDB_MEMORY_LIMIT", "512MiB")
    assert Lake(tmp_path / "b").sql(settings).to_pylist() == [{"threads": 3, "memory": "512.0 MiB"}]
    out = trajlake("sql", "--lake", filled.root, "--format", "json", settings, check=False)
    assert json.loads(out.stdout) == [{"threads": 3, "memory": "512.0 MiB"}], out.stderr
    monkeypatch.setenv("TRAJLAKE_DUCKDB_MEMORY_LIMIT", "lots")
    refused = trajlake("sql", "--lake", filled.root, settings, check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "memory_limit must be a size such as 8GB" in refused.stderr
    assert "TRAJLAKE_DUCKDB_MEMORY_LIMIT" in refused.stderr


def test_a_lake_dropped_without_close_frees_its_database_and_threads(filled) -> None:
    """The engine's `detokenize()` must not keep it alive: DuckDB holds the function where Python's
    collector cannot see it, and every engine not closed kept its database and threads (2,000
    threads by the middle of the test suite)."""
    import gc
    import os
    import weakref

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    def read_and_drop() -> weakref.ref:
        lake = Lake(filled.root, create=False)
        assert lake.sql("select count(*) as n from trajectories").to_pylist()[0]["n"] == 32
        return weakref.ref(lake.query_engine())

    first = read_and_drop()
    gc.collect()
    before = threads()
    engines = [read_and_drop() for _ in range(5)]
    gc.collect()
    assert first() is None and all(engine() is None for engine in engines)
    assert threads() < before + len(engines)  # less than a thread per engine (pools grow on demand)
