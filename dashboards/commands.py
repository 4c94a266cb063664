"""CLI commands of the dashboards: `dashboard` (the Streamlit app) and `metrics` (its figures)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from trajlake.dashboards.config import AppSettings, ServeSettings, ThresholdSettings
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, LakeSettings, RunSettings, add_settings, env_name

APP = Path(__file__).with_name("app.py")
TABLE_COLUMNS = (
    "policy_version",
    "n_trajectories",
    "n_scored",
    "reward_mean",
    "pass_at_1",
    "rollout_entropy",
    "turns_per_trajectory",
    "assistant_tokens_per_turn",
    "tool_success_rate",
    "code_exec_ratio",
    "context_exhaustion_ratio",
    "nudge_rate",
    "n_system_failures",
    "n_model_failures",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dashboard` and `metrics`."""
    p = subparsers.add_parser(
        "dashboard", help="the Streamlit app: pass@k, entropy, behaviour, failures, async health"
    )
    add_settings(p, AppSettings)
    add_settings(p, ServeSettings)
    p.set_defaults(handler=run_dashboard)

    p = subparsers.add_parser("metrics", help="the dashboard's figures per policy version")
    add_settings(p, LakeSettings)
    add_settings(p, RunSettings)
    add_settings(p, FormatSettings)
    add_settings(p, ThresholdSettings)
    p.set_defaults(handler=run_metrics)


def _check_lake(root: str) -> None:
    if "://" not in root and not (Path(root) / "trajectories").is_dir():
        raise CliError(
            f"no lake with trajectories at {root}; pass --lake (or TRAJLAKE_LAKE), "
            f"or fill one with `trajlake loadgen --lake {root} --trajectories 200`"
        )


def streamlit_command(args: argparse.Namespace) -> list[str]:
    """The `streamlit run` command line for the app: headless, no usage stats, no file watcher."""
    return [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.address", args.host,
        "--server.port", str(args.port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "minimal",
        "--theme.base", "light",
    ]  # fmt: skip


def run_dashboard(args: argparse.Namespace) -> int:
    _check_lake(args.lake)
    app: AppSettings = args.AppSettings
    if app.tokenizer:
        from trajlake.store.tokenizer import TokenizerNotFound, find_decoder

        try:
            find_decoder(None, app.tokenizer)
        except TokenizerNotFound as err:
            raise CliError(f"{err}, or drop --tokenizer to use each run's recorded model") from None
        if Path(app.tokenizer).exists():  # the app runs elsewhere: a relative path would not resolve
            app = app.model_copy(update={"tokenizer": str(Path(app.tokenizer).resolve())})
    # the app reads its settings (AppSettings) from the environment the child inherits
    env = dict(os.environ)
    for name, value in app.model_dump().items():
        if value is not None:
            env[env_name(AppSettings, name)] = str(value)
    print(
        f"trajlake dashboard: serving {args.lake} on http://{args.host}:{args.port}",
        file=sys.stderr,
        flush=True,
    )
    child = subprocess.Popen(streamlit_command(args), env=env)

    def stop(signum: int, frame: Any) -> None:  # take the app down with us
        child.terminate()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        return child.wait()
    except KeyboardInterrupt:
        child.terminate()
        child.wait()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_metrics(args: argparse.Namespace) -> int:
    from trajlake.dashboards import metrics
    from trajlake.store.lake import Lake

    _check_lake(args.lake)
    lake = Lake(args.lake)
    runs = metrics.runs(lake)
    if args.run_id not in runs:
        raise CliError(f"run {args.run_id!r} is not in {args.lake}; runs there: {', '.join(runs) or 'none'}")
    report = metrics.metrics_report(lake, args.run_id, args.success_threshold)
    if args.format == "json":  # the whole report: the table's rows and pass@k
        print(json.dumps(report, indent=2, default=str))
        return 0
    from trajlake.schemas.terminal import write_table

    rows = [[v.get(c) for c in TABLE_COLUMNS] for v in report["versions"]]
    write_table(TABLE_COLUMNS, rows, sys.stdout, args.format, max_width=args.max_width, float_format=".4f")
    if args.format == "table":
        passk = "  ".join(f"pass@{k}={v:.4f}" for k, v in report["pass_at_k"].items())
        print(f"run {report['run_id']}: {passk or 'no scored trajectories'}")
    return 0
