"""CLI commands of the inference engine: `model init`, `vllm up|down|status`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from trajlake.cli import CliError, env_default, settings_error

DEFAULT_STATE_DIR = "./trajlake-vllm"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `model init` and `vllm up|down|status`."""
    model = subparsers.add_parser("model", help="a tiny Hugging Face chat model built locally (no network)")
    model_actions = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = model_actions.add_parser(
        "init", help="write a random-init Qwen2 model, a locally trained BPE tokenizer and a chat template"
    )
    init.add_argument("dir", metavar="DIR", help="new (or empty) directory")
    init.add_argument(
        "--vocab-size",
        type=int,
        default=env_default("MODEL_VOCAB_SIZE", "512"),
        help="tokenizer vocabulary (env TRAJLAKE_MODEL_VOCAB_SIZE; default %(default)s)",
    )
    init.add_argument(
        "--width",
        type=int,
        default=env_default("MODEL_WIDTH", "128"),
        help="hidden size (env TRAJLAKE_MODEL_WIDTH; default %(default)s)",
    )
    init.add_argument(
        "--layers",
        type=int,
        default=env_default("MODEL_LAYERS", "2"),
        help="transformer layers (env TRAJLAKE_MODEL_LAYERS; default %(default)s)",
    )
    init.add_argument(
        "--heads",
        type=int,
        default=env_default("MODEL_HEADS", "4"),
        help="attention heads; width / heads >= 32 (env TRAJLAKE_MODEL_HEADS; default %(default)s)",
    )
    init.add_argument(
        "--kv-heads",
        type=int,
        default=env_default("MODEL_KV_HEADS", "2"),
        help="key/value heads (env TRAJLAKE_MODEL_KV_HEADS; default %(default)s)",
    )
    init.add_argument(
        "--seed",
        type=int,
        default=env_default("MODEL_SEED", "0"),
        help="seed of the random weights (env TRAJLAKE_MODEL_SEED; default %(default)s)",
    )
    init.add_argument("--json", action="store_true", help="print the summary as JSON")
    init.set_defaults(handler=run_model_init)  # fmt: skip

    vllm = subparsers.add_parser("vllm", help="a local vLLM OpenAI-compatible server (its own cached venv)")
    actions = vllm.add_subparsers(dest="vllm_command", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="install vLLM once (cached), start the server, wait until it answers")
    up.add_argument(
        "--model",
        default=env_default("MODEL"),
        required=env_default("MODEL") is None,
        help="model directory (env TRAJLAKE_MODEL); `trajlake model init DIR` makes one",
    )
    up.add_argument(
        "--name",
        default=env_default("VLLM_MODEL_NAME"),
        help="served model name (env TRAJLAKE_VLLM_MODEL_NAME; default: the directory's name)",
    )
    _port_option(up)
    _state_dir_option(up)
    up.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default=env_default("VLLM_DEVICE", "auto"),
        help="auto: cuda when nvidia-smi finds a GPU (env TRAJLAKE_VLLM_DEVICE; default %(default)s)",
    )
    up.add_argument(
        "--dtype",
        default=env_default("VLLM_DTYPE"),
        help="model dtype (env TRAJLAKE_VLLM_DTYPE; default float32 on CPU, auto on CUDA)",
    )
    up.add_argument(
        "--max-model-len",
        type=int,
        default=env_default("VLLM_MAX_MODEL_LEN", "4096"),
        help="longest prompt + output (env TRAJLAKE_VLLM_MAX_MODEL_LEN; default %(default)s)",
    )
    up.add_argument(
        "--kv-cache-mb",
        type=int,
        default=env_default("VLLM_KV_CACHE_MB", "256"),
        help="KV cache size on CPU (env TRAJLAKE_VLLM_KV_CACHE_MB; default %(default)s)",
    )
    up.add_argument("--json", action="store_true", help="print the server record as JSON")
    up.set_defaults(handler=run_vllm_up)
    down = actions.add_parser("down", help="stop the server this state dir started on --port (default: all)")
    down.add_argument(
        "--port",
        type=int,
        default=env_default("VLLM_PORT"),
        help="port of the server to stop (env TRAJLAKE_VLLM_PORT; default: every server of the state dir)",
    )
    _state_dir_option(down)
    down.set_defaults(handler=run_vllm_down)
    status = actions.add_parser("status", help="the servers this state dir started, and whether they answer")
    _state_dir_option(status)
    status.add_argument("--json", action="store_true", help="print the records as JSON")
    status.set_defaults(handler=run_vllm_status)  # fmt: skip


