"""The compose file parses, names the services of the scale-out deployment, and runs real CLI commands."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from trajlake.cli import build_parser

DOCKER = Path(__file__).resolve().parents[2] / "docker"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_the_compose_file_has_the_scale_out_services(compose: dict) -> None:
    services = compose["services"]
    assert {"kafka", "postgres", "minio", "sink", "dashboard"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:4")
    assert (
        services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    )  # KRaft, no ZooKeeper
    assert services["sink"]["environment"]["TRAJLAKE_LAKE"].startswith("s3://")
    assert services["sink"]["stop_signal"] == "SIGTERM"  # the sink commits on SIGTERM


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize("service", ["sink", "dashboard"])
def test_each_trajlake_command_in_compose_parses_with_the_cli(compose: dict, service: str) -> None:
    command = compose["services"][service]["command"]
    assert command[0] in _subcommands(build_parser())
    args = build_parser().parse_args(command)  # exits (SystemExit) on an unknown option
    assert callable(args.handler)


def test_the_dockerfile_installs_the_package_and_runs_the_cli() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["trajlake"]' in text
    assert "pip install" in text and "kafka" in text
