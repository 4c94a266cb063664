"""trajlake's tables and views in Apache Spark: the queries that outgrow one node run there unchanged.

`register_lake(spark, root)` registers, in a SparkSession with Delta Lake, a temporary view per
table of the lake (local or `s3://`, read as `s3a://`) under the names `trajlake sql` uses: the
stored tables, and `trajectories` and `turns` with their token lists assembled from `events`
exactly as the DuckDB views assemble them (`store/sql.py`). Spark reads the Delta tables at its
default settings (the vectorized Parquet reader on), which the lake's `portable` token layout
allows. `spark_session()` builds a session with the Delta and S3A jars (`store/spark_jars.py`).

    spark = spark_session()
    register_lake(spark, "trajlake-data")
    spark.sql("select task_id, size(token_ids) from trajectories").show()
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from trajlake.common.settings import Settings
from trajlake.store.sql import VIEWS
from trajlake.store.storage import Storage
from trajlake.store.tables import SCHEMAS, TABLES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TRAJECTORY_TOKENS_SQL = """
select run_id, trajectory_id,
  flatten(transform(parts, p -> p.ids)) as token_ids,
  flatten(transform(parts, p -> p.lps)) as logprobs,
  flatten(transform(parts, p -> p.mask)) as loss_mask
from (
  select run_id, trajectory_id, sort_array(collect_list(struct(
      seq,
      concat(coalesce(input_token_ids, cast(array() as array<int>)), output_token_ids) as ids,
      concat(transform(coalesce(input_token_ids, cast(array() as array<int>)), x -> cast(0 as float)),
             output_logprobs) as lps,
      concat(transform(coalesce(input_token_ids, cast(array() as array<int>)), x -> false),
             coalesce(loss_mask, transform(output_token_ids, x -> true))) as mask
    ))) as parts
  from (
    select *, max(case when input_is_full then seq end) over (partition by run_id, trajectory_id) as restart_seq
    from _t_events where event_type = 'turn'
  )
  where restart_seq is null or seq >= restart_seq
  group by run_id, trajectory_id
)
"""
"""`store/sql.py`'s TRAJECTORY_TOKENS_SQL in Spark SQL: each turn's lists gathered in `seq` order
(`sort_array` of structs led by `seq`), the sequence restarting at the last turn whose input broke
the prefix invariant."""

TURN_TOKENS_SQL = """
select run_id, trajectory_id, seq, any_value(input_token_ids) as input_token_ids,
  any_value(output_token_ids) as output_token_ids, any_value(output_logprobs) as output_logprobs,
  any_value(loss_mask) as loss_mask
from _t_events group by run_id, trajectory_id, seq
"""


class SparkSettings(Settings):
    """A SparkSession for the lake (`spark_session`): where it runs and where its jars come from."""

    spark_master: str = Field(
        "local[*]", description="Spark master URL (local[*]: every core of this machine)"
    )
    spark_jars: str | None = Field(
        None,
        description="comma-separated paths of the Delta Lake (and hadoop-aws) jars; unset: fetched once "
        "from Maven Central with `mvn` into the cache",
    )
    spark_ui: bool = Field(False, description="start Spark's web UI (port 4040 or the next free one)")


def spark_session(
    settings: SparkSettings | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A SparkSession with Delta Lake, or the running one (`getOrCreate`); `conf` adds Spark settings."""
    from pyspark.sql import SparkSession

    from trajlake.store.spark_jars import ensure_spark_jars

    settings = settings or SparkSettings()
    jars = settings.spark_jars or ",".join(str(p) for p in ensure_spark_jars())
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName("trajlake")
        .config("spark.jars", jars)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", str(settings.spark_ui).lower())
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def s3a_options(storage_options: Mapping[str, str]) -> dict[str, str]:
    """The Hadoop S3A settings that reach the object store the lake's `AWS_*` options name."""
    o = {k.upper(): v for k, v in storage_options.items()}
    conf = {"fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    if endpoint := o.get("AWS_ENDPOINT_URL"):
        conf["fs.s3a.endpoint"] = endpoint
        conf["fs.s3a.path.style.access"] = "true"  # a local server has no per-bucket host names
        conf["fs.s3a.connection.ssl.enabled"] = str(endpoint.startswith("https://")).lower()
    if o.get("AWS_ACCESS_KEY_ID"):
        conf["fs.s3a.access.key"] = o["AWS_ACCESS_KEY_ID"]
        conf["fs.s3a.secret.key"] = o.get("AWS_SECRET_ACCESS_KEY", "")
        conf["fs.s3a.aws.credentials.provider"] = (
            "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            if o.get("AWS_SESSION_TOKEN")
            else "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        )
        if o.get("AWS_SESSION_TOKEN"):
            conf["fs.s3a.session.token"] = o["AWS_SESSION_TOKEN"]
    if o.get("AWS_REGION"):
        conf["fs.s3a.endpoint.region"] = o["AWS_REGION"]
    return conf


def table_path(storage: Storage, name: str) -> str:
    """Where Spark finds table `name`: the local path, or `s3a://` for `s3://`."""
    root = storage.root
    return f"{'s3a://' + root.removeprefix('s3://') if root.startswith('s3://') else root}/{name}"


def register_lake(
    spark: SparkSession, root: str, storage_options: Mapping[str, str] | None = None
) -> list[str]:
    """Register the lake at `root` in `spark` as temporary views named as in `trajlake sql`; return them.

    Each stored table `<name>` is also `_t_<name>`; a table the lake has not created yet is an
    empty view of its schema. Views read the Delta snapshot current when they are registered:
    register again to see later commits. An `s3://` root is read through S3A with the lake's
    `AWS_*` options (by default from the environment, as the lake itself reads them).
    """
    from trajlake.store.lake import Lake

    lake = Lake(root, storage_options=storage_options, create=False)
    if not lake.is_local:
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        for key, value in s3a_options(lake.storage.options).items():
            hadoop.set(key, value)
    for name in TABLES:
        frame: Any = (
            spark.read.format("delta").load(table_path(lake.storage, name))
            if lake.exists(name)
            else spark.createDataFrame(SCHEMAS[name].empty_table())
        )
        frame.createOrReplaceTempView(f"_t_{name}")
    spark.sql(f"create or replace temporary view _trajectory_tokens as {TRAJECTORY_TOKENS_SQL}")
    spark.sql(f"create or replace temporary view _turn_tokens as {TURN_TOKENS_SQL}")
    for name in TABLES:
        spark.sql(f"create or replace temporary view {name} as {VIEWS.get(name, f'select * from _t_{name}')}")
    return list(TABLES)
