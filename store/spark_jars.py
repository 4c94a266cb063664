"""The jars a SparkSession needs to read the lake: Delta Lake for Spark, and Hadoop's S3A client for
`s3a://` roots, fetched once from Maven Central and cached outside the checkout."""

from __future__ import annotations

from pathlib import Path

from trajlake.common.maven import fetch_jars, jar_set_dir
from trajlake.schemas.errors import TrajlakeError

DELTA_VERSION = "4.0.1"
"""delta-spark for Spark 4.0 (Scala 2.13), the version of the `delta-spark` package on PyPI."""
HADOOP_VERSION = "3.4.1"
"""The Hadoop that pyspark 4.0 ships (its hadoop-client-api jar): hadoop-aws must match it."""
AWS_SDK_VERSION = "2.25.0"
"""The AWS SDK v2 for hadoop-aws 3.4.1 (built against 2.24.6, whose transfer manager Maven Central lacks)."""

# hadoop-aws depends on the SDK's `bundle`, every AWS service shaded into one 500 MB jar; S3A needs
# the S3 client and its transfer manager alone, so the bundle is left out for those two modules. The SDK's
# netty client is left out too: Spark ships its own netty, and S3A talks through the Apache client.
# Scopes `provided` (Spark, Hadoop itself) are not copied, nor `PYSPARK_SHIPS`: pyspark has them.
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>trajlake</groupId><artifactId>spark-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>io.delta</groupId><artifactId>delta-spark_2.13</artifactId><version>{delta}</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId><version>{hadoop}</version>
      <exclusions><exclusion><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId></exclusion></exclusions>
    </dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3</artifactId><version>{sdk}</version>
      <exclusions><exclusion><groupId>software.amazon.awssdk</groupId><artifactId>netty-nio-client</artifactId></exclusion></exclusions>
    </dependency>
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>s3-transfer-manager</artifactId><version>{sdk}</version></dependency>
  </dependencies>
</project>
"""


PYSPARK_SHIPS = ("scala-library", "antlr4-runtime", "slf4j-api", "commons-codec", "httpclient", "httpcore")
"""Artifacts the Delta and S3A jars depend on that pyspark's own jars already hold (a second copy of
another version on the classpath would shadow or clash with Spark's)."""


class SparkJarsError(TrajlakeError, RuntimeError):
    """The Spark jars could not be fetched; the message says why and what to do."""


def _pom() -> str:
    return _POM.format(delta=DELTA_VERSION, hadoop=HADOOP_VERSION, sdk=AWS_SDK_VERSION)


def jars_dir() -> Path:
    """Where the jars are cached (env TRAJLAKE_CACHE_DIR overrides ~/.cache/trajlake), one directory per jar set."""
    return jar_set_dir("spark", f"delta-{DELTA_VERSION}", _pom())


def ensure_spark_jars() -> list[Path]:
    """Fetch Delta Lake's and S3A's jars with Maven once; return their paths."""
    what = f"Delta Lake {DELTA_VERSION} and hadoop-aws {HADOOP_VERSION}"
    no_mvn = "set TRAJLAKE_SPARK_JARS to the Delta Lake jars you have"
    libs = fetch_jars(
        jars_dir(), _pom(), "delta-spark_2.13-*.jar", what, SparkJarsError, no_mvn, PYSPARK_SHIPS
    )
    return sorted(libs.glob("*.jar"))
