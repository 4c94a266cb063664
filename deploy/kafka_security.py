"""Kafka security of `trajlake stack`: a CA and the nodes' certificate, SCRAM principals per role, ACLs.

Clients speak SASL_SSL with SCRAM-SHA-512 to the brokers; the nodes speak TLS to each other and
to their controllers, each side showing the one certificate this module issues (`CN=trajlake-broker`,
signed by a CA made here with the openssl CLI, whose key is deleted once it has signed). SCRAM
cannot secure KRaft's controller listener (a controller must authenticate a node before any SCRAM
credential exists in the metadata it serves), hence client certificates there and between brokers.
The brokers' `StandardAuthorizer` refuses what no ACL allows (`allow.everyone.if.no.acl.found=false`);
`acls` lists what each principal may do (`PRINCIPALS`).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajlake.common.settings import env_name
from trajlake.deploy.config import GROUP
from trajlake.ingest.broker import BROKER_PRINCIPAL, CA_FILE, KEYSTORE_FILE, SCRAM
from trajlake.ingest.config import DEFAULT_TOPIC, KafkaConfig
from trajlake.schemas.errors import TrajlakeError
from trajlake.schemas.settings import KafkaSwitch

PRODUCER, SINK, DEMO, ADMIN = "trajlake-producer", "trajlake-sink", "trajlake-demo", "trajlake-admin"
PRINCIPALS = (PRODUCER, SINK, DEMO, ADMIN)
"""The stack's SCRAM users: producers (loadgen, trainers' publishers) write the events topic; the
sinks read it and commit their group; `trajlake demo --stack` runs its own topic and sink per run;
the admin (a super user) is used by `stack up` alone, to create the topic and grant these ACLs,
and is handed to no process."""
DEMO_TOPICS, DEMO_GROUPS = "trajlake-demo-", "trajlake-demo-sink-"
"""Prefixes of what `trajlake demo --stack` creates and reads: a topic and a group per run."""


class TlsError(TrajlakeError, RuntimeError):
    """The stack's certificates could not be made."""


@dataclass(frozen=True)
class Acl:
    """One ALLOW rule: `principal` (a SCRAM user) may do `operation` on a resource."""

    principal: str
    resource: str
    """TOPIC, GROUP or CLUSTER (kafka-python's `ResourceType` names)."""
    name: str
    operation: str
    """kafka-python's `ACLOperation` names: READ, WRITE, DESCRIBE, CREATE, IDEMPOTENT_WRITE…"""
    prefixed: bool = False


def acls(topic: str = DEFAULT_TOPIC, group: str = GROUP) -> list[Acl]:
    """What the producer and the sink principals may do; everything else is refused (the admin and
    the nodes are super users). The producer describes the topic's configuration when it reports
    undelivered messages (`cluster_state`); the sink's lag and `--until-idle` checks list offsets
    and describe its group, which READ on each allows."""
    producer = [Acl(PRODUCER, "TOPIC", topic, op) for op in ("WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")]
    producer.append(Acl(PRODUCER, "CLUSTER", "kafka-cluster", "IDEMPOTENT_WRITE"))  # acks=all, idempotent
    demo = [
        Acl(DEMO, "TOPIC", DEMO_TOPICS, op, prefixed=True) for op in ("CREATE", "WRITE", "READ", "DESCRIBE")
    ]
    demo.append(Acl(DEMO, "GROUP", DEMO_GROUPS, "READ", prefixed=True))  # the demo's own sink thread
    demo.append(Acl(DEMO, "CLUSTER", "kafka-cluster", "IDEMPOTENT_WRITE"))
    sink = [
        Acl(SINK, "TOPIC", topic, "READ"),
        Acl(SINK, "TOPIC", topic, "DESCRIBE"),
        Acl(SINK, "GROUP", group, "READ"),
    ]
    return [*producer, *demo, *sink]


def kafka_acls(rules: list[Acl]) -> list[object]:
    """`rules` as kafka-python `ACL`s, for `KafkaAdminClient.create_acls`."""
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    return [
        ACL(
            principal=f"User:{r.principal}",
            host="*",
            operation=ACLOperation[r.operation],
            permission_type=ACLPermissionType.ALLOW,
            resource_pattern=ResourcePattern(
                ResourceType[r.resource],
                r.name,
                ACLResourcePatternType.PREFIXED if r.prefixed else ACLResourcePatternType.LITERAL,
            ),
        )
        for r in rules
    ]


def make_tls(tls_dir: Path) -> None:
    """Write `ca.pem` and the nodes' `broker.pem` (key and certificate, for 127.0.0.1 and localhost)
    into `tls_dir` (mode 700) unless both are there; the CA's key is deleted once it has signed."""
    ca, keystore = tls_dir / CA_FILE, tls_dir / KEYSTORE_FILE
    if ca.exists() and keystore.exists():
        return
    if shutil.which("openssl") is None:
        raise TlsError("the openssl command is not on PATH; install it (apt-get install openssl)")
    tls_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    tls_dir.chmod(0o700)
    work = {name: tls_dir / name for name in ("ca.key", "broker.key", "broker.csr", "broker.crt", "ext.cnf")}
    work["ext.cnf"].write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    try:
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", work["ca.key"], "-out", ca,
                 "-days", "3650", "-subj", "/CN=trajlake-stack-ca")  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", work["broker.key"], "-out", work["broker.csr"],
                 "-subj", f"/{BROKER_PRINCIPAL}")  # fmt: skip
        _openssl("x509", "-req", "-in", work["broker.csr"], "-CA", ca, "-CAkey", work["ca.key"], "-CAcreateserial",
                 "-out", work["broker.crt"], "-days", "3650", "-extfile", work["ext.cnf"])  # fmt: skip
        keystore.touch(mode=0o600)
        keystore.write_text(work["broker.key"].read_text() + work["broker.crt"].read_text())
    finally:
        for path in [*work.values(), tls_dir / "ca.srl"]:
            path.unlink(missing_ok=True)


def _openssl(*args: str | Path) -> None:
    done = subprocess.run(["openssl", *map(str, args)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TlsError(f"openssl {args[0]} failed (exit {done.returncode}): {done.stderr[-1000:]}")


SECURITY_FIELDS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile")
"""The `KafkaConfig` settings a client of the stack's Kafka needs beside its bootstrap."""


def kafka_env(bootstrap: str, user: str, password: str, tls_dir: Path) -> dict[str, str]:
    """The environment of a client connecting to the stack's Kafka as `user`."""
    values = ("SASL_SSL", SCRAM, user, password, str(tls_dir / CA_FILE))
    return {env_name(KafkaSwitch, "kafka"): bootstrap,
            **{env_name(KafkaConfig, f): v for f, v in zip(SECURITY_FIELDS, values, strict=True)}}  # fmt: skip


def kafka_config(env: Mapping[str, str], **fields: Any) -> KafkaConfig:
    """The `KafkaConfig` of a client with environment `env` (`kafka_env`), and `fields`."""
    security = {f: env[env_name(KafkaConfig, f)] for f in SECURITY_FIELDS if env_name(KafkaConfig, f) in env}
    return KafkaConfig(bootstrap=env[env_name(KafkaSwitch, "kafka")], **security, **fields)
