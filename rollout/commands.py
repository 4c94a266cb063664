"""CLI commands of the rollout toolkit: `import harbor|skyrl|agent-lightning|verifiers`, `doctor`, `loadgen`."""

from __future__ import annotations

import argparse
import json
import sys

from trajlake.ingest.config import KafkaConfig
from trajlake.rollout.config import AgentLightningSettings, DoctorSettings, ImportSettings, LoadgenConfig
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, KafkaSwitch, LakeSettings, RunSettings, add_settings
from trajlake.store.config import CatalogSettings, HealthSettings


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
    add_settings(d, FormatSettings, ["max_width"])
    d.set_defaults(handler=run_doctor)

    p = subparsers.add_parser("loadgen", help="synthetic agent-RL workload through the bus")
    add_settings(p, LakeSettings)
    add_settings(p, LoadgenConfig, required=["trajectories"])
    add_settings(p, KafkaSwitch, help={"kafka": "produce to Apache Kafka instead of the in-process bus"})
    add_settings(p, KafkaConfig, ["topic"])
    p.add_argument("--json", action="store_true", help="print the counts produced as JSON")
    p.set_defaults(handler=run_loadgen)


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


def run_import_verifiers(args: argparse.Namespace) -> int:
    from trajlake.rollout.adapters.verifiers import import_verifiers
    from trajlake.rollout.errors import ImportFormatError
    from trajlake.schemas.terminal import Progress
    from trajlake.store.lake import Lake

    try:
        with Progress(None, "verifiers traces", unit="traces") as progress:
            report = import_verifiers(Lake(args.lake), args.files, args.run_id, progress=progress)
    except ImportFormatError as err:
        raise CliError(str(err)) from None
    return _print_report(report, args.json)


def run_import_agent_lightning(args: argparse.Namespace) -> int:
    from trajlake.rollout.adapters.agent_lightning import AgentLightningError, import_agent_lightning
    from trajlake.schemas.terminal import Progress
    from trajlake.store.lake import Lake

    try:
        with Progress(None, "agent-lightning rollouts", unit="rollouts") as progress:
            report = import_agent_lightning(
                Lake(args.lake),
                args.AgentLightningSettings,
                args.run_id,
                catalog_url=args.catalog_url,
                on_rollout=lambda _: progress.update(1),
            )
    except AgentLightningError as err:
        raise CliError(str(err)) from None
    except KeyboardInterrupt:  # --follow ends here; every page before this one is committed
        return 130
    return _print_report(report, args.json)


def run_doctor(args: argparse.Namespace) -> int:
    from trajlake.rollout.doctor import diagnose, render, render_json
    from trajlake.schemas.terminal import table_width
    from trajlake.store.lake import Lake

    report = diagnose(
        Lake(args.lake), args.run_id, args.max_system_error_rate, args.HealthSettings, args.tokenizer
    )
    width = table_width(sys.stdout, args.max_width)
    print(render_json(report) if args.format == "json" else render(report, width))
    if not report.totals.get("trajectories"):
        return 2
    return 0 if report.healthy else 1


def run_loadgen(args: argparse.Namespace) -> int:
    from trajlake.ingest.bus import setup_bus
    from trajlake.rollout.loadgen import generate
    from trajlake.schemas.terminal import Progress

    config = args.LoadgenConfig
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
