"""Jars from Maven Central (`common/maven.py`): a jar set of its own per POM, a clear refusal without Maven."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajlake.ingest.kafka_jars import BrokerError, ensure_jars
from trajlake.store.spark_jars import SparkJarsError, ensure_spark_jars, jars_dir


def test_without_maven_each_jar_set_says_what_to_install_or_set(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(
        SparkJarsError, match=r"`mvn`\) is not on PATH; install it .* or set TRAJLAKE_SPARK_JARS"
    ):
        ensure_spark_jars()
    with pytest.raises(BrokerError, match=r"`mvn`\) is not on PATH; .* TRAJLAKE_KAFKA_BOOTSTRAP"):
        ensure_jars()
    assert jars_dir().parent == tmp_path / "cache" / "spark" and not (jars_dir() / ".complete").exists()


def test_a_fetched_jar_set_is_used_from_the_cache_without_maven(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    libs = jars_dir() / "libs"
    libs.mkdir(parents=True)
    (libs / "delta-spark_2.13-4.0.1.jar").write_bytes(b"jar")
    (jars_dir() / ".complete").write_text("done")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert ensure_spark_jars() == [libs / "delta-spark_2.13-4.0.1.jar"]
