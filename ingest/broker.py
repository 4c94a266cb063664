"""A local Apache Kafka 4.x cluster of one or more KRaft nodes (no ZooKeeper, no Docker) for dev and tests.

`start_broker` fetches Kafka's jars once (`kafka_jars`), lays out N combined broker+controller
nodes under the data directory (`cluster.json`: every node's ports; `node-<id>/`: its
server.properties, KRaft storage, `server.log` and pid file), formats them with one cluster id
and a static controller quorum, starts every node that is not running, detached, and waits
until every broker has registered. `stop_broker` stops them all; `kill_broker` SIGKILLs one and
`start_broker` again restarts it (fault tests).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from trajlake.common.procs import is_zombie
from trajlake.common.retry import wait_until
from trajlake.common.settings import Settings
from trajlake.ingest.config import MIN_INSYNC_REPLICAS_HELP, REPLICATION_FACTOR_HELP, replication
from trajlake.ingest.kafka_jars import KAFKA_VERSION, BrokerError, ensure_jars, java_command

log = logging.getLogger(__name__)

PID_FILE = "broker.pid"
CLUSTER_FILE = "cluster.json"
CA_FILE, KEYSTORE_FILE = "ca.pem", "broker.pem"
"""In `tls_dir`: the CA that signed the nodes' certificate, and their key and certificate (PEM)."""
BROKER_PRINCIPAL = "CN=trajlake-broker"
"""The subject of the nodes' certificate: their principal on the TLS listeners (a super user)."""
SCRAM = "SCRAM-SHA-512"

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class BrokerConfig(Settings):
    """Settings of the local development cluster."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_KAFKA_")

    port: int = Field(
        9092,
        ge=1,
        le=65535,
        description="client (PLAINTEXT) port on 127.0.0.1 of node 1; node i has port + i - 1",
    )
    controller_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="KRaft controller port of node 1 (node i: + i - 1); default: free ports",
    )
    nodes: int = Field(
        1, ge=1, le=9, description="combined broker+controller nodes; 3 keep writing with one down"
    )
    replication_factor: int | None = Field(None, ge=1, description=REPLICATION_FACTOR_HELP)
    min_insync_replicas: int | None = Field(None, ge=1, description=MIN_INSYNC_REPLICAS_HELP)
    data_dir: Path = Field(
        Path("./trajlake-kafka"), description="every node's storage, config, logs and pid file"
    )
    version: str = Field(KAFKA_VERSION, description="Apache Kafka version fetched from Maven Central")
    partitions: int = Field(
        4,
        ge=1,
        validation_alias="TRAJLAKE_KAFKA_BROKER_PARTITIONS",
        description="default partitions of auto-created topics",
    )
    heap: str = Field("512m", description="JVM max heap of each node (-Xmx)")
    log_level: str = Field("INFO", description="log4j root level of each node's server.log")
    start_timeout_s: float = Field(120.0, gt=0, description="how long to wait for every broker to register")
    sasl_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="also serve SASL_PLAINTEXT (mechanism PLAIN) on this port (node i: + i - 1)",
    )
    sasl_users: dict[str, SecretStr] = Field(
        default_factory=dict, description="PLAIN users of the SASL listener: name -> password (never printed)"
    )
    tls_dir: Path | None = Field(
        None,
        description=f"secure the cluster with {CA_FILE} and {KEYSTORE_FILE} (the nodes' key and certificate, "
        f"subject {BROKER_PRINCIPAL}) in this directory: clients speak SASL_SSL with {SCRAM} on the client "
        "port, nodes and controllers TLS with client certificates, ACLs decide the rest; unset: PLAINTEXT, "
        "no authorization",
    )
    scram_users: dict[str, SecretStr] = Field(
        default_factory=dict,
        description=f"with tls_dir: {SCRAM} users created when a node's storage is formatted: name -> "
        "password (never printed)",
    )
    super_users: list[str] = Field(
        default_factory=list,
        description="with tls_dir: SCRAM users ACLs do not restrict (the first is how this process checks "
        "the nodes are up)",
    )

    @model_validator(mode="after")
    def _check_replication(self) -> BrokerConfig:
        replication(self.nodes, self.replication_factor, self.min_insync_replicas)  # raises ValueError
        if self.tls_dir is not None and not (self.super_users and self.super_users[0] in self.scram_users):
            raise ValueError(
                "tls_dir needs a super user among scram_users (this process checks the nodes with it)"
            )
        return self

    def client_settings(self) -> dict[str, Any]:
        """The `KafkaConfig` security settings of the first super user (none without tls_dir)."""
        if self.tls_dir is None:
            return {}
        user = self.super_users[0]
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": SCRAM, "sasl_username": user,
                "sasl_password": self.scram_users[user], "ssl_cafile": self.tls_dir / CA_FILE}  # fmt: skip


@dataclass(frozen=True)
class Node:
    """One node of a local cluster: its ports and its directory."""

    id: int
    port: int
    controller_port: int
    sasl_port: int | None
    dir: Path
    internal_port: int | None = None
    """With TLS: the nodes' own listener (TLS with client certificates; the client port is SASL_SSL)."""


