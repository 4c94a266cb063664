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
    assert {"kafka-1", "kafka-2", "kafka-3", "postgres", "s3", "sink", "projector", "dashboard"} <= set(
        services
    )
    assert (
        "--no-update-projections" in services["sink"]["command"]
    )  # sinks only ingest; one projector projects
    assert services["sink"]["environment"]["TRAJLAKE_LAKE"].startswith("s3://")
    assert services["sink"]["stop_signal"] == "SIGTERM"  # the sink commits on SIGTERM


def test_kafka_is_three_kraft_nodes_replicating_every_topic_three_times(compose: dict) -> None:
    nodes = {name: s for name, s in compose["services"].items() if name.startswith("kafka-")}
    assert len(nodes) == 3
    ids = set()
    for service in nodes.values():
        env = service["environment"]
        assert service["image"].startswith("apache/kafka:4")
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
        ids.add(env["KAFKA_NODE_ID"])
        # the event topic and every internal topic: RF 3, and acks=all waits for 2 replicas
        for key, value in env.items():
            if key.endswith("_REPLICATION_FACTOR"):
                assert value == 3, key
            if key.endswith("_MIN_ISR") or key == "KAFKA_MIN_INSYNC_REPLICAS":
                assert value == 2, key
        assert env["CLUSTER_ID"] == nodes["kafka-1"]["environment"]["CLUSTER_ID"]
    assert ids == {1, 2, 3}
    assert compose["services"]["sink"]["command"][2] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@pytest.mark.parametrize("service", ["sink", "projector", "dashboard"])
def test_each_trajlake_command_in_compose_parses_with_the_cli(compose: dict, service: str) -> None:
    command = compose["services"][service]["command"]
    assert command[0] in _subcommands(build_parser())
    args = build_parser().parse_args(command)  # exits (SystemExit) on an unknown option
    assert callable(args.handler)


def test_the_dockerfile_installs_the_package_and_runs_the_cli() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["trajlake"]' in text
    assert "pip install" in text and "kafka" in text


def test_every_service_a_service_waits_for_exists(compose: dict) -> None:
    services = compose["services"]
    for name, service in services.items():
        assert set(service.get("depends_on", {})) <= set(services), name


def test_s3_is_seaweedfs_at_the_version_the_tests_run_and_the_clients_key_is_its_identity(
    compose: dict,
) -> None:
    import json
    import re

    from trajlake.store.s3_server import S3Layout, weed_command
    from trajlake.store.seaweedfs_build import SEAWEEDFS_VERSION

    dockerfile = (DOCKER / "seaweedfs.Dockerfile").read_text()
    assert f"ARG SEAWEEDFS_VERSION={SEAWEEDFS_VERSION}" in dockerfile  # never MinIO (AGPL), never :latest
    s3, bucket = compose["services"]["s3"], compose["services"]["s3-bucket"]
    assert s3["image"] == bucket["image"] == f"trajlake-seaweedfs:{SEAWEEDFS_VERSION}"
    assert s3["build"]["dockerfile"] == "seaweedfs.Dockerfile"
    # every flag the compose server takes is one `trajlake s3 up` runs the same binary with
    ours = {arg.split("=")[0] for arg in weed_command(Path("weed"), Path("d"), S3Layout.plan(0))[1:]}
    assert {arg.split("=")[0] for arg in s3["command"]} <= ours
    env = compose["x-trajlake-env"]
    port = re.fullmatch(r"http://s3:(\d+)", env["AWS_ENDPOINT_URL"]).group(1)
    assert f"-s3.port={port}" in s3["command"] and f"{port}:{port}" in s3["ports"]
    identities = json.loads(compose["configs"]["s3-identities"]["content"])["identities"]
    keys = {(c["accessKey"], c["secretKey"]) for i in identities for c in i["credentials"]}
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) in keys
    config = next(f for f in s3["command"] if f.startswith("-s3.config="))
    assert [c["target"] for c in s3["configs"]] == [
        config.split("=", 1)[1]
    ]  # the identities mounted where read
    assert env["TRAJLAKE_LAKE"].startswith("s3://trajlake/") and "-name trajlake" in bucket["entrypoint"][-1]
