"""`trajlake demo` and `trajlake model init` (the demo's tiny model): argument parsing only, options from
`DemoConfig` and `ModelInitConfig`; the run itself lives in `trajlake.demo.recipe`."""

from __future__ import annotations

import argparse
import json
import signal

from pydantic import Field

from trajlake.demo.config import DemoConfig
from trajlake.demo.model import ModelInitConfig
from trajlake.schemas.settings import Settings, add_settings, cli

OPTIONS = ["lake", "engine", "model_dir", "vllm_url", "steps", "kafka", "topic", "ray", "workers", "seed", "run_id",
           "overfit_tasks", "fault_rate"]  # fmt: skip
MODEL_OPTIONS = ["vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "seed"]


class DemoOutput(Settings):
    """Where the demo's summary goes besides the terminal."""

    json_path: str | None = Field(
        None,
        validation_alias="TRAJLAKE_DEMO_JSON",
        description="also write the summary as JSON to PATH",
        json_schema_extra=cli("--json", metavar="PATH"),
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `trajlake demo` and `trajlake model init`."""
    p = subparsers.add_parser(
        "demo",
        help="a small async agent-RL run, end to end, that visibly learns",
        description="Play tool-use tasks with a tiny policy, stream the events through the bus into the lake, "
        "train from the lake with a staleness-bounded sampler, and print what changed.",
    )
    add_settings(p, DemoConfig, OPTIONS)
    add_settings(p, DemoOutput)
    p.set_defaults(handler=handle)

    model = subparsers.add_parser("model", help="a tiny Hugging Face chat model built locally (no network)")
    model_actions = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = model_actions.add_parser(
        "init", help="write a random-init Qwen2 model, a locally trained BPE tokenizer and a chat template"
    )
    init.add_argument("dir", metavar="DIR", help="new (or empty) directory")
    add_settings(init, ModelInitConfig, MODEL_OPTIONS)
    init.add_argument("--json", action="store_true", help="print the summary as JSON")
    init.set_defaults(handler=run_model_init)


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


def run_model_init(args: argparse.Namespace) -> int:
    from trajlake.demo.model import init_model

    summary = init_model(args.dir, args.ModelInitConfig)  # a ModelInitError names its fix: the CLI prints it
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote a {summary['architecture']} ({summary['parameters']:,} parameters, vocabulary "
            f"{summary['vocab_size']}) to {summary['model_dir']}; serve it with "
            f"`trajlake vllm up --model {args.dir}`"
        )
    return 0