@dataclass(frozen=True)
class Cluster:
    """The nodes laid out in one data directory (`cluster.json`)."""

    data_dir: Path
    cluster_id: str
    nodes: tuple[Node, ...]

    @property
    def bootstrap(self) -> str:
        """HOST:PORT of every node, comma-separated."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def save(self) -> None:
        """Write `cluster.json`."""
        nodes = [{"id": n.id, "port": n.port, "controller_port": n.controller_port, "sasl_port": n.sasl_port,
                  "internal_port": n.internal_port} for n in self.nodes]  # fmt: skip
        (self.data_dir / CLUSTER_FILE).write_text(json.dumps({"cluster_id": self.cluster_id, "nodes": nodes}))

    @classmethod
    def load(cls, data_dir: Path) -> Cluster | None:
        """The cluster laid out in `data_dir`, or None."""
        data_dir = Path(data_dir).resolve()
        path = data_dir / CLUSTER_FILE
        if not path.exists():
            return None
        saved = json.loads(path.read_text())
        nodes = tuple(Node(**n, dir=data_dir / f"node-{n['id']}") for n in saved["nodes"])
        return cls(data_dir, saved["cluster_id"], nodes)

    @classmethod
    def plan(cls, config: BrokerConfig) -> Cluster:
        """A new layout: node i on port + i - 1, its controller on a free port (or controller_port + i - 1)."""
        data = config.data_dir.resolve()
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's own ids: a leading "-" would read as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        # the kernel may hand out a port again once its probe socket closed: each is taken once
        taken = set(range(config.port, config.port + config.nodes))

        def another() -> int:
            taken.add(port := free_port(taken))
            return port

        nodes = tuple(
            Node(
                id=i + 1,
                port=config.port + i,
                controller_port=config.controller_port + i if config.controller_port else another(),
                sasl_port=config.sasl_port + i if config.sasl_port else None,
                dir=data / f"node-{i + 1}",
                internal_port=another() if config.tls_dir is not None else None,
            )
            for i in range(config.nodes)
        )
        return cls(data, cluster_id, nodes)


def free_port(taken: Collection[int] = ()) -> int:
    """A TCP port that is free on 127.0.0.1 right now, and not among `taken`."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def free_ports(count: int) -> int:
    """The first of `count` consecutive TCP ports free on 127.0.0.1 right now (`--port` of `--nodes count`)."""
    while True:
        base = free_port()
        if base + count <= 65536 and not any(_port_open(base + i) for i in range(1, count)):
            return base


def _server_properties(config: BrokerConfig, cluster: Cluster, node: Node) -> str:
    rf, min_isr = replication(len(cluster.nodes), config.replication_factor, config.min_insync_replicas)
    listeners = (
        _secure_listeners(config, node) if config.tls_dir is not None else _plain_listeners(config, node)
    )
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.id),
        "controller.quorum.voters": ",".join(f"{n.id}@127.0.0.1:{n.controller_port}" for n in cluster.nodes),
        "controller.listener.names": "CONTROLLER",
        **listeners,
        "log.dirs": str(node.dir / "kraft-logs"),
        "num.partitions": str(config.partitions),
        "auto.create.topics.enable": "true",
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",  # lets tests evict a killed sink quickly
        "num.network.threads": "2",
        "num.io.threads": "2",
        "log.flush.interval.messages": "9223372036854775807",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _plain_listeners(config: BrokerConfig, node: Node) -> dict[str, str]:
    """PLAINTEXT for clients, nodes and controllers (and SASL_PLAINTEXT with PLAIN on `sasl_port`)."""
    listeners = f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
    advertised = f"PLAINTEXT://127.0.0.1:{node.port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    sasl: dict[str, str] = {}
    if node.sasl_port is not None:
        listeners += f",SASL_PLAINTEXT://127.0.0.1:{node.sasl_port}"
        advertised += f",SASL_PLAINTEXT://127.0.0.1:{node.sasl_port}"
        protocols += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
        users = " ".join(f'user_{name}="{pw.get_secret_value()}"' for name, pw in config.sasl_users.items())
        sasl = {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
        }
    return {"listeners": listeners, "advertised.listeners": advertised, "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": protocols, **sasl}  # fmt: skip


