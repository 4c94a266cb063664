"""CLI commands of the lake: `sql`, `rebuild`, `compact`, `loadgen`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trajlake.cli import CliError, add_kafka_option, add_lake_option, env_default, settings_error


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the lake's commands."""
    p = subparsers.add_parser("sql", help="read-only SQL over every table of the lake")
    add_lake_option(p)
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),
        default=env_default("FORMAT", "table"),
        help="output format (env TRAJLAKE_FORMAT; default %(default)s)",
    )
    p.add_argument(
        "query", help='one SELECT statement, e.g. "select status, count(*) from trajectories group by 1"'
    )
    p.set_defaults(handler=run_sql)

    p = subparsers.add_parser("rebuild", help="recreate the projections from `events`")
    add_lake_option(p)
    p.set_defaults(handler=run_rebuild)

    p = subparsers.add_parser("compact", help="optimize + vacuum every table, with a retention guard")
    add_lake_option(p)
    p.add_argument(
        "--retention-hours",
        type=int,
        default=int(env_default("RETENTION_HOURS", "168") or 168),
        help="keep unreferenced files younger than this (env TRAJLAKE_RETENTION_HOURS; default %(default)s)",
    )
    p.add_argument(
        "--allow-short-retention",
        action="store_true",
        default=env_default("ALLOW_SHORT_RETENTION", "") == "1",
        help="allow a retention below the 168h guard (env TRAJLAKE_ALLOW_SHORT_RETENTION=1)",
    )
    p.add_argument("--no-vacuum", action="store_true", help="only merge small files")
    p.set_defaults(handler=run_compact)

    p = subparsers.add_parser("loadgen", help="synthetic agent-RL workload through the bus")
    add_lake_option(p)
    p.add_argument("--run-id", default=env_default("RUN_ID", "loadgen"), help="run id (env TRAJLAKE_RUN_ID)")
    p.add_argument(
        "--trajectories",
        type=int,
        default=env_default("TRAJECTORIES"),
        required=env_default("TRAJECTORIES") is None,
        help="number of trajectories (env TRAJLAKE_TRAJECTORIES)",
    )
    for name, kind, default, text in (
        ("turns", int, 6, "mean turns per trajectory"),
        ("max-turns", int, 32, "turn limit"),
        ("prompt-tokens", int, 512, "mean prompt tokens"),
        ("output-tokens", int, 256, "mean output tokens per turn"),
        ("env-tokens", int, 128, "mean tool-output tokens per turn"),
        ("tool-error-rate", float, 0.1, "probability a tool call fails"),
        ("tool-timeout-rate", float, 0.02, "probability a tool call times out"),
        ("system-failure-rate", float, 0.05, "probability of a system failure"),
        ("policy-versions", int, 8, "policy versions over the run"),
        ("group-size", int, 8, "samples per prompt group"),
        ("vocab-size", int, 151_936, "vocabulary size"),
        ("context-budget-tokens", int, 32_768, "context budget"),
        ("seed", int, 0, "random seed"),
    ):
        env = name.upper().replace("-", "_")
        p.add_argument(
            f"--{name}",
            type=kind,
            default=kind(env_default(env, str(default))),
            help=f"{text} (env TRAJLAKE_{env}; default %(default)s)",
        )
    add_kafka_option(p, "produce to Apache Kafka instead of the in-process bus (env TRAJLAKE_KAFKA)")
    p.add_argument(
        "--topic", default=env_default("TOPIC", "trajlake-events"), help="Kafka topic (env TRAJLAKE_TOPIC)"
    )
    p.add_argument("--json", action="store_true", help="print the counts produced as JSON")
    p.set_defaults(handler=run_loadgen)


def run_sql(args: argparse.Namespace) -> int:
    from trajlake.store.errors import ReadOnlyQueryError
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    try:
        table = lake.sql(args.query)
    except ReadOnlyQueryError as err:
        raise CliError(str(err)) from None
    except Exception as err:  # DuckDB errors: bad column, syntax; say what, never a traceback
        if type(err).__module__.startswith(("duckdb", "_duckdb")):
            raise CliError(f"{err}".strip()) from None
        raise
    write_table(table, args.format, sys.stdout)
    return 0


def write_table(table: Any, fmt: str, out: Any) -> None:
    """Print an Arrow table as an aligned text table, CSV, or a JSON list of row objects."""
    rows = table.to_pylist()
    if fmt == "json":
        json.dump(rows, out, default=_json_default)
        out.write("\n")
    elif fmt == "csv":
        import csv

        writer = csv.writer(out)
        writer.writerow(table.column_names)
        for row in rows:
            writer.writerow(["" if v is None else _cell(v) for v in row.values()])
    else:
        header = table.column_names
        cells = [[_cell(v) for v in row.values()] for row in rows]
        widths = [min(60, max([len(h)] + [len(c[i]) for c in cells])) for i, h in enumerate(header)]
        out.write(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip() + "\n")
        out.write("-+-".join("-" * w for w in widths) + "\n")
        for c in cells:
            out.write(" | ".join(v[:w].ljust(w) for v, w in zip(c, widths, strict=True)).rstrip() + "\n")
        out.write(f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list) and len(value) > 8:
        return "[" + ", ".join(_cell(v) for v in value[:8]) + f", … ({len(value)} items)]"
    return str(value)


