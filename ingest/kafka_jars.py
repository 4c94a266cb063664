"""Apache Kafka's jars from Maven Central, cached once, and the JVM command lines that run them."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from trajlake.common.maven import fetch_jars, jar_set_dir
from trajlake.schemas.errors import TrajlakeError

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.16"

# slf4j-api is declared itself: kafka_2.13 brings 1.7.36, which cannot see the SLF4J-2 binding
# log4j-slf4j2-impl, so it logged nothing (NOP) and server.log stayed empty
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>trajlake</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


class BrokerError(TrajlakeError, RuntimeError):
    """The local broker could not be fetched, started or stopped; the message says why and what to do."""


def _pom(version: str) -> str:
    return _POM.format(kafka=version, slf4j=SLF4J_VERSION, log4j=LOG4J_VERSION)


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars are cached (env TRAJLAKE_CACHE_DIR overrides ~/.cache/trajlake): one
    directory per jar set, so a changed set never mixes with a cached one that a broker may be using."""
    return jar_set_dir("kafka", version, _pom(version))


def ensure_jars(version: str = KAFKA_VERSION) -> Path:
    """Fetch Kafka and its runtime dependencies with Maven once; return the libs directory."""
    no_mvn = "point TRAJLAKE_KAFKA_BOOTSTRAP at an existing Kafka cluster"
    return fetch_jars(
        cache_dir(version), _pom(version), "kafka_2.13-*.jar", f"Apache Kafka {version}", BrokerError, no_mvn
    )


def java_command(libs: Path, main: str, args: list[str], node_dir: Path, heap: str) -> list[str]:
    """The JVM command line running Kafka's class `main` with the logging set up in `node_dir`."""
    java = shutil.which("java")
    if java is None:
        raise BrokerError(
            "Java (17+) is not on PATH; install a JRE (apt-get install openjdk-17-jre-headless)"
        )
    return [
        java,
        f"-Xmx{heap}",
        "-Xms128m",
        "-XX:+UseSerialGC",
        *(["-XX:TieredStopAtLevel=1"] if main != "kafka.Kafka" else []),  # short-lived tools start faster
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={node_dir / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={node_dir}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]
