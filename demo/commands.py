"""`trajlake demo` and `trajlake model init` (the demo's tiny model): argument parsing only, options from
`DemoConfig` and `ModelInitConfig`; the run itself lives in `trajlake.demo.recipe`."""

from __future__ import annotations

import argparse
import json

from pydantic import Field

from trajlake.common.settings import Settings, add_settings, cli
from trajlake.demo.config import DemoConfig
from trajlake.demo.model import ModelInitConfig
from trajlake.schemas.errors import CliError
from trajlake.schemas.settings import uses_lake

OPTIONS = ["stack", "lake", "engine", "model_dir", "vllm_url", "steps", "kafka", "topic", "ray", "workers", "seed", "run_id",
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
    uses_lake(p, "write")
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


def handle(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when it learned, 1 when it did not."""
    from trajlake.demo.recipe import run_demo, summary_json

    config = args.DemoConfig
    if config.stack is not None:
        config = on_stack(config)
    # SIGTERM unwinds like Ctrl-C (the CLI's `shutdown.run`): the vLLM server it started is stopped,
    # and what its recorders, bus and sink hold is flushed first
    summary = run_demo(config)
    if args.json_path:
        with open(args.json_path, "w") as fh:
            fh.write(summary_json(summary))
    return 0 if summary["learned"] else 1


def on_stack(config: DemoConfig) -> DemoConfig:
    """The demo on the stack of `config.stack`: its lake and Kafka; its S3 credentials and catalog
    (TRAJLAKE_CATALOG_URL) go into this process's environment, where the lake's and catalog's clients read them."""
    import os

    from trajlake.common.settings import env_name
    from trajlake.deploy.config import DEMO
    from trajlake.deploy.stack import stack_env
    from trajlake.schemas.settings import KafkaSwitch, LakeSettings
    from trajlake.store.put_if_absent import require_safe_store
    from trajlake.store.storage import Storage

    env = stack_env(config.stack, DEMO)  # a StackError names `trajlake stack up`
    stack = {"lake": env[env_name(LakeSettings, "lake")], "kafka": env[env_name(KafkaSwitch, "kafka")]}
    if clash := [f"--{name} {getattr(config, name)}" for name, value in stack.items()
                 if name in config.model_fields_set and getattr(config, name) != value]:  # fmt: skip
        raise CliError(f"--stack {config.stack} brings its own lake and Kafka; drop {' and '.join(clash)} "
                       "(or their TRAJLAKE_* variables)")  # fmt: skip
    os.environ.update(env)
    require_safe_store(Storage(stack["lake"]))  # as the CLI checks a writer's --lake
    return config.model_copy(update=stack)


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
