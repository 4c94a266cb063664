"""`trajlake demo`: argument parsing only; the run itself lives in `trajlake.demo.recipe`."""

from __future__ import annotations

import argparse
import signal

from trajlake.cli import CliError, add_kafka_option, add_lake_option, env_default


def _bool_env(name: str, default: bool) -> bool:
    value = env_default(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `trajlake demo`."""
    p = subparsers.add_parser(
        "demo",
        help="a small async agent-RL run, end to end, that visibly learns",
        description="Play tool-use tasks with a tiny policy, stream the events through the bus into the lake, "
        "train from the lake with a staleness-bounded sampler, and print what changed.",
    )
    add_lake_option(p)
    p.add_argument(
        "--engine",
        choices=("tiny", "vllm"),
        default=env_default("ENGINE", "vllm"),
        help="vllm: a Qwen2 chat model served by a local vLLM server (installed once into a cached venv), its "
        "weights updated in place after every step; tiny: a GRU policy in each worker, no server "
        "(env TRAJLAKE_ENGINE; default %(default)s)",
    )
    p.add_argument(
        "--model-dir",
        default=env_default("MODEL"),
        help="--engine vllm: model directory to serve and train (env TRAJLAKE_MODEL; default <lake>/model, "
        "made by `trajlake model init` if missing)",
    )
    p.add_argument(
        "--vllm-url",
        default=env_default("VLLM_URL"),
        help="--engine vllm: a running server started by `trajlake vllm up` (env TRAJLAKE_VLLM_URL; "
        "default: start one for the run)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=int(env_default("STEPS", "40") or 40),
        help="trainer steps = policy versions (env TRAJLAKE_STEPS; default %(default)s)",
    )
    add_kafka_option(
        p, "use the Kafka broker at HOST:PORT instead of the in-process bus (env TRAJLAKE_KAFKA)"
    )
    p.add_argument(
        "--topic",
        default=env_default("TOPIC"),
        help="Kafka topic (env TRAJLAKE_TOPIC; default trajlake-demo-<run id>)",
    )
    p.add_argument(
        "--no-ray",
        dest="ray",
        action="store_false",
        default=_bool_env("RAY", True),
        help="rollout workers as threads instead of local Ray tasks (env TRAJLAKE_RAY=0)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=env_default("WORKERS"),
        help="rollout workers, episodes in flight (env TRAJLAKE_WORKERS; default 2 on tiny, 8 on vllm)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=int(env_default("SEED", "0") or 0),
        help="seed of weights, tasks, sampling and faults (env TRAJLAKE_SEED; default %(default)s)",
    )
    p.add_argument(
        "--run-id",
        default=env_default("RUN_ID"),
        help="run id (env TRAJLAKE_RUN_ID; default demo, or demo-<time> if the lake has a demo run)",
    )
    p.add_argument(
        "--overfit-tasks",
        type=int,
        default=int(env_default("OVERFIT_TASKS", "32") or 32),
        help="tasks in the overfit check, 0 to skip it (env TRAJLAKE_OVERFIT_TASKS; default %(default)s)",
    )
    p.add_argument(
        "--fault-rate",
        type=float,
        default=float(env_default("FAULT_RATE", "1") or 1),
        help="multiply every injected fault rate, 0 for none (env TRAJLAKE_FAULT_RATE; default %(default)s)",
    )
    p.add_argument(
        "--json",
        dest="json_path",
        default=env_default("JSON"),
        metavar="PATH",
        help="also write the summary as JSON to PATH (env TRAJLAKE_JSON)",
    )
    p.set_defaults(handler=handle)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def handle(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when it learned, 1 when it did not."""
    from pydantic import ValidationError

    from trajlake.demo.recipe import DemoConfig, run_demo, summary_json

    try:
        config = DemoConfig(
            lake=args.lake,
            engine=args.engine,
            model_dir=args.model_dir,
            vllm_url=args.vllm_url,
            steps=args.steps,
            kafka=args.kafka,
            topic=args.topic,
            ray=args.ray,
            workers=args.workers,
            seed=args.seed,
            run_id=args.run_id,
            overfit_tasks=args.overfit_tasks,
            fault_rate=args.fault_rate,
        )
    except ValidationError as err:
        problems = "; ".join(
            f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}" for e in err.errors()
        )
        raise CliError(f"invalid demo settings: {problems}") from None
    # a terminated demo unwinds like an interrupted one, so the vLLM server it started is stopped
    signal.signal(signal.SIGTERM, _interrupt)
    summary = run_demo(config)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(summary_json(summary))
    return 0 if summary["learned"] else 1
