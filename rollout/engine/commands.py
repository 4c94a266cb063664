"""CLI commands of the inference engine: `vllm up|down|status`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from trajlake.common.settings import add_settings
from trajlake.rollout.engine.server import VllmServerConfig, VllmStateSettings, VllmStopSettings
from trajlake.schemas.errors import CliError

SERVER_OPTIONS = [
    "model",
    "served_model_name",
    "port",
    "state_dir",
    "device",
    "dtype",
    "max_model_len",
    "kv_cache_mb",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `vllm up|down|status`."""
    vllm = subparsers.add_parser("vllm", help="a local vLLM OpenAI-compatible server (its own cached venv)")
    actions = vllm.add_subparsers(dest="vllm_command", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="install vLLM once (cached), start the server, wait until it answers")
    add_settings(up, VllmServerConfig, SERVER_OPTIONS)
    up.add_argument("--json", action="store_true", help="print the server record as JSON")
    up.set_defaults(handler=run_vllm_up)
    down = actions.add_parser("down", help="stop the server this state dir started on --port (default: all)")
    add_settings(down, VllmStopSettings)
    add_settings(down, VllmStateSettings)
    down.set_defaults(handler=run_vllm_down)
    status = actions.add_parser("status", help="the servers this state dir started, and whether they answer")
    add_settings(status, VllmStateSettings)
    status.add_argument("--json", action="store_true", help="print the records as JSON")
    status.set_defaults(handler=run_vllm_status)


def run_vllm_up(args: argparse.Namespace) -> int:
    from trajlake.rollout.engine.server import VllmServerError, start_server

    config = args.VllmServerConfig
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