def _json_default(value: Any) -> Any:
    import decimal

    if isinstance(value, decimal.Decimal):  # DuckDB sums of integers are HUGEINT -> Decimal
        return int(value) if value == value.to_integral_value() else float(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def run_rebuild(args: argparse.Namespace) -> int:
    from trajlake.store import projections
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    if lake.version("events") < 0:
        raise CliError(f"no events table under {lake.root}; point --lake at an existing lake")
    print(f"rebuilding projections from events version {lake.version('events')} …", file=sys.stderr)
    counts = projections.rebuild(lake)
    for name, n in counts.items():
        print(f"{name}: {n} rows")
    return 0


def run_compact(args: argparse.Namespace) -> int:
    from trajlake.store.compact import compact
    from trajlake.store.errors import LakeError
    from trajlake.store.lake import TABLES, Lake

    lake = Lake(args.lake)
    try:
        from trajlake.progress import Progress

        report = None
        with Progress(len(TABLES), "compact", unit="tables") as progress:
            for name in TABLES:
                part = compact(
                    lake, [name], args.retention_hours, args.allow_short_retention, not args.no_vacuum
                )
                report = part if report is None else _merge_reports(report, part)
                progress.update()
    except LakeError as err:
        raise CliError(str(err)) from None
    assert report is not None
    for name in report.files_removed:
        print(
            f"{name}: {report.files_removed[name]} files merged into {report.files_added[name]}, "
            f"{report.vacuumed.get(name, 0)} files vacuumed"
        )
    return 0


def _merge_reports(a: Any, b: Any) -> Any:
    a.files_removed.update(b.files_removed)
    a.files_added.update(b.files_added)
    a.vacuumed.update(b.vacuumed)
    return a


def run_loadgen(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from trajlake.progress import Progress
    from trajlake.rollout.loadgen import LoadgenConfig, generate

    try:
        config = LoadgenConfig(
            trajectories=args.trajectories, run_id=args.run_id, turns=args.turns, max_turns=args.max_turns,
            prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, env_tokens=args.env_tokens,
            tool_error_rate=args.tool_error_rate, tool_timeout_rate=args.tool_timeout_rate,
            system_failure_rate=args.system_failure_rate, policy_versions=args.policy_versions,
            group_size=args.group_size, vocab_size=args.vocab_size,
            context_budget_tokens=args.context_budget_tokens, seed=args.seed,
        )  # fmt: skip
    except ValidationError as err:
        options = {f: f"--{f.replace('_', '-')} or TRAJLAKE_{f.upper()}" for f in LoadgenConfig.model_fields}
        raise CliError(settings_error(err, options)) from None
    from trajlake.ingest.bus import setup_bus

    sink_thread = None
    if args.kafka:
        bus = setup_bus("kafka", bootstrap=args.kafka, topic=args.topic)
    else:  # the embedded bus lives in this process, and so does its sink
        from trajlake.ingest.sink import DeltaSink, SinkThread
        from trajlake.store.lake import Lake

        bus = setup_bus("inprocess")  # a topic of its own: in-process offsets restart in every process
        sink_thread = SinkThread(DeltaSink(Lake(args.lake), bus))
    with Progress(config.trajectories, "loadgen", unit="traj") as progress:
        counts = generate(bus, config, on_trajectory=lambda _: progress.update())
    if sink_thread is not None:
        sink_thread.stop(drain=True)
    bus.close()
    result = {
        "events": counts.events,
        "trajectories": counts.trajectories,
        "turns": counts.turns,
        "tokens": counts.tokens,
    }
    left = bus.spool_stats()
    undelivered = left.messages
    if args.kafka:
        result["undelivered_messages"] = undelivered
    if args.json:
        print(json.dumps(result))
    else:
        where = f"Kafka topic {args.topic} at {args.kafka}" if args.kafka else args.lake
        verb, to = ("generated", "for") if undelivered else ("wrote", "to")
        print(
            f"{verb} {counts.events} events, {counts.trajectories} trajectories, {counts.tokens} tokens {to} {where}"
        )
    if undelivered:
        print(
            f"trajlake loadgen: {undelivered} messages did not reach Kafka at {args.kafka}; they wait in "
            f"{left.directory}, and the next producer of topic {bus.topic} delivers them",
            file=sys.stderr,
        )
        return 1
    return 0
