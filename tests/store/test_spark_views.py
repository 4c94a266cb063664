"""trajlake's views in Spark (`trajlake.store.spark`): the SQL tour answers on Spark what `trajlake sql`
answers, on a demo lake and a loadgen lake, and Spark's data skipping reads only the files of one trajectory."""

from __future__ import annotations

import ast
import datetime as dt
import decimal
import re
from pathlib import Path
from typing import Any

import pytest

from tests.docs import blocks as md
from tests.fixtures.spark import fill_every_table, token_digest
from trajlake.store.lake import Lake

pytestmark = [pytest.mark.integration, pytest.mark.slow]

README_TOUR = [
    "select policy_version_min as v, avg(reward) as reward, count(*) as n from trajectories "
    "where run_id = 'demo' and failure_origin is distinct from 'system' group by 1 order by 1",
    "select failure_origin, failure_label, count(*) as n from trajectories where run_id = 'demo' group by all",
]
COOKBOOK = [b.code for b in md.blocks(md.ROOT / "docs" / "how-to" / "sql-cookbook.md") if b.kind == "sql"]
TOKENS = [
    "select run_id, trajectory_id, token_ids, logprobs, loss_mask from trajectories",
    "select run_id, trajectory_id, seq, input_token_ids, output_token_ids, output_logprobs, loss_mask from turns",
]
DUCKDB_ONLY = {
    "quantile_cont(": "Spark's is percentile_cont(0.5) within group (order by x)",
    "detokenize(": "trajlake's own function: the tokenizer runs inside `trajlake sql`",
}
"""Cookbook queries that call a function Spark does not have, and what to write instead."""
CONSTANT_GROUPS = """
select count(*) from (
  select policy_version_min, var_pop(reward) as r, var_pop(assistant_tokens) as a from trajectories
  where run_id = 'demo' and finished and failure_origin is distinct from 'system' group by 1
) where r = 0 or a = 0
"""
"""Groups of the cookbook's corr() query whose correlation divides by zero."""


@pytest.fixture(scope="module")
def demo_lake(tiny_demo_lake: Path) -> str:
    return str(tiny_demo_lake)  # read only


@pytest.fixture(scope="module")
def loadgen_lake(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("spark-loadgen") / "lake")
    fill_every_table(root, trajectories=40, run_id="demo")  # the tour's queries keep to run 'demo'
    return root


def normal(value: Any) -> Any:
    """A value as both engines' answers can be compared: numbers to 6 significant digits, times in UTC."""
    if isinstance(value, decimal.Decimal):
        value = int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dt.datetime):
        return (value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)).isoformat()
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    return value


def rows(table: Any) -> list[str]:
    """The rows of an Arrow table as sorted text (column names aside: each engine names `count(*)` its way)."""
    return sorted(repr([normal(v) for v in row.values()]) for row in table.to_pylist())


def alike(duck: list[str], spark: list[str] | str) -> bool:
    """The same rows, but for a round() of a tie: DuckDB rounds the binary double (0.1125 is
    0.11249…: 0.112), Spark its decimal text (0.113), so a rounded value may differ by one unit in
    its last decimal place, never more."""
    if duck == spark:
        return True
    if isinstance(spark, str) or len(duck) != len(spark):
        return False
    return all(_alike(a, b) for d, s in zip(duck, spark, strict=True) for a, b in _cells(d, s))


def _cells(duck: str, spark: str) -> list[tuple[Any, Any]]:
    ours, theirs = ast.literal_eval(duck), ast.literal_eval(spark)
    return list(zip(ours, theirs, strict=True)) if len(ours) == len(theirs) else [(ours, theirs)]


