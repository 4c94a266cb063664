"""`trajlake stack`: the whole deployment as local processes under one directory.

`up` starts, each with its data dir under the stack's directory, a Kafka cluster (`kafka/`,
`ingest.broker`), SeaweedFS (`s3/`, `store.s3_server`), PostgreSQL for the catalog (`postgres/`,
`store.postgres_server`), N sinks in one consumer group, one projector and the dashboard, waiting
for each to answer before the next. `stack.json` records what runs (pids with their start times,
logs, the dashboard's URL) and the environment of each role's clients (`config.ENVS`, also in
`env/<role>.env`: each role has its own S3 key and catalog role, `deploy.credentials`, and its
Kafka principal over TLS, `deploy.kafka_security`); each process gets its role's alone. `status`
probes each part and `down` stops exactly what `up` started.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trajlake.common.retry import wait_until
from trajlake.common.settings import env_name
from trajlake.deploy.config import DEMO, ENVS, GROUP, LAKE, READER, ROLES, SINK, WRITER, StackConfig
from trajlake.deploy.credentials import catalog_roles, write_env_files
from trajlake.deploy.processes import Process, launch
from trajlake.schemas.errors import TrajlakeError

log = logging.getLogger(__name__)

STACK_FILE = "stack.json"
TLS_DIR = "tls"
"""Under `kafka/`: the CA's certificate (clients' TRAJLAKE_KAFKA_SSL_CAFILE) and the nodes' key."""


class StackError(TrajlakeError, RuntimeError):
    """A part of the stack did not start, or the stack's directory holds something else."""


@dataclass
class Stack:
    """What `stack.json` records: each role's environment and the processes the stack started."""

    dir: Path
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    """`config.ENVS` -> the environment those clients need (Kafka, lake, catalog, S3)."""
    brokers: int = 1
    processes: list[Process] = field(default_factory=list)
    kafka_users: dict[str, str] = field(default_factory=dict)
    """Kafka's SCRAM users (`kafka_security.PRINCIPALS`) -> password; the admin's is nowhere else."""

    def save(self) -> None:
        """Write `stack.json`, readable by this user alone (the environments hold the secrets)."""
        path = self.dir / STACK_FILE
        path.touch(mode=0o600)
        body = {"envs": self.envs, "brokers": self.brokers, "processes": [asdict(p) for p in self.processes],
                "kafka_users": self.kafka_users}  # fmt: skip
        path.write_text(json.dumps(body, indent=1))

    @classmethod
    def load(cls, directory: Path) -> Stack | None:
        """The stack recorded in `directory`, or None."""
        directory = Path(directory).resolve()
        path = directory / STACK_FILE
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        processes = [Process(**p) for p in saved["processes"]]
        # none: an older trajlake's
        return cls(
            directory, saved.get("envs", {}), saved["brokers"], processes, saved.get("kafka_users", {})
        )


def stack_env(directory: Path, role: str = WRITER) -> dict[str, str]:
    """The environment of `role`'s clients of the stack in `directory` (Kafka, lake, catalog, S3);
    raises `StackError` if none."""
    stack = Stack.load(directory)
    if stack is None:
        raise StackError(f"no stack in {directory}; start one with `trajlake stack up --dir {directory}`")
    if role not in stack.envs:
        raise StackError(f"the stack in {directory} records no {role}'s environment (an older trajlake's); "
                         "`trajlake stack down` it and start a new one in another --dir")  # fmt: skip
    return stack.envs[role]


def up(config: StackConfig) -> Stack:
    """Start every part that is not running; return the stack once every part answers."""
    directory = config.dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stack = Stack.load(directory) or Stack(directory, brokers=config.brokers)
    if (directory / STACK_FILE).exists() and not stack.kafka_users:  # a failed first `up` saved its users
        raise StackError(
            f"{directory} holds a stack of an older trajlake, without credentials per role (its PostgreSQL "
            "or its Kafka trusts every local client); stop it (`trajlake stack down --dir "
            f"{directory}`) and start a new one in another --dir"
        )
    if stack.brokers != config.brokers:
        raise StackError(
            f"{directory} holds a stack of {stack.brokers} broker(s); pass --brokers {stack.brokers}"
        )
    was_running = running_parts(stack)
    try:
        stack.envs = _start_servers(stack, config)
        stack.save()
        write_env_files(directory, stack.envs)
        os.environ.update(_without_kafka(stack.envs[WRITER]))  # this process creates the lake
        _start_processes(stack, config)
    except BaseException:  # what this call started goes; what ran before stays
        down(directory, keep=was_running)
        raise
    return stack


