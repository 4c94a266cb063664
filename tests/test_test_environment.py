"""The tests' own environment: what a developer's shell must not leak into a test run."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CHILD = "TRAJLAKE_TEST_ENV_CHILD"


def test_a_shell_pointed_at_a_real_cluster_gives_the_tests_only_their_own_broker(request) -> None:
    """With the product's Kafka variables aimed at a cluster, the tests see neither, and their broker
    is TRAJLAKE_TEST_KAFKA_BOOTSTRAP's: no test topic reaches the cluster the shell names."""
    if os.environ.get(CHILD):
        assert "TRAJLAKE_KAFKA_BOOTSTRAP" not in os.environ and "TRAJLAKE_KAFKA" not in os.environ
        assert request.getfixturevalue("kafka_bootstrap") == "127.0.0.1:1"
        return
    env = {
        **os.environ,
        CHILD: "1",
        "TRAJLAKE_KAFKA_BOOTSTRAP": "prod-kafka.example:9092",
        "TRAJLAKE_KAFKA": "prod-kafka.example:9092",
        "TRAJLAKE_TEST_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    }
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "--durations=0",
         f"{__file__}::{request.node.name}"],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-2000:]
    assert "1 passed" in child.stdout


def _collect(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "--collect-only", "-q", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )  # fmt: skip


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_bare_pytest_runs_the_unit_tests_and_leaves_every_integration_test_out() -> None:
    """`pytest` alone (as `make unit` runs it) starts no server: it leaves out exactly the tests
    marked integration, which scripts/test.sh runs (`-m ""`)."""
    bare, integration = _collect(), _collect("-m", "integration")
    outs = [p.communicate(timeout=300)[0] for p in (bare, integration)]
    found = [re.search(r"(\d+)/(\d+) tests? collected \((\d+) deselected\)", o) for o in outs]
    assert all(found), outs
    ids = [{line for line in o.splitlines() if "::" in line} for o in outs]
    assert int(found[1][1]) > 0 and int(found[0][3]) == int(found[1][1])
    assert not ids[0] & ids[1] and len(ids[0]) == int(found[0][1])