def _alike(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and a != b:
        places = max(len(repr(v).partition(".")[2]) for v in (a, b))
        return abs(a - b) <= 10**-places * 1.000001
    return a == b


def whole(query: str) -> str:
    """`query` without its final `limit`: rows tied on the order may come first in either engine."""
    return re.sub(r"\s+limit\s+\d+\s*$", "", query.strip(), flags=re.IGNORECASE)


def tour(spark: Any, root: str) -> dict[str, tuple[list[str], list[str] | str]]:
    """query -> (trajlake sql's rows, Spark's rows or its ANSI error) for each query of the tour Spark can run."""
    from pyspark.errors import ArithmeticException

    from trajlake.store.spark import register_lake

    register_lake(spark, root)
    lake = Lake(root, create=False)
    answers: dict[str, tuple[list[str], list[str] | str]] = {}
    for query in map(whole, README_TOUR + COOKBOOK):
        if any(f in query for f in DUCKDB_ONLY):
            continue
        try:
            on_spark: list[str] | str = rows(spark.sql(query).toArrow())
        except ArithmeticException as err:  # Spark 4 runs ANSI SQL: corr() of a constant divides by zero
            on_spark = str(err).split("]", 1)[0] + "]"
        answers[query] = (rows(lake.sql(query)), on_spark)
    return answers


@pytest.mark.parametrize("which", ["demo_lake", "loadgen_lake"])
def test_the_sql_tour_answers_on_spark_what_trajlake_sql_answers(
    spark: Any, which: str, request: pytest.FixtureRequest
) -> None:
    answers = tour(spark, request.getfixturevalue(which))
    assert len(answers) == len(README_TOUR) + len(COOKBOOK) - len(DUCKDB_ONLY)
    ansi = {q: a for q, a in answers.items() if isinstance(a[1], str)}
    different = {q: a for q, a in answers.items() if q not in ansi and not alike(*a)}
    assert not different, different
    # Spark's ANSI mode raises on the correlation of a group without variance (DuckDB: NaN), even of a
    # group that HAVING then drops: only the corr() query may, and only on a lake that has such a group
    assert all("corr(" in q for q in ansi), ansi
    if ansi:
        root = request.getfixturevalue(which)
        assert Lake(root, create=False).sql(CONSTANT_GROUPS).column(0)[0].as_py() > 0
    assert sum(bool(duck) for duck, _ in answers.values()) >= len(answers) - 4  # the tour is no empty lake's


@pytest.mark.parametrize("which", ["demo_lake", "loadgen_lake"])
def test_the_token_views_hold_the_same_tokens_on_spark(
    spark: Any, which: str, request: pytest.FixtureRequest
) -> None:
    from trajlake.store.spark import register_lake

    root = request.getfixturevalue(which)
    register_lake(spark, root)
    lake = Lake(root, create=False)
    for query in TOKENS:
        duck = token_digest(lake.sql(query))
        assert duck[0] > 0
        assert token_digest(spark.sql(query).toArrow()) == duck


def test_spark_fails_on_the_duckdb_only_functions_the_docs_name(spark: Any, demo_lake: str) -> None:
    from pyspark.errors import AnalysisException

    from trajlake.store.spark import register_lake

    register_lake(spark, demo_lake)
    for query in [q for q in COOKBOOK if any(f in q for f in DUCKDB_ONLY)]:
        with pytest.raises(AnalysisException, match="UNRESOLVED_ROUTINE"):
            spark.sql(query)


def test_spark_data_skipping_reads_only_the_files_of_one_trajectory(spark: Any, loadgen_lake: str) -> None:
    from trajlake.store.spark import register_lake

    register_lake(spark, loadgen_lake)
    lake = Lake(loadgen_lake, create=False)
    every = spark.table("_t_events").inputFiles()
    assert len(every) == len(lake.files("events")) >= 2
    tid = lake.sql("select max(trajectory_id) from trajectories").column(0)[0].as_py()
    one = spark.sql("select * from _t_events where trajectory_id = :tid", args={"tid": tid})
    assert len(one.inputFiles()) == len(lake.files_within("events", "trajectory_id", tid, tid)) == 1
    assert (
        one.count()
        == lake.sql("select count(*) from events where trajectory_id = $t", {"t": tid}).column(0)[0].as_py()
    )
