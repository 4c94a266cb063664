"""CLI commands of the rollout toolkit: `import harbor|skyrl|agent-lightning|verifiers`, `doctor`, `rescore`,
`loadgen`."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from trajlake.common.settings import add_settings
from trajlake.ingest.config import KafkaConfig
from trajlake.rollout.config import (
    AgentLightningSettings,
    DoctorSettings,
    ImportSettings,
    LoadgenConfig,
    RescoreSettings,
)
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import (
    FormatSettings,
    KafkaSwitch,
    LakeSettings,
    PassSettings,
    RunSettings,
    uses_lake,
)
from trajlake.store.config import CatalogSettings, HealthSettings, TokenizerSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the rollout toolkit's commands."""
    p = subparsers.add_parser(
        "import",
        help="import other tools' rollouts (Harbor, SkyRL, Agent Lightning, verifiers) into the lake",
    )
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

    a = sources.add_parser(
        "agent-lightning",
        help="an Agent Lightning 1.0 server: each finished rollout once, resumable (--follow: live)",
    )
    add_settings(a, AgentLightningSettings, help={"server": "Agent Lightning server root"})
    add_settings(
        a, CatalogSettings, help={"catalog_url": "catalog that keeps the cursor; unset: SQLite in the lake"}
    )
    _common_import_options(a)
    a.set_defaults(handler=run_import_agent_lightning)

    v = sources.add_parser(
        "verifiers", help="finished vf-eval runs (verifiers 0.4 traces.jsonl): one trajectory per trace"
    )
    v.add_argument(
        "files", metavar="FILE", nargs="+", help="traces.jsonl files (or the run directories holding them)"
    )
    _common_import_options(v)
    v.set_defaults(handler=run_import_verifiers)

    d = subparsers.add_parser(
        "doctor",
        help="health report: system vs model failures, tools, nudges, drift, and learning-signal alerts",
    )
    add_settings(d, LakeSettings)
    add_settings(d, RunSettings, help={"run_id": "run id to check"})
    add_settings(d, DoctorSettings)
    add_settings(d, HealthSettings)
    add_settings(  # the report is text around tables: no CSV
        d,
        FormatSettings,
        choices={"format": ["table", "json"]},
        help={"format": "print the report as text with aligned tables, or as JSON"},
    )
    uses_lake(d, "read")
    d.set_defaults(handler=run_doctor)

    r = subparsers.add_parser(
        "rescore",
        help="judge stored trajectories again with a verifier; its rewards are appended with their version",
        description="Run a verifier on the run's finished trajectories as the lake holds them (turns, tool "
        "calls, final answer, artifacts) and append its rewards as reward events with a verifier_version. "
        "The rewards recorded before stay (table `rewards`); trajectories.reward becomes the latest. "
        "Trajectories this version scored already are skipped, so a stopped re-score can simply run again.",
    )
    add_settings(r, LakeSettings)
    uses_lake(r, "write")
    add_settings(r, RunSettings, help={"run_id": "the run to re-score"})
    add_settings(r, RescoreSettings)
    add_settings(
        r, PassSettings, help={"success_threshold": "a reward passes when >= this (the flips it reports)"}
    )
    add_settings(r, TokenizerSettings)
    add_settings(r, FormatSettings, choices={"format": ["table", "json"]},
                 help={"format": "print the report as text, or as JSON"})  # fmt: skip
    r.set_defaults(handler=run_rescore)

    p = subparsers.add_parser("loadgen", help="synthetic agent-RL workload through the bus")
    add_settings(p, LakeSettings)
    uses_lake(p, "write", unless="kafka")
    add_settings(p, LoadgenConfig, required=["trajectories"])
    add_settings(p, KafkaSwitch, help={"kafka": "produce to Apache Kafka instead of the in-process bus"})
    add_settings(p, KafkaConfig, ["topic"])
    p.add_argument("--json", action="store_true", help="print the counts produced as JSON")
    p.set_defaults(handler=run_loadgen)


def _common_import_options(p: argparse.ArgumentParser) -> None:
    add_settings(p, LakeSettings)
    uses_lake(p, "write")
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
    if report.stopped_by:
        print(
            f"trajlake import {report.source}: stopped by {report.stopped_by}; every trajectory it read is "
            "committed (what it had not read yet, the next run imports)",
            file=sys.stderr,
        )
    return 1 if report.dead_letters else 0


