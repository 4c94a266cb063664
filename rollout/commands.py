"""CLI commands of the rollout toolkit: `import harbor`, `import skyrl`, `doctor`."""

from __future__ import annotations

import argparse
import json
import sys

from trajlake.cli import CliError, add_lake_option, add_run_option, env_default


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the rollout toolkit's commands."""
    p = subparsers.add_parser("import", help="import other tools' rollouts (Harbor, SkyRL) into the lake")
    sources = p.add_subparsers(dest="source", metavar="SOURCE", required=True)

    h = sources.add_parser("harbor", help="a Harbor job directory: one trajectory per trial")
    h.add_argument(
        "job_dir", metavar="JOB_DIR", help="Harbor job directory (jobs/<job-name>), or one trial directory"
    )
    _common_import_options(h)
    h.set_defaults(handler=run_import_harbor)

    s = sources.add_parser("skyrl", help="SkyRL GeneratorOutput dumps (.json, .jsonl, .pkl)")
    s.add_argument("files", metavar="FILE", nargs="+", help="dump files")
    _common_import_options(s)
    s.set_defaults(handler=run_import_skyrl)

    d = subparsers.add_parser(
        "doctor", help="dry-run health report: system vs model failures, tools, nudges, drift"
    )
    add_lake_option(d)
    add_run_option(d, help="run id to check (env TRAJLAKE_RUN)")
    d.add_argument(
        "--max-system-error-rate",
        type=float,
        default=float(env_default("MAX_SYSTEM_ERROR_RATE", "0.05") or 0.05),
        help="exit 1 when the share of system failures is above this (env TRAJLAKE_MAX_SYSTEM_ERROR_RATE; "
        "default %(default)s)",
    )
    d.add_argument(
        "--format",
        choices=("text", "json"),
        default=env_default("DOCTOR_FORMAT", "text"),
        help="output format (env TRAJLAKE_DOCTOR_FORMAT; default %(default)s)",
    )
    d.set_defaults(handler=run_doctor)


def _common_import_options(p: argparse.ArgumentParser) -> None:
    add_lake_option(p)
    p.add_argument(
        "--run-id",
        default=env_default("RUN_ID"),
        required=env_default("RUN_ID") is None,
        help="run id the trajectories are stored under (env TRAJLAKE_RUN_ID)",
    )
    p.add_argument("--json", action="store_true", help="print the import report as JSON")


def _print_report(report, as_json: bool) -> int:
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        print(
            f"imported {report.trajectories} trajectories ({report.turns} turns, {report.tool_calls} tool calls, "
            f"{report.events} events) into run {report.run_id!r}; {report.skipped_existing} already there; "
            f"{report.dead_letters} dead letters"
        )
        for warning in report.warnings[:20]:
            print(f"warning: {warning}", file=sys.stderr)
        if len(report.warnings) > 20:
            print(f"warning: ... and {len(report.warnings) - 20} more", file=sys.stderr)
    return 1 if report.dead_letters else 0


def run_import_harbor(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trajlake.rollout.errors import ImportFormatError
    from trajlake.rollout.importers.harbor import find_trials, import_harbor
    from trajlake.schemas.terminal import Progress
    from trajlake.store.lake import Lake

    try:
        total = len(find_trials(Path(args.job_dir)))
        with Progress(total, "harbor trials", unit="trials") as progress:
            report = import_harbor(Lake(args.lake), args.job_dir, args.run_id, progress=progress)
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _print_report(report, args.json)


def run_import_skyrl(args: argparse.Namespace) -> int:
    from trajlake.rollout.errors import ImportFormatError
    from trajlake.rollout.importers.skyrl import import_skyrl
    from trajlake.schemas.terminal import Progress
    from trajlake.store.lake import Lake

    try:
        with Progress(None, "skyrl trajectories", unit="trajectories") as progress:
            report = import_skyrl(Lake(args.lake), args.files, args.run_id, progress=progress)
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _print_report(report, args.json)


def run_doctor(args: argparse.Namespace) -> int:
    from trajlake.rollout.doctor import diagnose, render, render_json
    from trajlake.store.lake import Lake

    if not 0 <= args.max_system_error_rate <= 1:
        raise CliError(
            f"--max-system-error-rate must be in [0, 1] (got {args.max_system_error_rate}); "
            "set TRAJLAKE_MAX_SYSTEM_ERROR_RATE"
        )
    report = diagnose(Lake(args.lake), args.run, args.max_system_error_rate)
    print(render_json(report) if args.format == "json" else render(report))
    if not report.totals.get("trajectories"):
        return 2
    return 0 if report.healthy else 1