def _start_servers(stack: Stack, config: StackConfig) -> dict[str, dict[str, str]]:
    """Kafka, SeaweedFS and PostgreSQL (each a no-op when it runs); each client's environment (`ENVS`)."""
    from trajlake.deploy.kafka_security import DEMO as DEMO_USER
    from trajlake.deploy.kafka_security import PRODUCER, kafka_env
    from trajlake.deploy.kafka_security import SINK as SINK_USER
    from trajlake.schemas.settings import LakeSettings
    from trajlake.store.config import CatalogSettings
    from trajlake.store.s3_server import S3Layout, S3ServerConfig, free_port, start_s3

    d, timeout = stack.dir, config.start_timeout_s
    bootstrap = _start_kafka(stack, config)
    s3_dir = d / "s3"
    saved = S3Layout.load(s3_dir)
    layout = start_s3(S3ServerConfig(port=saved.port if saved else free_port(), data_dir=s3_dir,
                                     start_timeout_s=timeout))  # fmt: skip
    catalogs = _start_catalog(stack, timeout)
    envs = {
        role: {env_name(LakeSettings, "lake"): LAKE, env_name(CatalogSettings, "catalog_url"): catalogs[role],
               **layout.env(role)}
        for role in ROLES
    }  # fmt: skip
    envs[SINK] = dict(envs[WRITER])  # the writer's lake and catalog, the sink principal's Kafka
    envs[DEMO] = dict(envs[WRITER])
    tls = d / "kafka" / TLS_DIR
    for name, user in ((WRITER, PRODUCER), (READER, PRODUCER), (SINK, SINK_USER), (DEMO, DEMO_USER)):
        envs[name] = {**kafka_env(bootstrap, user, stack.kafka_users[user], tls), **envs[name]}
    return {name: envs[name] for name in ENVS}


def _start_kafka(stack: Stack, config: StackConfig) -> str:
    """The cluster (a no-op when it runs) with its certificates, SCRAM users, the events topic and
    the ACLs (`kafka_security`); return the bootstrap list."""
    from trajlake.deploy.kafka_security import ADMIN, PRINCIPALS, acls, kafka_acls, make_tls
    from trajlake.ingest.broker import BrokerConfig, Cluster, free_ports, start_broker
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin
    from trajlake.ingest.config import KafkaConfig

    kafka_dir = stack.dir / "kafka"
    cluster = Cluster.load(kafka_dir)
    if cluster is not None and not stack.kafka_users:
        raise StackError(
            f"a Kafka cluster is laid out in {kafka_dir}, but {STACK_FILE} holds no passwords of its users "
            "(gone, or an older trajlake's); `trajlake stack down` it and start a new one in another --dir"
        )
    make_tls(kafka_dir / TLS_DIR)
    stack.kafka_users = {
        user: stack.kafka_users.get(user) or secrets.token_urlsafe(24) for user in PRINCIPALS
    }
    stack.save()  # before the nodes are formatted with them
    broker = BrokerConfig(
        port=cluster.nodes[0].port if cluster else free_ports(config.brokers), nodes=config.brokers,
        data_dir=kafka_dir, start_timeout_s=config.start_timeout_s, tls_dir=kafka_dir / TLS_DIR,
        scram_users=stack.kafka_users, super_users=[ADMIN],
    )  # fmt: skip
    bootstrap = start_broker(broker)
    with KafkaAdmin(KafkaConfig(bootstrap=bootstrap, **broker.client_settings())) as admin:
        admin.create_topic()  # replicated as the cluster allows, before any client
        admin.grant(kafka_acls(acls()))
    return bootstrap


def _without_kafka(env: dict[str, str]) -> dict[str, str]:
    """`env` without its Kafka settings and credentials (for a process that does not use Kafka)."""
    return {name: value for name, value in env.items() if not name.startswith("TRAJLAKE_KAFKA")}


def _start_catalog(stack: Stack, timeout_s: float) -> dict[str, str]:
    """PostgreSQL (a no-op when it runs) with the catalog migrated and its roles; role -> URL."""
    from sqlalchemy.engine import make_url

    from trajlake.store.config import CatalogSettings
    from trajlake.store.postgres_server import admin_url, running_pid, start_postgres
    from trajlake.store.s3_server import free_port

    pg_dir = stack.dir / "postgres"
    saved = {
        role: make_url(env[env_name(CatalogSettings, "catalog_url")]) for role, env in stack.envs.items()
    }
    known = saved[READER].port if READER in saved else None
    if (
        running_pid(pg_dir) is None
    ):  # a restart keeps its port: the roles' URLs, clients hold them, stay right
        port = known or free_port()
        admin = start_postgres(pg_dir, port, timeout_s, password_auth=True)
    elif known:
        port = known
        admin = admin_url(pg_dir, port)
    else:
        raise StackError(
            f"a PostgreSQL runs in {pg_dir} but {STACK_FILE} is gone; `trajlake stack down` first"
        )
    return catalog_roles(admin, port, {role: url.password for role, url in saved.items()})


