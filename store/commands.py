"""CLI commands of the lake: `sql`, `export`, `label`, `search`, `rebuild`, `project`, `compact`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trajlake.common.settings import add_settings
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, LakeSettings, RunSettings, uses_lake
from trajlake.store.config import (
    CompactSettings,
    ExportSettings,
    LabelSettings,
    ProjectorConfig,
    ProjectSettings,
    SearchSettings,
    TokenizerSettings,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the lake's commands."""
    p = subparsers.add_parser(
        "sql",
        help="read-only SQL over every table of the lake",
        description="Run one read-only SELECT over the lake's tables. detokenize(token_ids, model) "
        "shows token ids as text with the tokenizer of the model a run recorded (its `model` "
        'column), e.g. "select trajectory_id, detokenize(output_token_ids, model) as text from turns '
        'join trajectories using (run_id, trajectory_id) limit 5"; --tokenizer DIR decodes with '
        "DIR instead.",
    )
    add_settings(p, LakeSettings)
    add_settings(p, FormatSettings)
    add_settings(p, TokenizerSettings)
    uses_lake(p, "read")
    p.add_argument(
        "query", help='one SELECT statement, e.g. "select status, count(*) from trajectories group by 1"'
    )
    p.set_defaults(handler=run_sql)

    p = subparsers.add_parser(
        "export", help="write the trajectories a query selects (tokens, masks, chat text) for SFT or datasets"
    )
    add_settings(p, LakeSettings)
    add_settings(p, ExportSettings)
    uses_lake(p, "read")
    p.set_defaults(handler=run_export)

    p = subparsers.add_parser(
        "label",
        help="label trajectories or turns (env_bug, reward_hack, …): the sampler, doctor and export use them",
        description="Append a label to the lake's `labels` table: to the trajectories --trajectory names or "
        "--sql selects, or to one turn of them (--turn). Labels are never overwritten: the latest row per "
        "trajectory, turn and key is the label's value, and --clear clears it. The view current_labels "
        "holds the labels in force.",
    )
    add_settings(p, LakeSettings)
    uses_lake(p, "write")
    add_settings(p, RunSettings, help={"run_id": "the run of the trajectories"})
    add_settings(p, LabelSettings)
    p.set_defaults(handler=run_label)

    p = subparsers.add_parser(
        "search",
        help="find a regex (over decoded text) or a run of token ids in a run's turns, counted per policy version",
        description="Scan the run's turns for a token-id subsequence (--tokens) or a regular expression over "
        "their text decoded with the run's tokenizer (--regex). Prints, per policy version, the turns read, "
        "the turns hit and the matches, then the first turns hit. Before it reads it says how many tokens "
        "that is and about how long it takes, and it shows its progress while it reads.",
    )
    add_settings(p, LakeSettings)
    uses_lake(p, "read")
    add_settings(p, RunSettings, help={"run_id": "the run to search"})
    add_settings(p, SearchSettings)
    add_settings(p, TokenizerSettings)
    add_settings(p, FormatSettings, choices={"format": ["table", "json"]},
                 help={"format": "print the counts and hits as tables, or as JSON"})  # fmt: skip
    p.set_defaults(handler=run_search)

    p = subparsers.add_parser("rebuild", help="recreate the projections from `events`")
    add_settings(p, LakeSettings)
    uses_lake(p, "update")
    p.set_defaults(handler=run_rebuild)

    p = subparsers.add_parser(
        "project",
        help="the projector: bring the projections up to `events` (and follow it), as their one writer",
        description="Advance every projection from the events version it records, then merge its files by "
        "size tier. Starting takes the projections over: a projector running elsewhere is fenced off at "
        "its next commit. Run one beside sinks started with --no-update-projections.",
    )
    add_settings(p, LakeSettings)
    add_settings(p, ProjectSettings)
    add_settings(p, ProjectorConfig, ["poll_interval_s", "merge_fanin"])
    uses_lake(p, "write")
    p.set_defaults(handler=run_project)

    p = subparsers.add_parser("compact", help="optimize + vacuum every table, with a retention guard")
    add_settings(p, LakeSettings)
    add_settings(p, CompactSettings)
    uses_lake(p, "update")
    p.set_defaults(handler=run_compact)


def run_sql(args: argparse.Namespace) -> int:
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    lake.query_engine().tokenizer = args.tokenizer
    with _query_errors():  # a model with no tokenizer here is a TokenizerNotFound naming --tokenizer
        table = lake.sql(args.query)
    from trajlake.common.terminal import write_table

    rows = list(zip(*(column.to_pylist() for column in table.columns), strict=True))
    write_table(table.column_names, rows, sys.stdout, args.format, max_width=args.max_width)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from trajlake.store.export import export
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    with _query_errors():  # a refused query, no trajectory_id or a non-empty --out is a LakeError
        report = export(lake, args.ExportSettings)
    what = "token ids and chat text" if report.text else "token ids"
    files = f"{len(report.files)} file{'s' if len(report.files) != 1 else ''}"
    print(f"{report.rows} trajectories ({what}) in {files} under {report.out}")
    return 0


@contextmanager
def _query_errors() -> Iterator[None]:
    """A DuckDB error in the user's query (bad column, syntax) as a one-line CliError, no traceback."""
    try:
        yield
    except Exception as err:
        if type(err).__module__.startswith(("duckdb", "_duckdb")):
            raise CliError(str(err).strip()) from None
        raise