def _port_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=env_default("VLLM_PORT", "8000"),
                   help="port on 127.0.0.1 (env TRAJLAKE_VLLM_PORT; default %(default)s)")  # fmt: skip


def _state_dir_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=env_default("VLLM_STATE_DIR", DEFAULT_STATE_DIR),
                   help="where the pid record and log go (env TRAJLAKE_VLLM_STATE_DIR; default %(default)s)")  # fmt: skip


def run_model_init(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from trajlake.rollout.engine.model import ModelInitConfig, ModelInitError, init_model

    try:
        config = ModelInitConfig(
            vocab_size=args.vocab_size, hidden_size=args.width, num_layers=args.layers,
            num_heads=args.heads, num_kv_heads=args.kv_heads, seed=args.seed,
        )  # fmt: skip
    except ValidationError as err:
        where = {"vocab_size": "--vocab-size", "hidden_size": "--width", "num_layers": "--layers",
                 "num_heads": "--heads", "num_kv_heads": "--kv-heads"}  # fmt: skip
        raise CliError(f"invalid model settings: {settings_error(err, where)}") from None
    try:
        summary = init_model(args.dir, config)
    except ModelInitError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"wrote a {summary['architecture']} ({summary['parameters']:,} parameters, vocabulary "
            f"{summary['vocab_size']}) to {summary['model_dir']}; serve it with "
            f"`trajlake vllm up --model {args.dir}`"
        )
    return 0


def run_vllm_up(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from trajlake.rollout.engine.server import VllmServerConfig, VllmServerError, start_server

    try:
        config = VllmServerConfig(
            model=Path(args.model), served_model_name=args.name, port=args.port, state_dir=Path(args.state_dir),
            device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
            kv_cache_bytes=args.kv_cache_mb * 2**20,
        )  # fmt: skip
    except ValidationError as err:
        where = {"port": "--port", "max_model_len": "--max-model-len", "kv_cache_bytes": "--kv-cache-mb"}
        raise CliError(f"invalid vLLM settings: {settings_error(err, where)}") from None
    try:
        record = start_server(config, log=sys.stderr)
    except VllmServerError as err:
        raise CliError(str(err)) from None
    if args.json:
        print(json.dumps(record))
    else:
        print(record["base_url"])
        print(f"serving {record['model']} (pid {record['pid']}, log {record['log']})", file=sys.stderr)
    return 0


def run_vllm_down(args: argparse.Namespace) -> int:
    from trajlake.rollout.engine.server import list_records, stop_server

    ports = [args.port] if args.port is not None else [r["port"] for r in list_records(Path(args.state_dir))]
    for port in ports:
        if stop_server(Path(args.state_dir), port):
            print(f"stopped the vLLM server on port {port}")
        else:
            print(f"no vLLM server started from {args.state_dir} is running on port {port}")
    if not ports:
        print(f"no vLLM server recorded in {args.state_dir}")
    return 0


def run_vllm_status(args: argparse.Namespace) -> int:
    import httpx

    from trajlake.rollout.engine.server import list_records

    records = list_records(Path(args.state_dir))
    for record in records:
        record["healthy"] = False
        if record["running"]:
            with contextlib.suppress(httpx.TransportError):
                record["healthy"] = httpx.get(f"{record['base_url']}/health", timeout=5).status_code == 200
    if args.json:
        print(json.dumps(records))
    elif not records:
        print(f"no vLLM server recorded in {args.state_dir}")
    for record in [] if args.json else records:
        state = "healthy" if record["healthy"] else "running, not answering" if record["running"] else "gone"
        print(f"{record['base_url']}  {record['model']}  pid {record['pid']}  {state}  log {record['log']}")
    return 0 if all(r["healthy"] for r in records) else 1
