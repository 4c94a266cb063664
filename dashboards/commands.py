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

from trajlake.common.settings import add_settings, env_name
from trajlake.dashboards.config import AppSettings, CompareSettings, ServeSettings, ThresholdSettings
from trajlake.dashboards.passk import curve_text
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, LakeSettings, RunSettings, uses_lake

APP = Path(__file__).with_name("app.py")
TABLE_COLUMNS = (
    "policy_version",
    "n_trajectories",
    "n_scored",
    "reward_mean",
    "n_tasks",
    "pass_at_1",
    "rollout_entropy",
    "turns_per_trajectory",
    "assistant_tokens_per_turn",
    "tool_success_rate",
    "code_exec_ratio",
    "context_exhaustion_ratio",
    "nudge_rate",
    "latency_s_p50",
    "latency_s_p99",
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
    uses_lake(p, "read")
    p.set_defaults(handler=run_dashboard)

    p = subparsers.add_parser(
        "metrics", help="the dashboard's figures per policy version, of one run or several side by side"
    )
    add_settings(p, LakeSettings)
    add_settings(p, RunSettings, optional=True)  # or --runs: `check_runs` wants exactly one
    add_settings(p, CompareSettings)
    add_settings(p, FormatSettings)
    add_settings(p, ThresholdSettings)
    uses_lake(p, "read")
    p.set_defaults(handler=run_metrics)


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


def check_runs(run_id: str | None, compare: CompareSettings, runs: list[str], root: str) -> None:
    """Exactly one of --run and --runs, naming runs of the lake (`runs`); else a CliError with the fix."""
    there = f"runs there: {', '.join(runs) or 'none'}"
    envs = f"{env_name(RunSettings, 'run_id')} / {env_name(CompareSettings, 'run_ids')}"
    how = "--run RUN for one run's figures, or --runs A,B,... to compare runs"
    if run_id and compare.run_ids:
        raise CliError(
            f"pass --run or --runs, not both (got run {run_id!r} and runs {','.join(compare.run_ids)!r}, "
            f"from the options or {envs}): {how}"
        )
    if not run_id and not compare.run_ids:
        raise CliError(f"say which runs: {how} (or set {envs}); {there}")
    if run_id and compare.by == "step":
        raise CliError(f"--by step needs --runs; pass --runs {run_id} --by step for this run's steps")
    unknown = [r for r in compare.run_ids or [run_id] if r not in runs]
    if len(unknown) == 1:
        raise CliError(f"run {unknown[0]!r} is not in {root}; {there}")
    if unknown:
        raise CliError(f"runs {', '.join(map(repr, unknown))} are not in {root}; {there}")


def run_metrics(args: argparse.Namespace) -> int:
    from trajlake.dashboards import metrics
    from trajlake.store.lake import Lake

    lake = Lake(args.lake)
    check_runs(args.run_id, args.CompareSettings, metrics.runs(lake), args.lake)
    if args.run_ids:
        return print_comparison(lake, args)
    report = metrics.metrics_report(lake, args.run_id, args.success_threshold, args.min_tasks)
    if args.format == "json":  # the whole report: the table's rows and pass@k
        print(json.dumps(report, indent=2, default=str))
        return 0
    from trajlake.common.terminal import write_table

    rows = [[v.get(c) for c in TABLE_COLUMNS] for v in report["versions"]]
    write_table(TABLE_COLUMNS, rows, sys.stdout, args.format, max_width=args.max_width, float_format=".4f")
    if args.format == "table":
        if report["zero_signal_groups"]:
            print(zero_signal_line(report["zero_signal_groups"]))
        print(f"run {report['run_id']}: {curve_text(report['pass_at_k'], args.min_tasks)}")
    return 0


def print_comparison(lake: Any, args: argparse.Namespace) -> int:
    """`trajlake metrics --runs`: the runs' figures by policy version or step, one row per run and x."""
    from trajlake.dashboards import compare

    report = compare.comparison_report(lake, args.run_ids, args.success_threshold, args.min_tasks)
    if args.format == "json":  # the whole comparison: per run, by version, by step, pass@k
        print(json.dumps(report, indent=2, default=str))
        return 0
    from trajlake.common.terminal import write_table

    by_version = args.by == "version"
    columns = (compare.VERSION_SCHEMA if by_version else compare.STEP_SCHEMA).names
    rows = [[r[c] for c in columns] for r in report["by_version" if by_version else "by_step"]]
    write_table(columns, rows, sys.stdout, args.format, max_width=args.max_width, float_format=".4f")
    if args.format == "table":
        for run_id in report["run_ids"]:
            curve = [r for r in report["pass_at_k"] if r["run_id"] == run_id]
            steps = next(r["trainer_steps"] for r in report["summary"] if r["run_id"] == run_id)
            print(f"run {run_id}: {curve_text(curve, args.min_tasks)}; {steps} trainer steps")
    return 0


def zero_signal_line(steps: list[dict[str, Any]]) -> str:
    """One line on the trainer steps' zero-signal groups: over the run, and at the latest step."""
    zero, groups = sum(r["n_zero_signal_groups"] for r in steps), sum(r["n_groups"] for r in steps)
    last = steps[-1]
    return (
        f"zero-signal groups (all rewards equal): {zero} of {groups} consumed ({zero / groups:.1%}) "
        f"over {len(steps)} steps; step {last['step']}: {last['n_zero_signal_groups']} of {last['n_groups']} "
        "(per step: --format json)"
    )
