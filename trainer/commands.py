"""CLI commands of the trainer: `ablate`, `select-overfit` and `train`."""

from __future__ import annotations

import argparse
import json
import sys

from trajlake.cli import (
    CliError,
    add_lake_option,
    add_run_option,
    add_table_options,
    env_default,
    settings_error,
)


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `ablate`, `select-overfit` and `train`."""
    p = subparsers.add_parser(
        "ablate", help="offline loss ablation: replay a run's data through loss configurations"
    )
    add_lake_option(p)
    add_run_option(p)
    p.add_argument(
        "--aggregation",
        type=_csv,
        default=_csv(env_default("AGGREGATION", "token_mean,sequence_mean,prompt_mean") or ""),
        help="comma-separated aggregation modes (env TRAJLAKE_AGGREGATION; default all three)",
    )
    p.add_argument(
        "--policy-loss",
        type=_csv,
        default=_csv(env_default("POLICY_LOSS", "ppo,dppo,glm5") or ""),
        help="comma-separated policy losses: ppo, dppo, dppo_kl, glm5, tis (env TRAJLAKE_POLICY_LOSS)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=int(env_default("STEPS", "2") or 2),
        help="batches to replay (env TRAJLAKE_STEPS)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=int(env_default("SEEDS", "3") or 3),
        help="seeds per configuration (env TRAJLAKE_SEEDS)",
    )
    p.add_argument(
        "--groups-per-batch",
        type=int,
        default=int(env_default("GROUPS_PER_BATCH", "4") or 4),
        help="prompt groups per batch (env TRAJLAKE_GROUPS_PER_BATCH)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        default=env_default("TRAIN", "") not in ("", "0", "false"),
        help="take optimiser steps (else evaluate the losses only) (env TRAJLAKE_TRAIN)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=env_default("JSON"),
        help="also write the report as JSON (env TRAJLAKE_JSON)",
    )
    p.set_defaults(handler=run_ablate)

    p = subparsers.add_parser(
        "select-overfit", help="tasks with non-zero reward variance, to prove learnability first"
    )
    add_lake_option(p)
    add_run_option(p)
    p.add_argument(
        "--n",
        type=int,
        default=int(env_default("N", "32") or 32),
        help="tasks wanted (env TRAJLAKE_N; default 32)",
    )
    p.add_argument(
        "--min-samples",
        type=int,
        default=int(env_default("MIN_SAMPLES", "2") or 2),
        help="samples a task needs (env TRAJLAKE_MIN_SAMPLES; default 2)",
    )
    add_table_options(p)
    p.set_defaults(handler=run_select_overfit)

    p = subparsers.add_parser("train", help="the reference CPU trainer on a run's data (tiny policy)")
    add_lake_option(p)
    add_run_option(p)
    p.add_argument(
        "--steps",
        type=int,
        default=int(env_default("STEPS", "10") or 10),
        help="optimiser steps (env TRAJLAKE_STEPS)",
    )
    p.add_argument(
        "--rank",
        type=int,
        default=int(env_default("RANK", "0") or 0),
        help="trainer rank (env TRAJLAKE_RANK)",
    )
    p.add_argument(
        "--catalog",
        default=env_default("CATALOG_URL"),
        help="catalog URL, e.g. postgresql+psycopg://… (env TRAJLAKE_CATALOG_URL; default SQLite in the lake)",
    )
    p.add_argument(
        "--wait",
        type=float,
        default=float(env_default("WAIT_S", "0") or 0),
        help="seconds to wait for a batch before stopping (env TRAJLAKE_WAIT_S)",
    )
    p.add_argument(
        "--config",
        default=env_default("TRAINER_CONFIG"),
        help="JSON of TrainerConfig fields (env TRAJLAKE_TRAINER_CONFIG)",
    )
    p.set_defaults(handler=run_train)


def run_ablate(args: argparse.Namespace) -> int:
    """Replay, print the table, optionally write JSON."""
    from pydantic import ValidationError

    from trajlake.store.lake import Lake
    from trajlake.trainer.ablate import AblationConfig, format_table, run_ablation

    try:
        config = AblationConfig(
            run_id=args.run, aggregations=args.aggregation, policy_losses=args.policy_loss, steps=args.steps,
            seeds=args.seeds, train=args.train, groups_per_batch=args.groups_per_batch,
        )  # fmt: skip
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
    lake = Lake(args.lake)
    try:
        report = run_ablation(lake, config)
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
    except ValueError as err:
        raise CliError(str(err)) from None
    finally:
        lake.close()
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


def run_select_overfit(args: argparse.Namespace) -> int:
    """Print the tasks; exit 1 when fewer than --n qualify."""
    from trajlake.store.lake import Lake
    from trajlake.trainer.overfit import select_overfit

    lake = Lake(args.lake)
    try:
        tasks = select_overfit(lake, args.run, args.n, args.min_samples)
    finally:
        lake.close()
    if args.format == "json":
        print(json.dumps(tasks, default=str))
    else:
        from trajlake.schemas.terminal import write_table

        columns = ("task_id", "n_samples", "n_groups", "reward_mean", "reward_std")
        rows = [[t[c] for c in columns] for t in tasks]
        write_table(columns, rows, sys.stdout, args.format, max_width=args.max_width, float_format=".3f")
    if len(tasks) < args.n:
        print(
            f"trajlake select-overfit: only {len(tasks)} of {args.n} tasks in run {args.run!r} have non-zero reward "
            f"variance over >= {args.min_samples} valid samples; record more samples per task or lower --n",
            file=sys.stderr,
        )
        return 1
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Run the reference trainer."""
    from pydantic import ValidationError

    from trajlake.trainer.reference import main

    argv = [
        "--lake",
        args.lake,
        "--run",
        args.run,
        "--steps",
        str(args.steps),
        "--rank",
        str(args.rank),
        "--wait",
        str(args.wait),
    ]
    if args.catalog:
        argv += ["--catalog", args.catalog]
    if args.config:
        argv += ["--config", args.config]
    try:
        return main(argv)
    except ValidationError as err:
        raise CliError(settings_error(err)) from None
    except json.JSONDecodeError as err:
        raise CliError(f"--config must be a JSON object of TrainerConfig fields: {err}") from None
