"""`trajlake s3 up|status|down`: a local SeaweedFS a lake can live in, whose data and credentials
survive a restart, two of which run side by side."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.helpers import clean_env, trajlake
from trajlake.common.settings import cache_dir
from trajlake.store.s3_server import free_port

pytestmark = pytest.mark.integration


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment that still finds the built `weed` (the session's s3 fixture built it)."""
    return clean_env(tmp_path, TRAJLAKE_CACHE_DIR=str(cache_dir()), **extra)


def _settings(out: str) -> dict[str, str]:
    """The NAME=value lines `s3 up` / `s3 status` print."""
    return dict(line.split("=", 1) for line in out.splitlines())


@pytest.mark.usefixtures("s3_server")  # builds weed once, before these run it
def test_a_lake_lives_in_the_server_s3_up_starts_and_survives_its_restart(tmp_path: Path) -> None:
    data = str(tmp_path / "s3")
    up = trajlake("s3", "up", "--data-dir", data, "--port", str(free_port()), env=_env(tmp_path))
    try:
        settings = _settings(up.stdout)
        assert sorted(settings) == sorted(
            ["AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP"]
        )
        assert "--lake s3://trajlake/lake" in up.stderr
        client = _env(tmp_path, **settings)
        lake = ("--lake", "s3://trajlake/lake")
        loadgen = trajlake("loadgen", *lake, "--trajectories", "20", "--json", env=client)
        assert json.loads(loadgen.stdout.splitlines()[-1])["trajectories"] == 20
        count = ("sql", *lake, "--format", "json", "select count(*) as n from trajectories")
        assert json.loads(trajlake(*count, env=client).stdout) == [{"n": 20}]

        status = trajlake("s3", "status", "--data-dir", data, env=_env(tmp_path))
        assert _settings(status.stdout) == settings and "answers at" in status.stderr
        assert trajlake("s3", "down", "--data-dir", data, env=_env(tmp_path)).stdout.strip() == "stopped"
        gone = trajlake("s3", "status", "--data-dir", data, env=_env(tmp_path), check=False)
        assert gone.returncode == 1 and "no S3 server running" in gone.stdout

        again = trajlake("s3", "up", "--data-dir", data, env=_env(tmp_path))  # its port and keys are kept
        assert _settings(again.stdout) == settings
        assert json.loads(trajlake(*count, env=client).stdout) == [{"n": 20}]
        wrong = _env(tmp_path, **{**settings, "AWS_SECRET_ACCESS_KEY": "not-the-key"})
        refused = trajlake(*count, env=wrong, check=False)
        assert refused.returncode == 2 and "AWS_SECRET_ACCESS_KEY" in refused.stderr
    finally:
        trajlake("s3", "down", "--data-dir", data, env=_env(tmp_path))


@pytest.mark.usefixtures("s3_server")
def test_two_servers_run_side_by_side_and_a_busy_port_is_named(tmp_path: Path) -> None:
    dirs = [str(tmp_path / f"s3-{i}") for i in range(2)]
    try:
        endpoints = {
            _settings(
                trajlake("s3", "up", "--data-dir", d, "--port", str(free_port()), env=_env(tmp_path)).stdout
            )["AWS_ENDPOINT_URL"]
            for d in dirs
        }
        assert len(endpoints) == 2
        assert all(
            trajlake("s3", "status", "--data-dir", d, env=_env(tmp_path)).returncode == 0 for d in dirs
        )
    finally:
        for d in dirs:
            trajlake("s3", "down", "--data-dir", d, env=_env(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = trajlake(
            "s3",
            "up",
            "--data-dir",
            str(tmp_path / "s3-busy"),
            "--port",
            port,
            env=_env(tmp_path),
            check=False,
        )
    assert busy.returncode == 2 and f"port {port} on 127.0.0.1 is already in use; pass --port" in busy.stderr