def _import(args: argparse.Namespace, importer: Any, source: Any, what: str, total: int | None = None) -> int:
    """Run a file importer (`importer(lake, source, run_id, progress=, policy_version=)`) and print its report."""
    from trajlake.common.terminal import Progress
    from trajlake.rollout.errors import ImportFormatError
    from trajlake.store.lake import Lake

    try:
        with Progress(total, what, unit=what.split()[-1]) as progress:
            report = importer(
                Lake(args.lake), source, args.run_id, progress=progress, policy_version=args.policy_version
            )
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _print_report(report, args.json)


def run_import_harbor(args: argparse.Namespace) -> int:
    from pathlib import Path

    from trajlake.rollout.errors import ImportFormatError
    from trajlake.rollout.importers.harbor import find_trials, import_harbor

    try:
        total = len(find_trials(Path(args.job_dir)))
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _import(args, import_harbor, args.job_dir, "harbor trials", total)


def run_import_skyrl(args: argparse.Namespace) -> int:
    from trajlake.rollout.importers.skyrl import import_skyrl

    return _import(args, import_skyrl, args.files, "skyrl trajectories")


def run_import_verifiers(args: argparse.Namespace) -> int:
    from trajlake.rollout.adapters.verifiers import import_verifiers

    return _import(args, import_verifiers, args.files, "verifiers traces")


def run_import_agent_lightning(args: argparse.Namespace) -> int:
    from trajlake.common.terminal import Progress
    from trajlake.ingest.shutdown import StopRequested
    from trajlake.rollout.adapters.agent_lightning import AgentLightningError, import_agent_lightning
    from trajlake.store.lake import Lake

    config = args.AgentLightningSettings
    # a follower runs under a supervisor: a line every interval (on a pipe too), even while idle
    every_s = config.progress_interval_s if config.follow else 5.0
    if config.follow:
        print(
            f"trajlake import agent-lightning: following {config.server} into run {args.run_id!r} "
            f"(a progress line every {every_s:g} s; SIGTERM or Ctrl-C stops it after committing)",
            file=sys.stderr,
            flush=True,
        )
    try:
        with Progress(None, "agent-lightning rollouts", unit="rollouts", every_s=every_s) as progress:
            report = import_agent_lightning(
                Lake(args.lake),
                config,
                args.run_id,
                catalog_url=args.catalog_url,
                on_rollout=lambda _: progress.update(1),
                on_poll=lambda: progress.update(0),
                policy_version=args.policy_version,
            )
    except AgentLightningError as err:
        raise CliError(str(err)) from None
    except StopRequested as stop:  # before the poller started: nothing was read
        print(
            f"trajlake import agent-lightning: stopped by {stop.name} before reading the server",
            file=sys.stderr,
        )
        return 0 if config.follow else stop.exit_code
    code = _print_report(report, args.json)
    if report.stopped_by and not config.follow:  # a one-off import cut short; SIGTERM is how a follower ends
        return code or 128 + signal.Signals[report.stopped_by].value
    return code


def run_doctor(args: argparse.Namespace) -> int:
    from trajlake.common.terminal import table_width
    from trajlake.rollout.doctor import diagnose, render, render_json
    from trajlake.store.lake import Lake

    report = diagnose(
        Lake(args.lake), args.run_id, args.max_system_error_rate, args.HealthSettings, args.tokenizer
    )
    width = table_width(sys.stdout, args.max_width)
    print(render_json(report) if args.format == "json" else render(report, width))
    if not report.totals.get("trajectories"):
        return 2
    return 0 if report.healthy else 1


FLIPS_SHOWN = 50
"""Flipped trajectories `trajlake rescore` lists (the JSON report has them all)."""