def _secure_listeners(config: BrokerConfig, node: Node) -> dict[str, str]:
    """CLIENT: SASL_SSL with SCRAM on `port`; BROKER (between nodes) and CONTROLLER: TLS, each side
    showing the nodes' certificate (`ssl.client.auth=required`); the StandardAuthorizer with no
    access where no ACL grants it, but for the nodes and the super users."""
    assert config.tls_dir is not None and node.internal_port is not None
    tls = config.tls_dir.resolve()
    supers = ";".join(f"User:{name}" for name in (BROKER_PRINCIPAL, *config.super_users))
    return {
        "listeners": f"CLIENT://127.0.0.1:{node.port},BROKER://127.0.0.1:{node.internal_port},"
        f"CONTROLLER://127.0.0.1:{node.controller_port}",
        "advertised.listeners": f"CLIENT://127.0.0.1:{node.port},BROKER://127.0.0.1:{node.internal_port}",
        "inter.broker.listener.name": "BROKER",
        "listener.security.protocol.map": "CLIENT:SASL_SSL,BROKER:SSL,CONTROLLER:SSL",
        "sasl.enabled.mechanisms": SCRAM,
        f"listener.name.client.{SCRAM.lower()}.sasl.jaas.config": (
            "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        ),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls / KEYSTORE_FILE),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls / CA_FILE),
        "listener.name.broker.ssl.client.auth": "required",
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": supers,
    }


def _pid(pid_file: Path) -> int | None:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None
    return pid if _alive(pid) else None


def node_pids(data_dir: Path) -> dict[int, int]:
    """node id -> pid of each node of the cluster in `data_dir` that is running."""
    cluster = Cluster.load(data_dir)
    pids = {n.id: _pid(n.dir / PID_FILE) for n in cluster.nodes} if cluster else {}
    return {node: pid for node, pid in pids.items() if pid is not None}


def _legacy_pid(data_dir: Path) -> int | None:
    """A single-node broker an older trajlake started in `data_dir` itself (no cluster.json)."""
    return _pid(Path(data_dir).resolve() / PID_FILE)


def _layout(config: BrokerConfig) -> Cluster:
    """The cluster of `config.data_dir` as laid out before, or a new layout with free ports."""
    cluster = Cluster.load(config.data_dir)
    if cluster is None:
        cluster = Cluster.plan(config)
        if busy := [n.port for n in cluster.nodes if _port_open(n.port)]:
            span = f"ports {config.port}..{config.port + config.nodes - 1}" if config.nodes > 1 else "--port"
            raise BrokerError(
                f"port {busy[0]} on 127.0.0.1 is already in use; pass --port with a free port "
                f"(the nodes take {span})"
            )
        config.data_dir.resolve().mkdir(parents=True, exist_ok=True)
        cluster.save()
    elif len(cluster.nodes) != config.nodes:
        raise BrokerError(
            f"{cluster.data_dir} holds a {len(cluster.nodes)}-node cluster; pass --nodes {len(cluster.nodes)} "
            "or another --data-dir"
        )
    return cluster


def start_broker(config: BrokerConfig) -> str:
    """Start every node of the cluster in `config.data_dir` that is not running (all, the first
    time); return the bootstrap list once every broker has registered."""
    if (legacy := _legacy_pid(config.data_dir)) is not None:
        log.info("a broker of an older trajlake runs in %s (pid %d)", config.data_dir, legacy)
        return f"127.0.0.1:{(config.data_dir / 'broker.port').read_text().strip()}"
    cluster = _layout(config)
    down = [n for n in cluster.nodes if _pid(n.dir / PID_FILE) is None]
    if not down:
        log.info("cluster already running in %s", cluster.data_dir)
        return cluster.bootstrap
    if busy := [n.port for n in down if _port_open(n.port)]:
        raise BrokerError(f"port {busy[0]} of a stopped node is in use by another process; free it first")
    libs = ensure_jars(config.version)
    for node in down:
        _configure(config, cluster, node)
    _format(
        libs, cluster, [n for n in down if not (n.dir / "kraft-logs" / "meta.properties").exists()], config
    )
    procs = {node.id: _launch(libs, node, config) for node in down}
    try:
        wait_until_ready(
            cluster.bootstrap, config.start_timeout_s, procs, len(cluster.nodes), config.client_settings()
        )
    except BrokerError:
        for node in down:
            _stop_pid(node.dir / PID_FILE, timeout_s=30.0)
        raise
    log.info("Apache Kafka %s: %d node(s) on %s (data %s)", config.version, len(cluster.nodes),
             cluster.bootstrap, cluster.data_dir)  # fmt: skip
    return cluster.bootstrap


def _configure(config: BrokerConfig, cluster: Cluster, node: Node) -> None:
    node.dir.mkdir(parents=True, exist_ok=True)
    props = node.dir / "server.properties"
    props.write_text(_server_properties(config, cluster, node))
    props.chmod(0o600)  # may hold SASL passwords
    (node.dir / "log4j2.properties").write_text(
        _LOG4J2.format(log_file=node.dir / "server.log", level=config.log_level)
    )


def _format(libs: Path, cluster: Cluster, nodes: list[Node], config: BrokerConfig) -> None:
    """Format the KRaft storage of `nodes` with the cluster's id and the SCRAM users (with TLS), side
    by side (a JVM each)."""
    scram = [] if config.tls_dir is None else [
        arg for name, pw in config.scram_users.items()
        for arg in ("--add-scram", f"{SCRAM}=[name={name},password={pw.get_secret_value()}]")
    ]  # fmt: skip
    procs = {
        node: subprocess.Popen(
            java_command(
                libs,
                "kafka.tools.StorageTool",
                ["format", "-t", cluster.cluster_id, "-c", str(node.dir / "server.properties"), *scram],
                node.dir,
                config.heap,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in nodes
    }
    for node, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            for pw in config.scram_users.values():
                out = out.replace(pw.get_secret_value(), "**********")
            raise BrokerError(f"formatting KRaft storage in {node.dir} failed: {out[-2000:]}")


def _launch(libs: Path, node: Node, config: BrokerConfig) -> subprocess.Popen:
    with open(node.dir / "broker.out", "ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            java_command(libs, "kafka.Kafka", [str(node.dir / "server.properties")], node.dir, config.heap),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (node.dir / PID_FILE).write_text(str(proc.pid))
    return proc


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until_ready(
    bootstrap: str,
    timeout_s: float = 60.0,
    procs: Mapping[int, subprocess.Popen] | None = None,
    brokers: int = 1,
    security: Mapping[str, Any] | None = None,
) -> None:
    """Block until `brokers` brokers of the cluster at `bootstrap` have registered, or raise `BrokerError`;
    `security`: the `KafkaConfig` settings to connect with (`BrokerConfig.client_settings`)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from trajlake.ingest.config import KafkaConfig

    client = KafkaConfig(bootstrap=bootstrap, **(security or {})).client_kwargs()

    registered: list[int] = []

    def answers() -> bool:
        for node_id, proc in (procs or {}).items():
            if proc.poll() is not None:
                raise BrokerError(
                    f"node {node_id} exited with code {proc.returncode}; see node-{node_id}/server.log and broker.out"
                )
        if not any(_port_open(int(server.rsplit(":", 1)[1])) for server in bootstrap.split(",")):
            return False
        admin = KafkaAdminClient(**client, request_timeout_ms=5000)
        try:
            brokers_up = admin.describe_cluster()["brokers"]
            registered[:] = sorted(b["broker_id"] for b in brokers_up if not b.get("is_fenced"))
        finally:
            admin.close()
        return len(registered) >= brokers

    if not wait_until(answers, timeout_s=timeout_s, interval_s=0.25, retry_on=KafkaError):
        raise BrokerError(
            f"{len(registered)} of {brokers} brokers at {bootstrap} registered within {timeout_s:.0f} s "
            f"(registered: {registered or 'none'}); see each node's server.log"
        )


def stop_broker(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop every node started in `data_dir` (SIGTERM, then SIGKILL); return whether any was running."""
    data = Path(data_dir).resolve()
    cluster = Cluster.load(data)
    pid_files = [n.dir / PID_FILE for n in cluster.nodes] if cluster else []
    pid_files.append(data / PID_FILE)  # a broker of an older trajlake
    running = [(f, pid) for f in pid_files if (pid := _pid(f)) is not None]
    for _, pid in running:  # all at once: a node waits for its peers' controllers when it stops last
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid_file, _ in running:
        _stop_pid(pid_file, max(0.0, deadline - time.monotonic()))
    for pid_file in pid_files:
        pid_file.unlink(missing_ok=True)
    return bool(running)


def _stop_pid(pid_file: Path, timeout_s: float) -> None:
    pid = _pid(pid_file)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: not _alive(pid), timeout_s=timeout_s, interval_s=0.1):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not _alive(pid), timeout_s=math.inf, interval_s=0.05)
    pid_file.unlink(missing_ok=True)


def kill_broker(data_dir: Path, node: int | None = None) -> None:
    """SIGKILL node `node` of the cluster in `data_dir` (every node if None); storage stays for a restart."""
    cluster = Cluster.load(data_dir)
    pid_files = [n.dir / PID_FILE for n in (cluster.nodes if cluster else ()) if node in (None, n.id)]
    for pid_file in pid_files:
        pid = _pid(pid_file)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda pid=pid: not _alive(pid), timeout_s=math.inf, interval_s=0.05)
        pid_file.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # our own child: reap it so it is not a zombie
        if reaped == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not is_zombie(pid)  # a zombie whose parent is another process still answers kill(0)
