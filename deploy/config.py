"""Settings of `trajlake stack` (`StackConfig`), read from arguments or TRAJLAKE_STACK_* env vars."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trajlake.common.settings import Settings, cli

LAKE = "s3://trajlake/lake"
"""The stack's lake: prefix `lake` of the bucket its SeaweedFS creates."""
GROUP = "trajlake-stack"
"""The consumer group of the stack's sinks."""
WRITER, READER, SINK, DEMO = "writer", "reader", "sink", "demo"
ROLES = (WRITER, READER)
"""The stack's roles, each with its own S3 key and catalog role: the writer (sinks, projector,
trainers, compaction) writes the lake and takes leases; the reader (dashboard, SQL users) reads."""
ENVS = (WRITER, READER, SINK, DEMO)
"""The clients' environments (`env/<name>.env`): the writer's and the reader's carry the Kafka
producer's credentials; the sinks' is the writer's lake and catalog with the Kafka sink's, the
demo's (`trajlake demo --stack`: its own topic, producer and sink per run) with the Kafka demo's."""


class StackConfig(Settings):
    """Settings of the local deployment: Kafka, SeaweedFS, PostgreSQL, sinks, projector, dashboard."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_STACK_")

    dir: Path = Field(
        Path("./trajlake-stack"),
        description="every part's data dir and log, and stack.json (what runs: pids, ports, environment)",
        json_schema_extra=cli(metavar="DIR"),
    )
    brokers: int = Field(1, ge=1, le=9, description="Kafka nodes (3 keep writing with one down)")
    sinks: int = Field(2, ge=1, le=32, description="`trajlake ingest` processes in one consumer group")
    start_timeout_s: float = Field(
        180.0,
        gt=0,
        description="how long to wait for each part to answer (Kafka, S3, sinks' group, dashboard)",
    )
