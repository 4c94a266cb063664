"""CLI commands of the lake: `sql`, `export`, `rebuild`, `compact`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, LakeSettings, add_settings
from trajlake.store.config import CompactSettings, ExportSettings, TokenizerSettings


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
    p.add_argument(
        "query", help='one SELECT statement, e.g. "select status, count(*) from trajectories group by 1"'
    )
    p.set_defaults(handler=run_sql)

    p = subparsers.add_parser(
        "export", help="write the trajectories a query selects (tokens, masks, chat text) for SFT or datasets"
    )
    add_settings(p, LakeSettings)
    add_settings(p, ExportSettings)
    p.set_defaults(handler=run_export)

    p = subparsers.add_parser("rebuild", help="recreate the projections from `events`")
    add_settings(p, LakeSettings)
    p.set_defaults(handler=run_rebuild)

    p = subparsers.add_parser("compact", help="optimize + vacuum every table, with a retention guard")
    add_settings(p, LakeSettings)
    add_settings(p, CompactSettings)
    p.set_defaults(handler=run_compact)


def run_sql(args: argparse.Namespace) -> int:
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    lake.query_engine().tokenizer = args.tokenizer
    with _query_errors():  # a model with no tokenizer here is a TokenizerNotFound naming --tokenizer
        table = lake.sql(args.query)
    from trajlake.schemas.terminal import write_table

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
        from trajlake.schemas.terminal import Progress

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