def run_rescore(args: argparse.Namespace) -> int:
    from trajlake.common.terminal import Progress, write_table
    from trajlake.rollout.rescore import rescore
    from trajlake.store.lake import Lake

    lake = Lake(args.lake, create=False)
    bar: list[Progress] = []

    def progress(done: int, total: int) -> None:
        if not bar:
            bar.append(Progress(total, "rescore", unit="trajectories"))
        bar[0].update(1)

    try:
        report = rescore(lake, args.run_id, args.RescoreSettings, threshold=args.success_threshold,
                         tokenizer=args.tokenizer, progress=progress)  # fmt: skip
    finally:
        if bar:
            bar[0].close()
    if args.format == "json":
        print(json.dumps(report.as_dict()))
        return 1 if report.dead_letters else 0
    print(
        f"rescored {report.scored + report.errors} of {report.selected} trajectories of run {report.run_id!r} with "
        f"{report.verifier} as version {report.verifier_version!r} ({report.skipped} already scored by it): "
        f"{report.scored} scored, {report.errors} verifier errors, {report.changed} rewards changed"
    )
    print(
        f"pass/fail at reward >= {report.threshold:g}: {report.fail_to_pass} fail -> pass, {report.pass_to_fail} "
        f"pass -> fail, {report.newly_scored} scored that had no valid reward"
    )
    if report.flips:
        print(f"flipped (the first {min(len(report.flips), FLIPS_SHOWN)} of {len(report.flips)}):")
        rows = [
            [f["trajectory_id"], f["task_id"], f["before"], f["after"]] for f in report.flips[:FLIPS_SHOWN]
        ]
        write_table(["trajectory_id", "task_id", "before", "after"], rows, sys.stdout, "table")
    for example in report.error_examples:
        print(f"verifier error: {example}", file=sys.stderr)
    return 1 if report.dead_letters else 0


def run_loadgen(args: argparse.Namespace) -> int:
    from trajlake.common.terminal import Progress
    from trajlake.ingest import shutdown
    from trajlake.ingest.bus import setup_bus, setup_publisher
    from trajlake.rollout.loadgen import generate

    config = args.LoadgenConfig
    sink_thread = None
    if args.kafka:
        bus = setup_publisher("kafka", bootstrap=args.kafka, topic=args.topic)  # a producer: no consumer
    else:  # the embedded bus lives in this process, and so does its sink
        from trajlake.ingest.sink import DeltaSink, SinkThread
        from trajlake.store.lake import Lake

        bus = setup_bus("inprocess")  # a topic of its own: in-process offsets restart in every process
        sink_thread = SinkThread(DeltaSink(Lake(args.lake), bus))
    with Progress(config.trajectories, "loadgen", unit="traj") as progress:
        counts = generate(bus, config, on_trajectory=lambda _: progress.update())
    with shutdown.deferred():  # what was generated reaches the lake or the topic (or the spool), then a stop
        if sink_thread is not None:
            sink_thread.stop(drain=True)
        bus.close()
        result: dict[str, object] = {
            "events": counts.events,
            "trajectories": counts.trajectories,
            "turns": counts.turns,
            "tokens": counts.tokens,
        }
        left = bus.spool_stats()
        undelivered = left.messages
        if args.kafka:
            result["undelivered_messages"] = undelivered
        if counts.stopped:
            result["stopped_by"] = counts.stopped.name
        where = f"Kafka topic {args.topic} at {args.kafka}" if args.kafka else args.lake
        if args.json:
            print(json.dumps(result))
        else:
            verb, to = ("generated", "for") if undelivered else ("wrote", "to")
            print(
                f"{verb} {counts.events} events, {counts.trajectories} trajectories, {counts.tokens} tokens {to} {where}"
            )
        if counts.stopped:
            print(
                f"trajlake loadgen: stopped by {counts.stopped.name} after {counts.trajectories:,} of "
                f"{config.trajectories:,} trajectories; flushed all it had generated to {where}"
                + (" (but for the spooled messages below)" if undelivered else ""),
                file=sys.stderr,
            )
        if undelivered:
            from trajlake.ingest.bus.kafka_admin import cluster_state

            print(
                f"trajlake loadgen: {undelivered} messages did not reach Kafka at {args.kafka} "
                f"({cluster_state(bus.config)}); they wait in {left.directory}, and the next producer of "
                f"topic {bus.topic} delivers them",
                file=sys.stderr,
            )
    if counts.stopped:
        return counts.stopped.exit_code
    return 1 if undelivered else 0