def _start_processes(stack: Stack, config: StackConfig) -> None:
    """The sinks (awaited until all are members of the group), the projector and the dashboard."""
    from trajlake.store.lake import Lake
    from trajlake.store.s3_server import free_port

    Lake(LAKE).delta("events")  # created once here: the sinks append to it, the dashboard reads it
    running = {p.name for p in stack.processes if p.is_alive()}
    stack.processes = [p for p in stack.processes if p.name in running]
    wanted: dict[str, tuple[str, list[str], str | None]] = {
        f"sink-{i}": (SINK, ["ingest", "--lake", LAKE, "--group", GROUP, "--no-update-projections"], None)
        for i in range(1, config.sinks + 1)
    }
    wanted["projector"] = (WRITER, ["project", "--lake", LAKE, "--follow"], None)
    port = free_port()
    wanted["dashboard"] = (READER, ["dashboard", "--lake", LAKE, "--host", "127.0.0.1", "--port", str(port)],
                           f"http://127.0.0.1:{port}")  # fmt: skip
    for name, (role, args, url) in wanted.items():
        if name not in running:  # the projector and the dashboard use no Kafka: they get no credentials
            env = stack.envs[role] if role == SINK else _without_kafka(stack.envs[role])
            stack.processes.append(launch(name, args, env, stack.dir / f"{name}.log", url))
            stack.save()
    _await(stack, "the sinks joined their group", lambda: _group_members(stack) >= config.sinks,
           config.start_timeout_s)  # fmt: skip
    _await(
        stack,
        "the dashboard answers",
        lambda: _http_ok(_process(stack, "dashboard").url),
        config.start_timeout_s,
    )


def _await(stack: Stack, what: str, ready: Callable[[], bool], timeout_s: float) -> None:
    """Wait until `ready()`, or raise `StackError` naming a process that died or the timeout."""
    import httpx
    from kafka.errors import KafkaError

    def check() -> bool:
        if dead := [p for p in stack.processes if not p.is_alive()]:
            raise StackError(f"{dead[0].name} exited while starting; see {dead[0].log}")
        return ready()

    if not wait_until(
        check, timeout_s=timeout_s, interval_s=0.25, retry_on=(KafkaError, httpx.TransportError)
    ):
        raise StackError(f"not within {timeout_s:.0f} s: {what}; see the logs in {stack.dir}")


def _process(stack: Stack, name: str) -> Process:
    return next(p for p in stack.processes if p.name == name)


def _group_members(stack: Stack) -> int:
    from trajlake.deploy.kafka_security import kafka_config
    from trajlake.ingest.bus.kafka_admin import KafkaAdmin

    with KafkaAdmin(
        kafka_config(stack.envs[SINK])
    ) as admin:  # the sinks' own principal describes their group
        state, members = admin.group(GROUP)
    return members if state == "Stable" else 0


def _http_ok(url: str | None) -> bool:
    import httpx

    return url is not None and httpx.get(url, timeout=5).status_code == 200


def running_parts(stack: Stack) -> set[str]:
    """The names of the stack's parts running now (whatever answers)."""
    from trajlake.ingest.broker import node_pids
    from trajlake.store import postgres_server, s3_server

    running = {p.name for p in stack.processes if p.is_alive()}
    for name, is_running in (("kafka", lambda d: bool(node_pids(d))), ("s3", s3_server.running_pid),
                             ("postgres", postgres_server.running_pid)):  # fmt: skip
        if is_running(stack.dir / name):
            running.add(name)
    return running


def down(directory: Path, keep: Collection[str] = ()) -> list[str]:
    """Stop what the stack in `directory` started (its processes, then the servers) but the parts
    named in `keep`; return the names of the parts that were running. Stopping a stopped stack
    stops nothing."""
    from trajlake.ingest.broker import stop_broker
    from trajlake.store.postgres_server import stop_postgres
    from trajlake.store.s3_server import stop_s3

    directory = Path(directory).resolve()
    stack = Stack.load(directory)
    stopped = [p.name for p in (stack.processes if stack else []) if p.name not in keep and p.stop()]
    for name, stop in (("kafka", stop_broker), ("s3", stop_s3), ("postgres", stop_postgres)):
        if name not in keep and (directory / name).exists() and stop(directory / name):
            stopped.append(name)
    return stopped
