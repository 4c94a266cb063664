"""CLI commands of the transport: `kafka up`, `kafka down`, `kafka topic create`, `ingest`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from trajlake.common.settings import add_settings, group_usage
from trajlake.ingest.broker import BrokerConfig
from trajlake.ingest.config import IngestSettings, KafkaConfig, SinkConfig
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import KafkaSwitch, LakeSettings, uses_lake


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `kafka up|down|topic create` and `ingest`."""
    kafka = subparsers.add_parser(
        "kafka", help="a local Apache Kafka cluster (KRaft, no Docker) for dev and tests, and its topics"
    )
    actions = kafka.add_subparsers(dest="kafka_command", metavar="ACTION")
    up = actions.add_parser(
        "up",
        help="fetch Kafka from Maven Central (cached), format storage, start N nodes; print the bootstrap list",
    )
    add_settings(
        up,
        BrokerConfig,
        ["nodes", "port", "data_dir", "partitions", "replication_factor", "min_insync_replicas", "heap"],
    )
    up.set_defaults(handler=run_kafka_up)
    down = actions.add_parser("down", help="stop every node started in --data-dir")
    add_settings(down, BrokerConfig, ["data_dir"])
    down.set_defaults(handler=run_kafka_down)
    kafka.set_defaults(handler=group_usage(kafka))
    topic = actions.add_parser("topic", help="topics of a running cluster")
    topic_actions = topic.add_subparsers(dest="topic_command", metavar="ACTION")
    create = topic_actions.add_parser(
        "create",
        help="create the topic (replicated as the cluster allows) unless it exists; print its health",
    )
    add_settings(
        create, KafkaSwitch, help={"kafka": "bootstrap servers; unset: TRAJLAKE_KAFKA_BOOTSTRAP (required)"}
    )
    add_settings(create, KafkaConfig, ["topic", "partitions", "replication_factor", "min_insync_replicas"])
    create.set_defaults(handler=run_topic_create)
    topic.set_defaults(handler=group_usage(topic))

    p = subparsers.add_parser("ingest", help="the exactly-once sink: Kafka topic -> Delta lake")
    add_settings(p, LakeSettings)
    uses_lake(p, "write")
    # the sink has no embedded alternative: without --kafka / TRAJLAKE_KAFKA it takes
    # TRAJLAKE_KAFKA_BOOTSTRAP, the cluster named for every Kafka client
    add_settings(
        p, KafkaSwitch, help={"kafka": "bootstrap servers; unset: TRAJLAKE_KAFKA_BOOTSTRAP (required)"}
    )
    add_settings(p, KafkaConfig, ["topic", "group_id"])
    add_settings(p, SinkConfig, ["max_rows", "max_latency_s", "exactly_once", "update_projections"])
    add_settings(p, IngestSettings)
    p.set_defaults(handler=run_ingest)


def run_kafka_up(args: argparse.Namespace) -> int:
    """Start the local cluster and print its bootstrap list."""
    from trajlake.ingest.broker import BrokerError, start_broker

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # the readiness probe's client chatter
    try:
        bootstrap = start_broker(args.BrokerConfig)
    except BrokerError as err:
        raise CliError(str(err)) from None
    print(bootstrap)
    return 0


def run_kafka_down(args: argparse.Namespace) -> int:
    """Stop every node of the local cluster."""
    from trajlake.ingest.broker import stop_broker

    stopped = stop_broker(Path(args.data_dir))
    print("stopped" if stopped else f"no broker running in {args.data_dir}")
    return 0


def run_topic_create(args: argparse.Namespace) -> int:
    """Create the topic unless it exists; print what the brokers say of it as JSON."""
    from trajlake.ingest.bus.base import BusUnreachable
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin

    kafka = _kafka_config(args, ["topic", "partitions", "replication_factor", "min_insync_replicas"])
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # a node down: the admin's retries say it
    try:
        with KafkaAdmin(kafka) as admin:
            created = admin.create_topic()
            health = admin.health()
            end = admin.end_offsets()
    except BusUnreachable as err:
        raise CliError(str(err)) from None
    except ValueError as err:  # the replication asked for exceeds the brokers up
        raise CliError(str(err)) from None
    print(
        json.dumps(
            {
                "topic": kafka.topic,
                "created": created,
                "partitions": len(end),
                "replication_factor": health.replication_factor,
                "min_insync_replicas": health.min_insync_replicas,
                "brokers": health.brokers,
                "health": health.describe(),
            }
        )
    )
    return 0


def _kafka_config(args: argparse.Namespace, fields: list[str]) -> KafkaConfig:
    """The command's `KafkaConfig` with its bootstrap from --kafka, TRAJLAKE_KAFKA or TRAJLAKE_KAFKA_BOOTSTRAP."""
    from pydantic import ValidationError

    from trajlake.common.settings import settings_error

    kafka: KafkaConfig = args.KafkaConfig
    bootstrap = args.kafka or (kafka.bootstrap if "bootstrap" in kafka.model_fields_set else None)
    if not bootstrap:
        raise CliError("--kafka HOST:PORT is required (or set TRAJLAKE_KAFKA or TRAJLAKE_KAFKA_BOOTSTRAP)")
    try:
        return KafkaConfig.from_env(bootstrap=bootstrap, **{f: getattr(kafka, f) for f in fields})
    except ValidationError as err:
        raise CliError(settings_error(err, {"bootstrap": "--kafka or TRAJLAKE_KAFKA"})) from None


def run_ingest(args: argparse.Namespace) -> int:
    """Run the sink; print its totals as JSON when it stops."""
    from trajlake.ingest.service import run_ingest as serve
    from trajlake.ingest.sink import DrainIncomplete

    kafka = _kafka_config(args, ["topic", "group_id"])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    if args.metrics_port:  # fail now, not after joining the consumer group (0 = any free port)
        _check_port_free(args.metrics_host, args.metrics_port)
    try:
        stats = serve(
            args.lake,
            kafka,
            args.SinkConfig,
            until_idle_s=args.until_idle,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            log_interval_s=args.log_interval,
            drain_timeout_s=args.drain_timeout,
        )
    except DrainIncomplete as err:
        behind = {str(p): {"holds": h, "end": e} for p, (h, e) in err.behind.items()}
        print(json.dumps({"drained": False, "behind": behind, "group": err.group}))
        print(f"trajlake ingest: {err}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "messages": stats.messages,
                "events": stats.events,
                "dead_letters": stats.dead_letters,
                "replayed": stats.replayed,
                "commits": stats.commits,
            }
        )
    )
    return 0


def _check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the metrics server binds
        try:
            probe.bind((host, port))
        except OSError as err:
            raise CliError(
                f"cannot serve metrics on {host}:{port} ({err.strerror}); pass another --metrics-port, "
                "or 0 for any free port"
            ) from None
