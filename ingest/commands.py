"""CLI commands of the transport: `kafka up`, `kafka down`, `ingest`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from trajlake.ingest.broker import BrokerConfig
from trajlake.ingest.config import IngestSettings, KafkaConfig, SinkConfig
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import KafkaSwitch, LakeSettings, add_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `kafka up|down` and `ingest`."""
    kafka = subparsers.add_parser(
        "kafka", help="a local Apache Kafka broker (KRaft, no Docker) for dev and tests"
    )
    actions = kafka.add_subparsers(dest="kafka_command", metavar="ACTION")
    up = actions.add_parser(
        "up", help="fetch Kafka from Maven Central (cached), format storage, start a broker"
    )
    add_settings(up, BrokerConfig, ["port", "data_dir", "partitions", "heap"])
    up.set_defaults(handler=run_kafka_up)
    down = actions.add_parser("down", help="stop the broker started in --data-dir")
    add_settings(down, BrokerConfig, ["data_dir"])
    down.set_defaults(handler=run_kafka_down)
    kafka.set_defaults(handler=lambda args: _usage(kafka))

    p = subparsers.add_parser("ingest", help="the exactly-once sink: Kafka topic -> Delta lake")
    add_settings(p, LakeSettings)
    # the sink has no embedded alternative: without --kafka / TRAJLAKE_KAFKA it takes
    # TRAJLAKE_KAFKA_BOOTSTRAP, the cluster named for every Kafka client
    add_settings(
        p, KafkaSwitch, help={"kafka": "bootstrap servers; unset: TRAJLAKE_KAFKA_BOOTSTRAP (required)"}
    )
    add_settings(p, KafkaConfig, ["topic", "group_id"])
    add_settings(p, SinkConfig, ["max_rows", "max_latency_s", "exactly_once"])
    add_settings(p, IngestSettings)
    p.set_defaults(handler=run_ingest)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_kafka_up(args: argparse.Namespace) -> int:
    """Start the local broker and print its bootstrap address."""
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
    """Stop the local broker."""
    from trajlake.ingest.broker import stop_broker

    stopped = stop_broker(Path(args.data_dir))
    print("stopped" if stopped else f"no broker running in {args.data_dir}")
    return 0


def run_ingest(args: argparse.Namespace) -> int:
    """Run the sink; print its totals as JSON when it stops."""
    from pydantic import ValidationError

    from trajlake.ingest.service import run_ingest as serve
    from trajlake.schemas.settings import settings_error

    kafka: KafkaConfig = args.KafkaConfig
    bootstrap = args.kafka or (kafka.bootstrap if "bootstrap" in kafka.model_fields_set else None)
    if not bootstrap:
        raise CliError("--kafka HOST:PORT is required (or set TRAJLAKE_KAFKA or TRAJLAKE_KAFKA_BOOTSTRAP)")
    try:
        kafka = KafkaConfig.from_env(bootstrap=bootstrap, topic=kafka.topic, group_id=kafka.group_id)
    except ValidationError as err:
        raise CliError(settings_error(err, {"bootstrap": "--kafka or TRAJLAKE_KAFKA"})) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    if args.metrics_port:  # fail now, not after joining the consumer group (0 = any free port)
        _check_port_free(args.metrics_host, args.metrics_port)
    stats = serve(
        args.lake,
        kafka,
        args.SinkConfig,
        until_idle_s=args.until_idle,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        log_interval_s=args.log_interval,
    )
    print(
        json.dumps(
            {
                "messages": stats.messages,
                "events": stats.events,
                "dead_letters": stats.dead_letters,
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
