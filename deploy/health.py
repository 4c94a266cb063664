"""`trajlake stack status`: each part of a stack, alive and answering a real request."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trajlake.common.settings import env_name
from trajlake.deploy.config import READER
from trajlake.deploy.stack import Stack
from trajlake.schemas.settings import KafkaSwitch
from trajlake.store.config import CatalogSettings


@dataclass(frozen=True)
class PartHealth:
    """One part's health: whether it runs and answers, and what was seen."""

    name: str
    ok: bool
    detail: str


def stack_health(stack: Stack) -> list[PartHealth]:
    """The servers' health (a metadata request, an S3 request, a SQL connection), then each process's."""
    parts = [_kafka(stack), _s3(stack.dir / "s3"), _postgres(stack)]
    for p in stack.processes:
        alive = p.is_alive()
        detail = f"pid {p.pid}, log {p.log}" if alive else f"not running; see {p.log}"
        if p.url and alive:
            try:
                alive = _http_status(p.url) == 200
                detail = f"pid {p.pid}, {p.url} answers" + ("" if alive else " with an error")
            except OSError as err:
                alive, detail = False, f"pid {p.pid}, {p.url} does not answer ({err})"
        parts.append(PartHealth(p.name, alive, detail))
    return parts


def _http_status(url: str) -> int:
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError as err:
        raise OSError(str(err)) from None


def _kafka(stack: Stack) -> PartHealth:
    from kafka.errors import KafkaError

    from trajlake.deploy.kafka_security import kafka_config
    from trajlake.ingest.broker import node_pids
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin

    running = len(node_pids(stack.dir / "kafka"))
    bootstrap = stack.envs.get(READER, {}).get(env_name(KafkaSwitch, "kafka"), "")
    if not running:
        return PartHealth("kafka", False, f"no node running; see {stack.dir / 'kafka'}")
    try:
        with KafkaAdmin(kafka_config(stack.envs[READER]), timeout_s=5) as admin:  # a producer's principal
            brokers = admin.brokers()
    except KafkaError as err:
        return PartHealth(
            "kafka", False, f"{running} node(s) running, metadata refused at {bootstrap}: {err}"
        )
    ok = running == len(brokers) == stack.brokers
    return PartHealth(
        "kafka", ok, f"{running} of {stack.brokers} node(s) running, {len(brokers)} registered at {bootstrap}"
    )


def _s3(s3_dir: Path) -> PartHealth:
    from trajlake.store.s3_server import S3Layout, running_pid

    layout, pid = S3Layout.load(s3_dir), running_pid(s3_dir)
    if layout is None or pid is None:
        return PartHealth("s3", False, f"SeaweedFS not running; see {s3_dir / 'weed.log'}")
    endpoint = layout.env()["AWS_ENDPOINT_URL"]
    try:
        _http_status(endpoint)  # any HTTP answer (403 without credentials) is the S3 API's
    except OSError as err:
        return PartHealth("s3", False, f"pid {pid}, {endpoint} does not answer ({err})")
    return PartHealth("s3", True, f"pid {pid}, S3 answers at {endpoint}")


def _postgres(stack: Stack) -> PartHealth:
    import psycopg
    from sqlalchemy.engine import make_url

    from trajlake.store.postgres_server import running_pid

    pid = running_pid(stack.dir / "postgres")
    if pid is None:
        return PartHealth("postgres", False, f"not running; see {stack.dir / 'postgres' / 'server.log'}")
    if READER not in stack.envs:
        return PartHealth(
            "postgres", False, f"pid {pid}, but {stack.dir} records no catalog URL (an older stack)"
        )
    url = make_url(stack.envs[READER][env_name(CatalogSettings, "catalog_url")])
    try:
        with psycopg.connect(host=url.host, port=url.port, user=url.username, password=url.password,
                             dbname=url.database, connect_timeout=5):  # fmt: skip
            pass
    except psycopg.OperationalError as err:
        return PartHealth("postgres", False, f"pid {pid}, refuses connections: {err}")
    return PartHealth("postgres", True, f"pid {pid}, accepts connections on {url.host}:{url.port}")
