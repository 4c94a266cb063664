"""`trajlake stack`: the whole deployment as local processes, used as a producer, a SQL user and the demo would."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import processes_mentioning, quick_bench, trajlake, wait_until

PARTS = ("kafka", "s3", "postgres", "sink-1", "sink-2", "projector", "dashboard")


@pytest.fixture
def stack_dir() -> Iterator[Path]:
    """A directory the `postgres` user can reach (pytest's own tmp dirs are private to root); the
    stack in it is stopped and the directory removed however the test ends."""
    base = Path(tempfile.mkdtemp(prefix="trajlake-stack-"))
    base.chmod(0o755)
    try:
        yield base / "stack"
    finally:
        trajlake("stack", "down", "--dir", str(base / "stack"), check=False)
        shutil.rmtree(base, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.integration
def test_stack_carries_a_producers_events_into_its_s3_lake_and_down_stops_all_it_started(
    stack_dir: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = trajlake("stack", "up", "--dir", str(stack_dir), "--brokers", "1", "--sinks", "2")
    client = dict(line.split("=", 1) for line in up.stdout.splitlines())  # the reader's
    assert client["TRAJLAKE_LAKE"].startswith("s3://")
    assert client["TRAJLAKE_CATALOG_URL"].startswith("postgresql+psycopg://trajlake_reader:")
    assert {"TRAJLAKE_KAFKA", "AWS_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY"} <= client.keys()
    assert client["AWS_ACCESS_KEY_ID"] == "trajlake-reader"
    assert _env_file(stack_dir / "env" / "reader.env") == client
    writer = _env_file(stack_dir / "env" / "writer.env")
    assert writer["AWS_ACCESS_KEY_ID"] == "trajlake-writer"
    assert writer["TRAJLAKE_CATALOG_URL"].startswith("postgresql+psycopg://trajlake_trainer:")
    sink, demo = (_env_file(stack_dir / "env" / f"{name}.env") for name in ("sink", "demo"))
    for env in (sink, demo):  # the writer's lake and catalog, a Kafka principal of their own
        assert {k: v for k, v in env.items() if "KAFKA" not in k} == {
            k: v for k, v in writer.items() if "KAFKA" not in k
        }
    kafka_users = [env["TRAJLAKE_KAFKA_SASL_USERNAME"] for env in (client, writer, sink, demo)]
    assert kafka_users == ["trajlake-producer", "trajlake-producer", "trajlake-sink", "trajlake-demo"]
    assert client["TRAJLAKE_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"  # the round trip below: TLS + SCRAM
    admin_password = json.loads((stack_dir / "stack.json").read_text())["kafka_users"]["trajlake-admin"]
    broker_key = (stack_dir / "kafka" / "tls" / "broker.pem").read_text().split("-----")[2].strip()
    secrets = [
        _password(client),
        _password(writer),
        client["AWS_SECRET_ACCESS_KEY"],
        writer["AWS_SECRET_ACCESS_KEY"],
        client["TRAJLAKE_KAFKA_SASL_PASSWORD"],
        sink["TRAJLAKE_KAFKA_SASL_PASSWORD"],
        demo["TRAJLAKE_KAFKA_SASL_PASSWORD"],
        admin_password,
        broker_key[:64],  # a line of the nodes' private key
    ]
    assert not [s for s in secrets if s in up.stderr]  # the secrets go to stdout and the env files only

    status = trajlake("stack", "status", "--dir", str(stack_dir)).stdout.splitlines()
    assert [line.split()[:2] for line in status] == [[part, "ok"] for part in PARTS], status
    recorded = json.loads((stack_dir / "stack.json").read_text())["processes"]
    started = {p["pid"] for p in recorded} | set(processes_mentioning(str(stack_dir)))
    kafka = {p["name"]: _environ(p["pid"]).get("TRAJLAKE_KAFKA_SASL_PASSWORD") for p in recorded}
    sinks = sink["TRAJLAKE_KAFKA_SASL_PASSWORD"]  # each process its role's Kafka credentials alone
    assert kafka == {"sink-1": sinks, "sink-2": sinks, "projector": None, "dashboard": None}

    env = {**os.environ, **client}
    produced = json.loads(trajlake("loadgen", "--trajectories", "30", "--json", env=env).stdout)
    assert produced["undelivered_messages"] == 0

    def in_lake(sql: str) -> int:
        out = trajlake("sql", "--format", "json", sql, env=env, check=False)
        return int(next(iter(json.loads(out.stdout)[0].values()))) if out.returncode == 0 else -1

    wait_until(
        lambda: in_lake("select count(distinct trajectory_id) as n from events") == 30,
        90,
        "30 trajectories in the lake",
    )
    wait_until(
        lambda: in_lake("select count(*) as n from trajectories") == 30, 90, "the projector's trajectories"
    )
    _bench_streams_into_it(stack_dir, kafka_bootstrap, monkeypatch)
    _reader_may_not_write(env)
    _kafka_refuses_wrong_settings(client, writer, sink, stack_dir.parent / "spool")

    summary = stack_dir.parent / "demo.json"
    demo = trajlake("demo", "--stack", str(stack_dir), "--engine", "tiny", "--steps", "5", "--no-ray",
                    "--overfit-tasks", "0", "--json", str(summary), check=False, cwd=stack_dir.parent)  # fmt: skip
    assert summary.exists(), demo.stderr[-3000:]  # written when the run completes, learned or not
    assert json.loads(summary.read_text())["tables"]["policy_versions"] == 5
    assert in_lake("select count(*) as n from policy_versions where run_id = 'demo'") == 5
    assert list((stack_dir.parent / "trajlake-data" / "checkpoints" / "demo").iterdir())  # beside the S3 lake
    after = trajlake("stack", "status", "--dir", str(stack_dir)).stdout.splitlines()
    assert after[PARTS.index("projector")].split()[:2] == [
        "projector",
        "ok",
    ]  # the demo left the projections to it

    down = trajlake("stack", "down", "--dir", str(stack_dir)).stdout
    assert down.strip() == "stopped: " + ", ".join((*PARTS[3:], *PARTS[:3]))
    assert [pid for pid in started if _alive(pid)] == []
    assert processes_mentioning(str(stack_dir)) == []
    again = trajlake("stack", "down", "--dir", str(stack_dir)).stdout
    assert again.startswith("nothing of a stack running")
    assert trajlake("stack", "status", "--dir", str(stack_dir), check=False).returncode == 1
    logs = [p for p in stack_dir.rglob("*") if p.is_file() and (p.suffix == ".log" or "log" in p.parent.name)]
    assert {"weed.log", "server.log", "dashboard.log", "sink-1.log"} <= {p.name for p in logs}
    assert [(p, s[:4]) for p in logs for s in secrets if s.encode() in p.read_bytes()] == []


def _environ(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in entries if b"=" in e)


def _refused(command: list[str], env: dict[str, str]) -> str:
    """`trajlake COMMAND`'s stderr, asserting it exits 2 with no traceback well before kafka-python's
    30 s bootstrap timeout (the hang the refusals replace)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", *command]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=25)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stderr.strip().splitlines()[-1]


def _kafka_refuses_wrong_settings(
    producer: dict[str, str], writer: dict[str, str], sink: dict[str, str], spool: Path
) -> None:
    """A wrong password, a client without TLS, and each principal doing the other's job: refused at
    once, each saying what to set; what a refused producer had is kept in its spool."""
    from trajlake.ingest.spool import Spool

    loadgen, ingest = (
        ["loadgen", "--trajectories", "2"],
        ["ingest", "--until-idle", "1", "--lake", producer["TRAJLAKE_LAKE"]],
    )
    wrong = {
        **producer,
        "TRAJLAKE_KAFKA_SASL_PASSWORD": "not-the-password",
        "TRAJLAKE_KAFKA_SPOOL_DIR": str(spool),
    }
    said = _refused(loadgen, {**os.environ, **wrong})
    assert "refused the SASL SCRAM-SHA-512 credentials of user 'trajlake-producer'" in said
    assert "TRAJLAKE_KAFKA_SASL_PASSWORD" in said and "not-the-password" not in said
    waiting = Spool(spool / "trajlake-events", 1 << 30)
    assert len(waiting) > 0  # nothing lost: delivered by the next producer the brokers accept
    waiting.close()

    plain = {k: v for k, v in producer.items() if not k.startswith("TRAJLAKE_KAFKA_")}
    said = _refused(loadgen, {**os.environ, **plain, "TRAJLAKE_KAFKA_SPOOL_DIR": str(spool / "plain")})
    assert (
        "speak TLS" in said
        and "TRAJLAKE_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in said
        and "env/<role>.env" in said
    )

    said = _refused([*ingest, "--group", "trajlake-stack"], {**os.environ, **writer})  # its producer
    assert "refused User:trajlake-producer as a consumer: it lacks READ on group trajlake-stack" in said
    said = _refused(loadgen, {**os.environ, **sink, "TRAJLAKE_KAFKA_SPOOL_DIR": str(spool / "sink")})
    assert "refused User:trajlake-sink as a producer: it lacks IDEMPOTENT_WRITE on the cluster" in said


def _bench_streams_into_it(stack_dir: Path, kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/scale_out.py --stack: a stream through the stack's TLS Kafka, its sinks and projector
    into its S3 lake, beside the same stream into one sink and a local lake (no assertion on speed)."""
    monkeypatch.setenv("TRAJLAKE_KAFKA_BOOTSTRAP", kafka_bootstrap)  # the local stream's broker
    printed, figures = quick_bench("scale_out", stack_dir.parent, "--stack", str(stack_dir), "--stream", "30")
    local, stacked = figures["streams"]
    assert (local["lake"], stacked["lake"], stacked["sinks"]) == ("local", "stack (2 sinks)", 2)
    for r in (local, stacked):
        assert r["trajectories"] == 30 and r["events"] > 30 and r["visible_max_s"] >= r["visible_p50_s"] > 0
    assert figures["stack_vs_local_visible_p50"] == pytest.approx(
        stacked["visible_p50_s"] / local["visible_p50_s"]
    )
    assert "stack / local: events per sink CPU-s" in printed


def _env_file(path: Path) -> dict[str, str]:
    assert path.stat().st_mode & 0o777 == 0o600
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def _password(env: dict[str, str]) -> str:
    from sqlalchemy.engine import make_url

    password = make_url(env["TRAJLAKE_CATALOG_URL"]).password
    assert password
    return str(password)


def _reader_may_not_write(env: dict[str, str]) -> None:
    """The reader's S3 key reads the lake (above) but cannot write it, and its catalog role reads
    the catalog but cannot take a lease: each refused at once, with what to use instead."""
    import subprocess
    import sys

    from trajlake.store.catalog import Catalog, CatalogRefused

    straight = {k: v for k, v in env.items() if k != "TRAJLAKE_KAFKA"}  # loadgen into the lake itself
    for command in (["loadgen", "--trajectories", "2"], ["compact"]):
        cmd = [sys.executable, "-c", "from trajlake.cli import run; run()", *command]
        refused = subprocess.run(cmd, env=straight, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert "AccessDenied" in refused.stderr and "AWS_ACCESS_KEY_ID=trajlake-reader" in refused.stderr
        assert "env/writer.env" in refused.stderr

    reader = Catalog(env["TRAJLAKE_CATALOG_URL"])
    try:
        assert reader.get_run("demo") is None and reader.lease_counts("demo") is not None
        with pytest.raises(
            CatalogRefused, match=r"role 'trajlake_reader'.*permission denied for table sampler_leases"
        ):
            reader.claim("demo", ["t-1"], "a-reader")
    finally:
        reader.close()
