"""A local single-node Apache Kafka 4.x broker (KRaft, no ZooKeeper, no Docker) for dev and tests.

`start_broker` fetches `org.apache.kafka:kafka_2.13` and its runtime jars from Maven Central
once (cached under ~/.cache/trajlake/kafka/<version>), formats KRaft storage in the data
directory and starts `kafka.Kafka` detached, with a pid file, in combined broker+controller
mode on 127.0.0.1. `stop_broker` stops it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import uuid
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from trajlake.schemas.errors import TrajlakeError
from trajlake.schemas.retry import wait_until
from trajlake.schemas.settings import Settings
from trajlake.schemas.settings import cache_dir as cache_root

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
PID_FILE = "broker.pid"
PORT_FILE = "broker.port"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>trajlake</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class BrokerError(TrajlakeError, RuntimeError):
    """The local broker could not be fetched, started or stopped; the message says why and what to do."""


class BrokerConfig(Settings):
    """Settings of the local development broker."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_KAFKA_")

    port: int = Field(9092, ge=1, le=65535, description="client (PLAINTEXT) port on 127.0.0.1")
    controller_port: int | None = Field(
        None, ge=1, le=65535, description="KRaft controller port; default: a free port"
    )
    data_dir: Path = Field(Path("./trajlake-kafka"), description="KRaft storage, config, logs and pid file")
    version: str = Field(KAFKA_VERSION, description="Apache Kafka version fetched from Maven Central")
    partitions: int = Field(
        4,
        ge=1,
        validation_alias="TRAJLAKE_KAFKA_BROKER_PARTITIONS",
        description="default partitions of auto-created topics",
    )
    heap: str = Field("512m", description="JVM max heap (-Xmx)")
    log_level: str = Field("WARN", description="broker log4j root level")
    start_timeout_s: float = Field(120.0, gt=0, description="how long to wait for the broker to answer")
    sasl_port: int | None = Field(
        None, ge=1, le=65535, description="also serve SASL_PLAINTEXT (mechanism PLAIN) on this port"
    )
    sasl_users: dict[str, SecretStr] = Field(
        default_factory=dict, description="PLAIN users of the SASL listener: name -> password (never printed)"
    )


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars are cached (env TRAJLAKE_CACHE_DIR overrides ~/.cache/trajlake)."""
    root = cache_root()
    return root / "kafka" / version


def ensure_jars(version: str = KAFKA_VERSION) -> Path:
    """Fetch Kafka and its runtime dependencies with Maven once; return the libs directory."""
    home = cache_dir(version)
    libs = home / "libs"
    done = home / ".complete"
    if done.exists():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # several test sessions may fetch at once
        if done.exists():
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise BrokerError(
                "Maven (`mvn`) is not on PATH; install it (apt-get install maven) "
                "or point TRAJLAKE_KAFKA_BOOTSTRAP at an existing Kafka cluster"
            )
        (home / "pom.xml").write_text(_POM.format(kafka=version, log4j=LOG4J_VERSION))
        cmd = [
            mvn,
            "-q",
            "-B",
            "dependency:copy-dependencies",
            "-DoutputDirectory=libs",
            "-DincludeScope=runtime",
        ]
        log.info("fetching Apache Kafka %s from Maven Central into %s", version, home)
        proc = subprocess.run(cmd, cwd=home, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
            raise BrokerError(
                f"fetching Kafka {version} with Maven failed (exit {proc.returncode}); check network "
                f"access to Maven Central: {(proc.stdout + proc.stderr)[-2000:]}"
            )
        done.write_text(version)
    return libs


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_properties(config: BrokerConfig, controller_port: int) -> str:
    data = config.data_dir.resolve()
    listeners = f"PLAINTEXT://127.0.0.1:{config.port},CONTROLLER://127.0.0.1:{controller_port}"
    advertised = f"PLAINTEXT://127.0.0.1:{config.port}"
    protocols = "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    sasl: dict[str, str] = {}
    if config.sasl_port is not None:
        listeners += f",SASL_PLAINTEXT://127.0.0.1:{config.sasl_port}"
        advertised += f",SASL_PLAINTEXT://127.0.0.1:{config.sasl_port}"
        protocols += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
        users = " ".join(f'user_{name}="{pw.get_secret_value()}"' for name, pw in config.sasl_users.items())
        sasl = {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            ),
        }
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
        "listeners": listeners,
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": protocols,
        **sasl,
        "log.dirs": str(data / "kraft-logs"),
        "num.partitions": str(config.partitions),
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",  # lets tests evict a killed sink quickly
        "num.network.threads": "2",
        "num.io.threads": "2",
        "log.flush.interval.messages": "9223372036854775807",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _java(libs: Path, main: str, args: list[str], config: BrokerConfig) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise BrokerError(
            "Java (17+) is not on PATH; install a JRE (apt-get install openjdk-17-jre-headless)"
        )
    data = config.data_dir.resolve()
    return [
        java,
        f"-Xmx{config.heap}",
        "-Xms128m",
        "-XX:+UseSerialGC",
        *(["-XX:TieredStopAtLevel=1"] if main != "kafka.Kafka" else []),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}",
        f"-Dkafka.logs.dir={data}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def read_pid(data_dir: Path) -> int | None:
    """The pid of the broker started in `data_dir`, if it is still running."""
    pid_file = data_dir / PID_FILE
    if not pid_file.exists():
        return None
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return None
    return pid


def start_broker(config: BrokerConfig) -> str:
    """Start (or find running) the broker in `config.data_dir`; return its bootstrap address."""
    data = config.data_dir.resolve()
    running = read_pid(data)
    if running is not None:
        port = int((data / PORT_FILE).read_text())
        log.info("broker already running in %s (pid %d)", data, running)
        return f"127.0.0.1:{port}"
    if _port_open(config.port):
        raise BrokerError(f"port {config.port} on 127.0.0.1 is already in use; pass --port with a free port")
    libs = ensure_jars(config.version)
    data.mkdir(parents=True, exist_ok=True)
    controller_port = config.controller_port or free_port()
    props = data / "server.properties"
    props.write_text(_server_properties(config, controller_port))
    props.chmod(0o600)  # may hold SASL passwords
    (data / "log4j2.properties").write_text(
        _LOG4J2.format(log_file=data / "server.log", level=config.log_level)
    )
    if not (data / "kraft-logs" / "meta.properties").exists():
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's own ids: a leading "-" would read as an option
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        fmt = _java(
            libs,
            "kafka.tools.StorageTool",
            ["format", "--standalone", "-t", cluster_id, "-c", str(props)],
            config,
        )
        proc = subprocess.run(fmt, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting KRaft storage in {data} failed: {(proc.stdout + proc.stderr)[-2000:]}"
            )
    out = open(data / "broker.out", "ab")  # noqa: SIM115 - handed to the detached child
    proc = subprocess.Popen(
        _java(libs, "kafka.Kafka", [str(props)], config),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    out.close()
    (data / PID_FILE).write_text(str(proc.pid))
    (data / PORT_FILE).write_text(str(config.port))
    bootstrap = f"127.0.0.1:{config.port}"
    try:
        wait_until_ready(bootstrap, config.start_timeout_s, proc=proc)
    except BrokerError:
        stop_broker(data)
        raise
    log.info("Apache Kafka %s listening on %s (pid %d, data %s)", config.version, bootstrap, proc.pid, data)
    return bootstrap


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_until_ready(bootstrap: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Block until the broker answers metadata requests, or raise `BrokerError`."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    host, port = bootstrap.rsplit(":", 1)

    def answers() -> bool:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"the broker exited with code {proc.returncode}; see broker.out and server.log")
        if not _port_open(int(port), host):
            return False
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        try:
            admin.describe_cluster()
            return True
        finally:
            admin.close()

    if not wait_until(answers, timeout_s=timeout_s, interval_s=0.25, retry_on=KafkaError):
        raise BrokerError(f"the broker at {bootstrap} did not answer within {timeout_s:.0f} s")


def stop_broker(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the broker started in `data_dir` (SIGTERM, then SIGKILL); return whether one was running."""
    data = Path(data_dir).resolve()
    pid = read_pid(data)
    if pid is None:
        (data / PID_FILE).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    if not wait_until(lambda: not _alive(pid), timeout_s=timeout_s, interval_s=0.1):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout_s=math.inf, interval_s=0.05)
    (data / PID_FILE).unlink(missing_ok=True)
    return True


def kill_broker(data_dir: Path) -> None:
    """SIGKILL the broker in `data_dir` (fault tests); its storage stays for a restart."""
    data = Path(data_dir).resolve()
    pid = read_pid(data)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), timeout_s=math.inf, interval_s=0.05)
    (data / PID_FILE).unlink(missing_ok=True)


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
    # a zombie whose parent is another process still answers kill(0); check its state
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True
