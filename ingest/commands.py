"""CLI commands of the transport: `kafka up`, `kafka down`, `ingest`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from trajlake.cli import (
    CliError,
    add_kafka_option,
    add_lake_option,
    env_default,
    settings_error,
)

DEFAULT_BROKER_DIR = "./trajlake-kafka"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `kafka up|down` and `ingest`."""
    kafka = subparsers.add_parser(
        "kafka", help="a local Apache Kafka broker (KRaft, no Docker) for dev and tests"
    )
    actions = kafka.add_subparsers(dest="kafka_command", metavar="ACTION")
    up = actions.add_parser(
        "up", help="fetch Kafka from Maven Central (cached), format storage, start a broker"
    )
    up.add_argument(
        "--port",
        type=int,
        default=int(env_default("KAFKA_PORT", "9092") or 9092),
        help="client port on 127.0.0.1 (env TRAJLAKE_KAFKA_PORT; default %(default)s)",
    )
    _data_dir_option(up)
    up.add_argument(
        "--partitions",
        type=int,
        default=int(env_default("KAFKA_PARTITIONS", "4") or 4),
        help="default partitions of new topics (env TRAJLAKE_KAFKA_PARTITIONS; default %(default)s)",
    )
    up.add_argument(
        "--heap",
        default=env_default("KAFKA_HEAP", "512m"),
        help="JVM max heap (env TRAJLAKE_KAFKA_HEAP; default %(default)s)",
    )
    up.set_defaults(handler=run_kafka_up)
    down = actions.add_parser("down", help="stop the broker started in --data-dir")
    _data_dir_option(down)
    down.set_defaults(handler=run_kafka_down)
    kafka.set_defaults(handler=lambda args: _usage(kafka))

    p = subparsers.add_parser("ingest", help="the exactly-once sink: Kafka topic -> Delta lake")
    add_lake_option(p)
    add_kafka_option(p, "bootstrap servers (env TRAJLAKE_KAFKA, else TRAJLAKE_KAFKA_BOOTSTRAP; required)")
    # the sink has no embedded alternative, so the cluster named for every Kafka client is its default
    p.set_defaults(kafka=env_default("KAFKA") or env_default("KAFKA_BOOTSTRAP"))
    p.add_argument(
        "--topic",
        default=env_default("TOPIC", "trajlake-events"),
        help="topic to consume (env TRAJLAKE_TOPIC; default %(default)s)",
    )
    p.add_argument(
        "--group",
        default=env_default("GROUP", "trajlake-sink"),
        help="consumer group shared by all sink processes (env TRAJLAKE_GROUP; default %(default)s)",
    )
    p.add_argument(
        "--until-idle",
        type=float,
        default=env_default("UNTIL_IDLE"),
        metavar="S",
        help="exit after S seconds without new messages (env TRAJLAKE_UNTIL_IDLE; default: run until SIGTERM)",
    )
    p.add_argument(
        "--max-rows",
        type=int,
        default=int(env_default("MAX_ROWS", "50000") or 50000),
        help="flush after this many events (env TRAJLAKE_MAX_ROWS; default %(default)s)",
    )
    p.add_argument(
        "--max-latency",
        type=float,
        default=env_default("MAX_LATENCY", "1.0"),
        metavar="S",
        help="flush at least every S seconds (env TRAJLAKE_MAX_LATENCY; default %(default)s)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=env_default("METRICS_PORT"),
        help="serve Prometheus metrics on this port (env TRAJLAKE_METRICS_PORT; 0 = any free port; default off)",
    )
    p.add_argument(
        "--metrics-host",
        default=env_default("METRICS_HOST", "127.0.0.1"),
        help="address of the metrics endpoint (env TRAJLAKE_METRICS_HOST; default %(default)s)",
    )
    p.add_argument(
        "--log-interval",
        type=float,
        default=env_default("LOG_INTERVAL", "10.0"),
        metavar="S",
        help="seconds between progress log lines (env TRAJLAKE_LOG_INTERVAL; default %(default)s)",
    )
    p.add_argument(
        "--no-exactly-once",
        action="store_true",
        default=env_default("NO_EXACTLY_ONCE", "") == "1",
        help="do not store offsets in the Delta log (benchmarks only; env TRAJLAKE_NO_EXACTLY_ONCE=1)",
    )
    p.set_defaults(handler=run_ingest)


def _data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        default=env_default("KAFKA_DATA_DIR", DEFAULT_BROKER_DIR),
        help="broker storage, logs and pid file (env TRAJLAKE_KAFKA_DATA_DIR; default %(default)s)",
    )


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_kafka_up(args: argparse.Namespace) -> int:
    """Start the local broker and print its bootstrap address."""
    from pydantic import ValidationError

    from trajlake.ingest.broker import BrokerConfig, BrokerError, start_broker

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # the readiness probe's client chatter
    try:
        config = BrokerConfig(
            port=args.port, data_dir=Path(args.data_dir), partitions=args.partitions, heap=args.heap
        )
        bootstrap = start_broker(config)
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
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
    if not args.kafka:
        raise CliError("--kafka HOST:PORT is required (or set TRAJLAKE_KAFKA or TRAJLAKE_KAFKA_BOOTSTRAP)")
    from pydantic import ValidationError

    from trajlake.ingest.config import KafkaConfig
    from trajlake.ingest.service import run_ingest as serve
    from trajlake.ingest.sink import SinkConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        kafka = KafkaConfig.from_env(bootstrap=args.kafka, topic=args.topic, group_id=args.group)
        sink = SinkConfig(
            max_rows=args.max_rows, max_latency_s=args.max_latency, exactly_once=not args.no_exactly_once
        )
    except ValidationError as err:
        where = {f: f"TRAJLAKE_KAFKA_{f.upper()}" for f in KafkaConfig.model_fields}
        where.update(
            bootstrap="--kafka or TRAJLAKE_KAFKA", topic="--topic or TRAJLAKE_TOPIC", group_id="--group or TRAJLAKE_GROUP",
            max_rows="--max-rows or TRAJLAKE_MAX_ROWS", max_latency_s="--max-latency or TRAJLAKE_MAX_LATENCY",
        )  # fmt: skip
        raise CliError(settings_error(err, where)) from None
    if args.until_idle is not None and args.until_idle < 0:
        raise CliError(
            f"--until-idle must be 0 or more seconds, not {args.until_idle:g} (TRAJLAKE_UNTIL_IDLE)"
        )
    if args.metrics_port:  # fail now, not after joining the consumer group (0 = any free port)
        _check_port_free(args.metrics_host, args.metrics_port)
    stats = serve(
        args.lake,
        kafka,
        sink,
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
