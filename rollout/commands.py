"""CLI commands of the rollout toolkit: `import harbor`, `import skyrl`, `doctor`."""

from __future__ import annotations

import argparse
import json
import sys

from trajlake.cli import CliError
from trajlake.rollout.config import DoctorSettings, ImportSettings
from trajlake.schemas.settings import LakeSettings, RunSettings, add_settings


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
    add_settings(d, LakeSettings)
    add_settings(d, RunSettings, help={"run_id": "run id to check"})
    add_settings(d, DoctorSettings)
    d.set_defaults(handler=run_doctor)


def _common_import_options(p: argparse.ArgumentParser) -> None:
    add_settings(p, LakeSettings)
    add_settings(p, ImportSettings)
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

    from trajlake.progress import Progress
    from trajlake.rollout.errors import ImportFormatError
    from trajlake.rollout.importers.harbor import find_trials, import_harbor
    from trajlake.store.lake import Lake

    try:
        total = len(find_trials(Path(args.job_dir)))
        with Progress(total, "harbor trials", unit="trials") as progress:
            report = import_harbor(Lake(args.lake), args.job_dir, args.run_id, progress=progress)
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _print_report(report, args.json)


def run_import_skyrl(args: argparse.Namespace) -> int:
    from trajlake.progress import Progress
    from trajlake.rollout.errors import ImportFormatError
    from trajlake.rollout.importers.skyrl import import_skyrl
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

    report = diagnose(Lake(args.lake), args.run_id, args.max_system_error_rate)
    print(render_json(report) if args.format == "json" else render(report))
    if not report.totals.get("trajectories"):
        return 2
    return 0 if report.healthy else 1
