"""CLI commands of the trainer: `ablate`, `select-overfit` and `train`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from trajlake.common.settings import add_settings, settings_error
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import FormatSettings, LakeSettings, RunSettings, uses_lake
from trajlake.store.config import CatalogSettings
from trajlake.trainer.config import (
    AblateOutput,
    AblationConfig,
    OverfitSettings,
    TrainerConfig,
    TrainSettings,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ablate`, `select-overfit` and `train`."""
    p = subparsers.add_parser(
        "ablate", help="offline loss ablation: replay a run's data through loss configurations"
    )
    add_settings(p, LakeSettings)
    add_settings(
        p,
        AblationConfig,
        [
            "run_id",
            "aggregations",
            "policy_losses",
            "steps",
            "seeds",
            "groups_per_batch",
            "train",
            "verifier_version",
            "verify_step",
        ],
    )
    add_settings(p, CatalogSettings)
    add_settings(p, AblateOutput)
    add_settings(p, FormatSettings)
    uses_lake(p, "read")
    p.set_defaults(handler=run_ablate)

    p = subparsers.add_parser(
        "select-overfit", help="tasks with non-zero reward variance, to prove learnability first"
    )
    add_settings(p, LakeSettings)
    add_settings(p, RunSettings)
    add_settings(p, OverfitSettings)
    add_settings(p, FormatSettings)
    uses_lake(p, "read")
    p.set_defaults(handler=run_select_overfit)

    p = subparsers.add_parser("train", help="the reference CPU trainer on a run's data (tiny policy)")
    add_train_options(p)
    p.set_defaults(handler=run_train)


def add_train_options(p: argparse.ArgumentParser) -> None:
    """The options of `trajlake train`."""
    add_settings(p, TrainSettings)
    add_settings(p, TrainerConfig, ["steps", "rank"])
    uses_lake(p, "update")  # trainer_steps, batch_consumption


def run_ablate(args: argparse.Namespace) -> int:
    """Replay, print the table, optionally write JSON; with --verify-step, check one step (exit 1: it does not reproduce)."""
    from trajlake.store.lake import Lake
    from trajlake.trainer import ablate, verify

    config = args.AblationConfig
    checking = config.verify_step is not None
    lake = Lake(args.lake)
    try:
        if checking:
            # the rewards the run trained on, unless --verifier-version names others
            given = config.verifier_version if "verifier_version" in config.model_fields_set else None
            report = verify.verify_step(lake, config.run_id, config.verify_step, args.catalog_url, given)
        else:
            report = ablate.run_ablation(lake, config, catalog_url=args.catalog_url)
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
    except ValueError as err:
        raise CliError(str(err)) from None
    finally:
        lake.close()
    if checking:
        head = [verify.title(report), *(f"note: {n}" for n in report["notes"])]
        write_report(args, report, head, verify.table(report), [verify.verdict(report)])
        if not report["reproduces"]:
            print(f"trajlake ablate: {verify.verdict(report)}", file=sys.stderr)
            return 1
        return 0
    head = [ablate.title(report), *ablate.notes(report)]
    write_report(args, report, head, ablate.summary(report, text=args.format == "table"))
    return 0


def write_report(
    args: argparse.Namespace,
    report: dict[str, Any],
    head: list[str],
    table: tuple[list[str], list[list[Any]]],
    foot: list[str] | None = None,
) -> None:
    """The report as JSON, or its table (framed by `head` and `foot` lines as a text table); and --json PATH."""
    from trajlake.common.terminal import write_table

    if args.format == "json":
        print(json.dumps(report))
    else:
        for line in head if args.format == "table" else []:
            print(line)
        write_table(*table, sys.stdout, args.format, max_width=args.max_width)
        for line in (foot or []) if args.format == "table" else []:
            print(line)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(report, fh, indent=2)


def run_select_overfit(args: argparse.Namespace) -> int:
    """Print the tasks; exit 1 when fewer than --n qualify."""
    from trajlake.store.lake import Lake
    from trajlake.trainer.overfit import select_overfit

    lake = Lake(args.lake)
    try:
        tasks = select_overfit(lake, args.run_id, args.n, args.min_samples)
    finally:
        lake.close()
    if args.format == "json":
        print(json.dumps(tasks, default=str))
    else:
        from trajlake.common.terminal import write_table

        columns = ("task_id", "n_samples", "n_groups", "reward_mean", "reward_std")
        rows = [[t[c] for c in columns] for t in tasks]
        write_table(columns, rows, sys.stdout, args.format, max_width=args.max_width, float_format=".3f")
    if len(tasks) < args.n:
        print(
            f"trajlake select-overfit: only {len(tasks)} of {args.n} tasks in run {args.run_id!r} have non-zero reward "
            f"variance over >= {args.min_samples} valid samples; record more samples per task or lower --n",
            file=sys.stderr,
        )
        return 1
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Run the reference trainer on the resolved settings."""
    from trajlake.trainer.reference import train

    try:
        extra = json.loads(args.trainer_config) if args.trainer_config else {}
        if not isinstance(extra, dict):
            raise ValueError("not an object")
        config = TrainerConfig.from_env(
            **{**extra, "run_id": args.run_id, "steps": args.steps, "rank": args.rank}
        )
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
    except ValueError as err:
        raise CliError(
            f"--config (TRAJLAKE_TRAINER_CONFIG) must be a JSON object of TrainerConfig fields: {err}"
        ) from None
    return train(args.lake, config, catalog_url=args.catalog_url, wait_s=args.wait_s)
