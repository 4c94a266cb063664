"""`trajlake demo`: argument parsing only (options from `DemoConfig`); the run itself lives in `trajlake.demo.recipe`."""

from __future__ import annotations

import argparse
import signal

from pydantic import Field

from trajlake.demo.config import DemoConfig
from trajlake.schemas.settings import Settings, add_settings, cli

OPTIONS = ["lake", "engine", "model_dir", "vllm_url", "steps", "kafka", "topic", "ray", "workers", "seed", "run_id",
           "overfit_tasks", "fault_rate"]  # fmt: skip


class DemoOutput(Settings):
    """Where the demo's summary goes besides the terminal."""

    json_path: str | None = Field(
        None,
        validation_alias="TRAJLAKE_DEMO_JSON",
        description="also write the summary as JSON to PATH",
        json_schema_extra=cli("--json", metavar="PATH"),
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `trajlake demo`."""
    p = subparsers.add_parser(
        "demo",
        help="a small async agent-RL run, end to end, that visibly learns",
        description="Play tool-use tasks with a tiny policy, stream the events through the bus into the lake, "
        "train from the lake with a staleness-bounded sampler, and print what changed.",
    )
    add_settings(p, DemoConfig, OPTIONS)
    add_settings(p, DemoOutput)
    p.set_defaults(handler=handle)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def handle(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when it learned, 1 when it did not."""
    from trajlake.demo.recipe import run_demo, summary_json

    config = args.DemoConfig
    # a terminated demo unwinds like an interrupted one, so the vLLM server it started is stopped
    signal.signal(signal.SIGTERM, _interrupt)
    summary = run_demo(config)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(summary_json(summary))
    return 0 if summary["learned"] else 1
