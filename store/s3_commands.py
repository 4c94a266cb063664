"""CLI commands of the local S3 server: `s3 build`, `s3 up`, `s3 down`, `s3 status`."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from trajlake.common.settings import add_settings, group_usage
from trajlake.schemas.errors import CliError
from trajlake.store.s3_server import S3ServerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `s3 build|up|down|status`."""
    s3 = subparsers.add_parser(
        "s3", help="a local S3 server (SeaweedFS, built from source once) for an s3:// lake in dev and tests"
    )
    actions = s3.add_subparsers(dest="s3_command", metavar="ACTION")
    build = actions.add_parser(
        "build", help="build SeaweedFS's `weed` with Go unless it is cached (minutes, once); print its path"
    )
    build.set_defaults(handler=run_s3_build)
    up = actions.add_parser(
        "up",
        help="start SeaweedFS on 127.0.0.1 (building it the first time) and create the bucket; print the "
        "AWS_* settings a client needs as NAME=value lines",
    )
    add_settings(up, S3ServerConfig, ["port", "data_dir", "bucket", "start_timeout_s"])
    up.set_defaults(handler=run_s3_up)
    down = actions.add_parser("down", help="stop the server started in --data-dir (its data stays)")
    add_settings(down, S3ServerConfig, ["data_dir"])
    down.set_defaults(handler=run_s3_down)
    status = actions.add_parser(
        "status", help="whether the server of --data-dir runs and answers; if so, print its AWS_* settings"
    )
    add_settings(status, S3ServerConfig, ["data_dir"])
    status.set_defaults(handler=run_s3_status)
    s3.set_defaults(handler=group_usage(s3))


def run_s3_build(args: argparse.Namespace) -> int:
    """Build `weed` once; print its path."""
    from trajlake.store.seaweedfs_build import S3ServerError, ensure_weed

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(ensure_weed())
    except S3ServerError as err:
        raise CliError(str(err)) from None
    return 0


def run_s3_up(args: argparse.Namespace) -> int:
    """Start the server; print the client's settings."""
    from trajlake.store.s3_server import S3ServerError, start_s3

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config: S3ServerConfig = args.S3ServerConfig
    try:
        layout = start_s3(config)
    except S3ServerError as err:
        raise CliError(str(err)) from None
    for name, value in layout.env().items():
        print(f"{name}={value}")
    if config.bucket:
        logging.getLogger(__name__).info("a lake there: --lake s3://%s/lake", config.bucket)
    return 0


def run_s3_down(args: argparse.Namespace) -> int:
    """Stop the server of the data directory."""
    from trajlake.store.s3_server import stop_s3

    stopped = stop_s3(Path(args.data_dir))
    print("stopped" if stopped else f"no S3 server running in {args.data_dir}")
    return 0


def run_s3_status(args: argparse.Namespace) -> int:
    """Say whether the server runs and answers (exit 0) or not (exit 1)."""
    import httpx

    from trajlake.store.s3_server import S3Layout, running_pid

    data_dir = Path(args.data_dir)
    layout, pid = S3Layout.load(data_dir), running_pid(data_dir)
    if layout is None or pid is None:
        print(f"no S3 server running in {data_dir}")
        return 1
    endpoint = layout.env()["AWS_ENDPOINT_URL"]
    try:
        httpx.get(endpoint, timeout=5)
    except httpx.TransportError as err:
        print(
            f"S3 server pid {pid} in {data_dir} does not answer at {endpoint} ({err}); see {data_dir / 'weed.log'}"
        )
        return 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger(__name__).info("S3 server pid %d in %s answers at %s", pid, data_dir, endpoint)
    for name, value in layout.env().items():
        print(f"{name}={value}")
    return 0