def run_label(args: argparse.Namespace) -> int:
    from trajlake.store.labels import add_labels, default_author, label_rows
    from trajlake.store.lake import Lake

    lake = Lake(args.lake, create=False)
    config = args.LabelSettings
    ids = config.trajectory
    if config.sql:
        with _query_errors():
            found = lake.sql(f"select * from ({config.sql.strip().rstrip(';')}\n)")
        if "trajectory_id" not in found.column_names:
            raise CliError(
                f"--sql returns no trajectory_id column (it returns {', '.join(found.column_names)})"
            )
        ids = sorted(set(found.column("trajectory_id").to_pylist()) - {None})
    if not ids:
        raise CliError("--sql selected no trajectory: nothing to label")
    rows = label_rows(args.run_id, ids, config.key, None if config.clear else config.value,
                      config.author or default_author(), config.turn)  # fmt: skip
    add_labels(lake, rows)
    what = f"turn {config.turn} of " if config.turn is not None else ""
    done = "cleared" if config.clear else f"set to {config.value!r}"
    print(f"label {config.key!r} {done} on {what}{len(ids)} trajectories of run {args.run_id!r}")
    return 0


def run_search(args: argparse.Namespace) -> int:
    import json

    from trajlake.common.terminal import Progress, write_table
    from trajlake.store.lake import Lake
    from trajlake.store.search import SearchQuery, plan, search

    lake = Lake(args.lake)
    config = args.SearchSettings
    query = SearchQuery(args.run_id, config.regex, tuple(config.tokens) if config.tokens else None, config.scope,
                        config.limit, args.tokenizer)  # fmt: skip
    the_plan = plan(lake, query)
    print(f"searching {the_plan.tokens:,} {config.scope} tokens of run {args.run_id!r} in {len(the_plan.files)} "
          f"files: about {the_plan.estimate_s:.1f} s", file=sys.stderr)  # fmt: skip
    with Progress(the_plan.tokens, "search", unit="tokens") as bar:
        result = search(lake, query, the_plan, lambda done, total: bar.update(done - bar.n))
    versions = result.versions_table()
    if args.format == "json":
        print(json.dumps({"by_version": versions.to_pylist(), "hits": result.hits, "matches": result.matches,
                          "turns_hit": result.turns_hit, "trajectories_hit": result.trajectories_hit,
                          "tokens_read": result.tokens_read, "seconds": result.seconds}, default=str))  # fmt: skip
        return 0
    print("per policy version:")
    write_table(versions.column_names, [list(r.values()) for r in versions.to_pylist()], sys.stdout, "table")
    if result.hits:
        print(f"turns hit (the first {len(result.hits)} of {result.turns_hit:,}):")
        columns = list(result.hits[0])
        write_table(columns, [[h[c] for c in columns] for h in result.hits], sys.stdout, "table",
                    max_width=args.max_width)  # fmt: skip
    rate = result.tokens_read / result.seconds if result.seconds else 0
    print(f"{result.matches:,} matches in {result.turns_hit:,} turns of {result.trajectories_hit:,} trajectories; "
          f"read {result.tokens_read:,} tokens in {result.seconds:.2f} s ({rate / 1e6:.1f}M tokens/s)")  # fmt: skip
    return 0


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


def run_project(args: argparse.Namespace) -> int:
    """Catch the projections up (or follow `events` until a signal); print what was done as JSON."""
    import json
    import logging
    import math
    import signal
    import statistics
    import threading

    from trajlake.store.errors import ProjectorFenced
    from trajlake.store.lake import Lake
    from trajlake.store.projector import Projector

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    lake = Lake(args.lake)
    projector = Projector(lake, args.ProjectorConfig)
    code = 0
    try:
        stats = projector.run(follow=args.follow, stop=stop)
    except ProjectorFenced as err:
        print(f"trajlake project: {err}", file=sys.stderr)
        stats, code = projector.stats, 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    fresh = sorted(stats.freshness_s)
    print(
        json.dumps(
            {
                "events_version": lake.version("events"),
                "position": stats.position,
                "catch_ups": stats.catch_ups,
                "position_retries": stats.position_retries,
                "files_merged": stats.files_merged,
                "freshness_p50_s": statistics.median(fresh) if fresh else None,
                "freshness_p99_s": fresh[math.ceil(0.99 * len(fresh)) - 1] if fresh else None,
            }
        )
    )
    return code


def run_compact(args: argparse.Namespace) -> int:
    from trajlake.store.compact import compact
    from trajlake.store.errors import LakeError
    from trajlake.store.lake import Lake
    from trajlake.store.tables import TABLES

    lake = Lake(args.lake)
    try:
        from trajlake.common.terminal import Progress

        report = None
        with Progress(len(TABLES), "compact", unit="tables") as progress:
            for name in TABLES:
                part = compact(lake, [name], args.retention_hours, args.allow_short_retention, args.vacuum)
                report = part if report is None else _merge_reports(report, part)
                progress.update()
    except LakeError as err:
        raise CliError(str(err)) from None
    assert report is not None
    for name in report.files_removed:
        raced = report.files_raced.get(name, 0)
        print(
            f"{name}: {report.files_removed[name]} files merged into {report.files_added[name]}, "
            f"{report.vacuumed.get(name, 0)} files vacuumed"
            + (
                f", {raced} left as another writer rewrote them meanwhile (run compact again)"
                if raced
                else ""
            )
        )
    return 0


def _merge_reports(a: Any, b: Any) -> Any:
    a.files_removed.update(b.files_removed)
    a.files_added.update(b.files_added)
    a.vacuumed.update(b.vacuumed)
    a.files_raced.update(b.files_raced)
    return a
