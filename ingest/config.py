"""Settings of the transport: Kafka (`KafkaConfig`, TRAJLAKE_KAFKA_* env vars) and the sink (`SinkConfig`, `IngestSettings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from trajlake.common.settings import Settings, cache_dir, cli

DEFAULT_TOPIC = "trajlake-events"
DEFAULT_GROUP = "trajlake-sink"


REPLICATION_FACTOR_HELP = "replicas of each partition of a topic; default: min(3, brokers of the cluster)"
MIN_INSYNC_REPLICAS_HELP = (
    "replicas an acks=all write to a topic waits for; default: replication_factor - 1, at least 1"
)


def replication(
    brokers: int, replication_factor: int | None = None, min_insync_replicas: int | None = None
) -> tuple[int, int]:
    """The replication factor and min.insync.replicas of a topic on `brokers` brokers: by default
    min(3, brokers) and one fewer (at least 1), so that one broker down stops no acks=all write."""
    rf = replication_factor or min(3, brokers)
    min_isr = min_insync_replicas or max(1, rf - 1)
    if rf > brokers:
        raise ValueError(
            f"replication_factor {rf} exceeds the {brokers} broker(s) of the cluster; lower it "
            "(TRAJLAKE_KAFKA_REPLICATION_FACTOR, --replication-factor) or start more nodes (--nodes)"
        )
    if min_isr > rf:
        raise ValueError(
            f"min_insync_replicas {min_isr} exceeds replication_factor {rf}: no write could ever be "
            "acknowledged; lower it (TRAJLAKE_KAFKA_MIN_INSYNC_REPLICAS, --min-insync-replicas)"
        )
    return rf, min_isr


def default_spool_dir() -> Path:
    """Where producers spool messages while the broker is unreachable."""
    return cache_dir() / "spool"


class KafkaConfig(Settings):
    """How to reach Kafka, and how the producer and consumer behave (env TRAJLAKE_KAFKA_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_KAFKA_")

    bootstrap: str = Field(
        "127.0.0.1:9092", min_length=1, description="HOST:PORT[,HOST:PORT…] of the cluster"
    )
    topic: str = Field(DEFAULT_TOPIC, min_length=1, description="topic that carries events")
    group_id: str = Field(
        DEFAULT_GROUP,
        min_length=1,
        description="consumer group shared by all sink processes",
    )
    group_instance_id: str | None = Field(
        None,
        description="static group membership: a restarted sink with the same id gets its partitions back at once",
    )
    client_id: str = Field("trajlake", description="client id shown in broker logs")
    partitions: int = Field(4, ge=1, le=10_000, description="partitions when this client creates the topic")
    replication_factor: int | None = Field(None, ge=1, description=REPLICATION_FACTOR_HELP)
    min_insync_replicas: int | None = Field(None, ge=1, description=MIN_INSYNC_REPLICAS_HELP)
    wire_format: Literal["arrow", "json"] = Field("arrow", description="value encoding of published events")
    compression: Literal["auto", "zstd", "lz4", "gzip", "none"] = Field(
        "auto",
        description="producer batch compression; auto = zstd (fewest bytes, least sink CPU: bench/ingest.py), else lz4, else gzip",
    )
    pack_bytes: int = Field(
        256 * 1024,
        ge=0,
        description="publish: trajectories bound for one partition share an Arrow message up to this size "
        "(0: one trajectory per message; packs cut the sink's CPU per GB by a third: bench/ingest.py)",
    )
    max_message_bytes: int = Field(
        1_000_000, ge=16_384, description="larger values are split into chunks (broker default limit ~1 MB)"
    )
    linger_ms: int = Field(5, ge=0, description="producer batching delay")
    batch_bytes: int = Field(512 * 1024, ge=1024, description="producer batch size per partition")
    buffer_memory_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes sent but not yet acknowledged (bounded memory) before spooling to disk",
    )
    delivery_timeout_s: float = Field(
        120.0, gt=0, description="how long the producer retries a batch (idempotently) before spooling it"
    )
    max_block_s: float = Field(
        2.0, ge=0, description="how long send() may block on a full buffer or missing metadata"
    )
    spool_dir: Path = Field(
        default_factory=default_spool_dir, description="disk spool for undeliverable messages"
    )
    spool_max_bytes: int = Field(1 << 30, ge=1 << 20, description="disk spool limit; beyond it send() raises")
    retry_interval_s: float = Field(1.0, gt=0, description="how often to retry delivering spooled messages")
    max_poll_records: int = Field(2000, ge=1, description="consumer: records per poll")
    fetch_max_bytes: int = Field(
        1 << 20,
        ge=1 << 20,
        description="consumer: bytes per partition fetch; larger fetches delay the first record of a backlog",
    )
    connect_timeout_s: float = Field(
        30.0, gt=0, description="consumer and admin: how long to wait for a first broker before failing"
    )
    session_timeout_s: float = Field(
        10.0, ge=1, description="consumer: group session timeout (a killed sink's partitions move after it)"
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="how to talk to the brokers"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None = (
        Field(None, description="SASL mechanism for SASL_* protocols")
    )
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(None, description="SASL password (never printed)")
    ssl_cafile: Path | None = Field(None, description="CA bundle that signed the brokers' certificates")
    ssl_certfile: Path | None = Field(None, description="client certificate (mutual TLS)")
    ssl_keyfile: Path | None = Field(None, description="client private key (mutual TLS)")
    ssl_password: SecretStr | None = Field(None, description="password of the client key (never printed)")
    ssl_check_hostname: bool = Field(True, description="verify the broker's hostname against its certificate")

    @field_validator("bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        for server in value.split(","):
            host, colon, port = server.strip().rpartition(":")
            if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(
                    f"{server!r} is not HOST:PORT; give --kafka (TRAJLAKE_KAFKA) as HOST:PORT[,HOST:PORT…]"
                )
        return value

    @model_validator(mode="after")
    def _check_settings(self) -> KafkaConfig:
        problems = []
        sasl = self.security_protocol.startswith("SASL")
        if sasl and self.sasl_mechanism is None:
            problems.append(
                f"security_protocol={self.security_protocol} needs sasl_mechanism (TRAJLAKE_KAFKA_SASL_MECHANISM)"
            )
        if (
            sasl
            and self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
            and (not self.sasl_username or self.sasl_password is None)
        ):
            problems.append(
                f"sasl_mechanism={self.sasl_mechanism} needs sasl_username and sasl_password "
                "(TRAJLAKE_KAFKA_SASL_USERNAME / TRAJLAKE_KAFKA_SASL_PASSWORD)"
            )
        if not sasl and self.sasl_mechanism is not None:
            problems.append(
                f"sasl_mechanism is set but security_protocol={self.security_protocol}; use SASL_SSL"
            )
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_file():
                problems.append(f"{name} {path} does not exist (TRAJLAKE_KAFKA_{name.upper()})")
        if self.batch_bytes > self.max_message_bytes:
            # kafka-python cannot send a batch over its request size; it fails with "Future not done"
            problems.append(
                f"batch_bytes ({self.batch_bytes}) must not exceed max_message_bytes ({self.max_message_bytes}); "
                "lower TRAJLAKE_KAFKA_BATCH_BYTES or raise TRAJLAKE_KAFKA_MAX_MESSAGE_BYTES with the broker's limit"
            )
        if self.delivery_timeout_s * 1000 < self.linger_ms + 1000:
            problems.append(
                "delivery_timeout_s must exceed linger_ms + 1 s (TRAJLAKE_KAFKA_DELIVERY_TIMEOUT_S)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def compression_type(self) -> str | None:
        """The kafka-python `compression_type` this config resolves to."""
        from kafka import codec

        if self.compression == "none":
            return None
        if self.compression != "auto":
            return self.compression
        # zstd over lz4: its window spans many messages, so the Arrow schema every message repeats
        # compresses away; bench/ingest.py measured 4.9 vs 6.8 wire bytes/token and less sink CPU
        if codec.has_zstd():
            return "zstd"
        if codec.has_lz4():
            return "lz4"
        return "gzip"

    def client_kwargs(self) -> dict[str, Any]:
        """Connection and security settings shared by kafka-python producers, consumers and admins."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap.split(","),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            kwargs["sasl_plain_username"] = self.sasl_username
        if self.sasl_password is not None:
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value()
        if self.security_protocol.endswith("SSL"):
            kwargs["ssl_check_hostname"] = self.ssl_check_hostname
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name) is not None:
                    kwargs[name] = str(getattr(self, name))
            if self.ssl_password is not None:
                kwargs["ssl_password"] = self.ssl_password.get_secret_value()
        return kwargs


class BusConfig(BaseModel):
    """Which bus carries events from publishers to sinks: `type` picks the backend."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["inprocess", "kafka"] = Field(
        "inprocess", description="inprocess: the embedded default, one process; kafka: a cluster, scale-out"
    )
    kafka: KafkaConfig | None = Field(None, description="the cluster, topic and clients, for type kafka")
    topic: str | None = Field(None, description="inprocess: the topic name (default: one of its own)")
    partitions: int | None = Field(None, ge=1, description="inprocess: its partitions (default 4)")

    @model_validator(mode="after")
    def _check_type(self) -> BusConfig:
        if (self.type == "kafka") != (self.kafka is not None):
            raise ValueError("a bus of type kafka needs its KafkaConfig (kafka), and only it does")
        return self


class SinkConfig(Settings):
    """When the sink flushes, and what it does on each flush."""

    max_rows: int = Field(50_000, ge=1, description="Flush once this many events are buffered.")
    max_bytes: int = Field(128 << 20, ge=1 << 10, description="Flush once buffered messages reach this size.")
    max_latency_s: float = Field(
        1.0,
        gt=0,
        validation_alias="TRAJLAKE_MAX_LATENCY",
        description="Flush buffered events at least this often, in seconds.",
    )
    poll_max_messages: int = Field(500, ge=1, description="Messages taken per poll.")
    poll_timeout_s: float = Field(0.2, gt=0, description="How long one poll waits for a first message.")
    flush_when_idle: bool = Field(
        True, description="Flush as soon as a poll returns nothing new or the bus has handed over all it has."
    )
    min_flush_bytes: int = Field(
        4 << 20,
        ge=0,
        description="Flush this much whenever no commit is running; less waits for idleness or max_latency_s.",
    )
    min_commit_interval_s: float = Field(
        0.2,
        ge=0,
        description="Least time from one flush to an idle flush of a small batch (bounds commits of a trickle).",
    )
    exactly_once: bool = Field(
        True,
        description="Store offsets in the Delta log and resume from them.",
        json_schema_extra=cli(
            "--no-exactly-once",
            off="store no offsets in the Delta log: a restarted sink may write events twice (benchmarks only)",
        ),
    )
    update_projections: bool = Field(
        True,
        description="Run the lake's projector in this process, beside its sinks (the embedded default): "
        "projections follow each events commit on a thread of their own.",
        json_schema_extra=cli(
            "--no-update-projections",
            off="only ingest: write events and offsets, and leave projections to `trajlake project --follow`",
        ),
    )
    seq_cache_trajectories: int = Field(
        200_000, ge=0, description="Trajectories whose seqs are kept to detect duplicates."
    )
    chunk_max_gap: int = Field(
        5000,
        ge=1,
        description="Messages a partition may carry past an incomplete chunk set before it is dead-lettered.",
    )


class IngestSettings(Settings):
    """`trajlake ingest`: how long it runs and how it reports."""

    until_idle: float | None = Field(
        None,
        ge=0,
        description="exit once the lake holds the topic's end (every partition's offset in the Delta log "
        "at its end offset) and this many seconds passed without a message; unset: run until SIGTERM",
        json_schema_extra=cli(metavar="SECONDS"),
    )
    drain_timeout: float = Field(
        120.0,
        gt=0,
        description="with --until-idle: exit 1, naming the partitions behind and the group's state, once the "
        "lake stays short of the topic's end this long without progress",
        json_schema_extra=cli(metavar="SECONDS"),
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve Prometheus metrics on this port (0 = any free port); unset: off",
    )
    metrics_host: str = Field("127.0.0.1", description="address of the metrics endpoint")
    log_interval: float = Field(
        10.0, gt=0, description="seconds between progress log lines", json_schema_extra=cli(metavar="SECONDS")
    )
