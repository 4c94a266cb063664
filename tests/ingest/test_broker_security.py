"""A secured cluster's configuration, the stack's ACLs, and how a refused client is told why (no Kafka:
the refusals against a TLS or a plain socket the test serves itself)."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.errors import KafkaError

from trajlake.deploy.kafka_security import (
    ADMIN,
    DEMO,
    PRODUCER,
    SINK,
    Acl,
    acls,
    kafka_config,
    kafka_env,
    make_tls,
)
from trajlake.ingest.broker import (
    BROKER_PRINCIPAL,
    CA_FILE,
    KEYSTORE_FILE,
    BrokerConfig,
    Cluster,
    _server_properties,
)
from trajlake.ingest.bus.kafka_refusals import (
    AccessRefused,
    CredentialsRefused,
    ProtocolMismatch,
    access_refused,
    diagnose,
)
from trajlake.ingest.config import KafkaConfig


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tls = tmp_path_factory.mktemp("tls")
    make_tls(tls)
    return tls


def _secure(tls_dir: Path, tmp_path: Path, nodes: int = 3) -> BrokerConfig:
    return BrokerConfig(port=19092, nodes=nodes, data_dir=tmp_path, tls_dir=tls_dir,
                        scram_users={ADMIN: "admin-pw", PRODUCER: "producer-pw"}, super_users=[ADMIN])  # fmt: skip


def _props(config: BrokerConfig) -> dict[str, str]:
    cluster = Cluster.plan(config)
    text = _server_properties(config, cluster, cluster.nodes[0])
    return dict(line.split("=", 1) for line in text.splitlines())


def test_make_tls_issues_the_nodes_certificate_for_localhost_and_deletes_the_cas_key(tls_dir: Path) -> None:
    assert sorted(p.name for p in tls_dir.iterdir()) == sorted([CA_FILE, KEYSTORE_FILE])
    assert (
        tls_dir.stat().st_mode & 0o777 == 0o700 and (tls_dir / KEYSTORE_FILE).stat().st_mode & 0o777 == 0o600
    )
    keystore = (tls_dir / KEYSTORE_FILE).read_text()
    assert (
        "BEGIN PRIVATE KEY" in keystore and "BEGIN CERTIFICATE" in keystore
    )  # PKCS#8, as Kafka's PEM store reads
    before = keystore
    make_tls(tls_dir)  # a second `stack up` keeps them
    assert (tls_dir / KEYSTORE_FILE).read_text() == before


def test_a_secured_node_speaks_sasl_ssl_to_clients_and_tls_with_client_certificates_to_its_peers(
    tls_dir: Path, tmp_path: Path
) -> None:
    props = _props(_secure(tls_dir, tmp_path))
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,BROKER:SSL,CONTROLLER:SSL"
    assert props["listeners"].startswith("CLIENT://127.0.0.1:19092,BROKER://127.0.0.1:")
    assert "CONTROLLER" not in props["advertised.listeners"]
    assert (
        props["inter.broker.listener.name"] == "BROKER" and props["controller.listener.names"] == "CONTROLLER"
    )
    assert (
        props["listener.name.broker.ssl.client.auth"]
        == props["listener.name.controller.ssl.client.auth"]
        == "required"
    )
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert (
        props["ssl.keystore.location"] == str(tls_dir / KEYSTORE_FILE) and props["ssl.keystore.type"] == "PEM"
    )
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == f"User:{BROKER_PRINCIPAL};User:{ADMIN}"
    assert len(props["controller.quorum.voters"].split(",")) == 3
    assert not [
        v for v in props.values() if "admin-pw" in v or "producer-pw" in v
    ]  # SCRAM users live in the metadata


def test_an_unsecured_node_is_plaintext_without_an_authorizer(tmp_path: Path) -> None:
    props = _props(BrokerConfig(port=19092, data_dir=tmp_path))
    assert props["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert "authorizer.class.name" not in props


def test_a_secured_cluster_needs_a_super_user_to_check_its_nodes_with(tls_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="super user"):
        BrokerConfig(data_dir=tmp_path, tls_dir=tls_dir, scram_users={PRODUCER: "pw"})
    assert _secure(tls_dir, tmp_path).client_settings()["sasl_username"] == ADMIN


def test_each_principal_gets_only_what_its_role_does() -> None:
    rules = acls("events", "sinks")
    on_topic = {
        (r.principal, r.operation)
        for r in rules
        if (r.resource, r.name, r.prefixed) == ("TOPIC", "events", False)
    }
    assert on_topic == {(PRODUCER, "WRITE"), (PRODUCER, "DESCRIBE"), (PRODUCER, "DESCRIBE_CONFIGS"),
                        (SINK, "READ"), (SINK, "DESCRIBE")}  # fmt: skip
    assert Acl(PRODUCER, "CLUSTER", "kafka-cluster", "IDEMPOTENT_WRITE") in rules
    assert [r for r in rules if r.resource == "GROUP" and not r.prefixed] == [
        Acl(SINK, "GROUP", "sinks", "READ")
    ]
    assert not [r for r in rules if r.principal == ADMIN]  # a super user: no ACL needed
    assert {r.principal for r in rules if r.prefixed} == {DEMO}  # the demo's topics and groups, per run
    assert {(r.resource, r.name) for r in rules if r.principal == DEMO} == {
        ("TOPIC", "trajlake-demo-"),
        ("GROUP", "trajlake-demo-sink-"),
        ("CLUSTER", "kafka-cluster"),
    }
    assert not [r for r in rules if r.principal == SINK and r.operation in ("WRITE", "CREATE")]
    assert not [r for r in rules if r.resource == "CLUSTER" and r.operation != "IDEMPOTENT_WRITE"]


def test_a_clients_environment_is_the_config_it_connects_with(tls_dir: Path) -> None:
    env = kafka_env("127.0.0.1:19092", PRODUCER, "pw", tls_dir)
    config = kafka_config(env, topic="t")
    assert (config.security_protocol, config.sasl_mechanism, config.sasl_username) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        PRODUCER,
    )
    assert config.sasl_password is not None and config.sasl_password.get_secret_value() == "pw"
    assert config.ssl_cafile == tls_dir / CA_FILE and config.bootstrap == "127.0.0.1:19092"


def _serve(tls: ssl.SSLContext | None, answer: bool = True) -> Iterator[int]:
    """A server on a free port that takes each connection (with a TLS handshake when `tls`), answers
    a first request as a broker would (with `answer`: a response to correlation id 1) and hangs up."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            try:
                with tls.wrap_socket(conn, server_side=True) if tls else conn as peer:
                    if tls and answer:
                        peer.settimeout(2)
                        peer.recv(64)
                        peer.sendall(struct.pack(">iih", 6, 1, 0))
            except (OSError, ssl.SSLError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


@pytest.fixture
def tls_port(tls_dir: Path) -> Iterator[int]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_dir / KEYSTORE_FILE)
    yield from _serve(context)


@pytest.fixture
def silent_tls_port(tls_dir: Path) -> Iterator[int]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_dir / KEYSTORE_FILE)
    yield from _serve(context, answer=False)


@pytest.fixture
def plain_port() -> Iterator[int]:
    yield from _serve(None)


def test_a_plaintext_client_on_a_tls_listener_is_told_which_settings_to_set(tls_port: int) -> None:
    refused = diagnose(KafkaConfig(bootstrap=f"127.0.0.1:{tls_port}"))
    assert isinstance(refused, ProtocolMismatch)
    assert "speak TLS" in str(refused) and "TRAJLAKE_KAFKA_SECURITY_PROTOCOL=SASL_SSL" in str(refused)
    assert "TRAJLAKE_KAFKA_SSL_CAFILE" in str(refused)


def test_a_broker_that_answers_requests_but_not_the_bootstrap_refused_the_user(
    tls_port: int, tls_dir: Path
) -> None:
    config = kafka_config(kafka_env(f"127.0.0.1:{tls_port}", SINK, "not-the-password", tls_dir))
    refused = diagnose(config)
    assert isinstance(refused, CredentialsRefused)
    assert f"user {SINK!r}" in str(refused) and "TRAJLAKE_KAFKA_SASL_PASSWORD" in str(refused)
    assert "not-the-password" not in str(refused)


def test_a_broker_that_takes_tls_but_answers_nothing_is_no_refusal(
    silent_tls_port: int, tls_dir: Path
) -> None:
    assert diagnose(kafka_config(kafka_env(f"127.0.0.1:{silent_tls_port}", SINK, "pw", tls_dir))) is None


def test_a_ca_that_did_not_sign_the_brokers_certificate_is_named(tls_port: int, tmp_path: Path) -> None:
    make_tls(tmp_path)  # another CA
    refused = diagnose(kafka_config(kafka_env(f"127.0.0.1:{tls_port}", SINK, "pw", tmp_path)))
    assert isinstance(refused, ProtocolMismatch) and "TRAJLAKE_KAFKA_SSL_CAFILE" in str(refused)


def test_a_tls_client_on_a_plaintext_listener_is_told_so(plain_port: int, tls_dir: Path) -> None:
    refused = diagnose(kafka_config(kafka_env(f"127.0.0.1:{plain_port}", SINK, "pw", tls_dir)))
    assert isinstance(refused, ProtocolMismatch) and "do not speak TLS" in str(refused)


def test_nobody_listening_is_an_outage_not_a_refusal() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        assert diagnose(KafkaConfig(bootstrap=f"127.0.0.1:{port}")) is None


def test_an_authorization_failure_names_the_principal_and_the_right_it_lacks() -> None:
    config = KafkaConfig(bootstrap="127.0.0.1:1", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                         sasl_username=SINK, sasl_password="pw", group_id="sinks", topic="events")  # fmt: skip
    wrapped = KafkaError(
        "Unexpected error in InitProducerIdResponse: [Error 31] ClusterAuthorizationFailedError"
    )
    refused = access_refused(wrapped, config, "producer")
    assert isinstance(refused, AccessRefused)
    assert f"User:{SINK} as a producer: it lacks IDEMPOTENT_WRITE on the cluster" in str(refused)
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    assert "READ on group sinks" in str(
        access_refused(GroupAuthorizationFailedError("sinks"), config, "consumer")
    )
    assert "WRITE on topic events" in str(access_refused(TopicAuthorizationFailedError(), config, "producer"))
    assert access_refused(KafkaError("socket disconnected"), config, "producer") is None


def test_each_port_of_a_planned_cluster_is_its_own(tls_dir: Path, tmp_path: Path, monkeypatch) -> None:
    """The kernel handed a node's client port out again as another node's internal port: that node
    failed to bind it ("Address already in use") and `stack up --brokers 3` failed."""
    from trajlake.ingest import broker

    config = _secure(tls_dir, tmp_path)
    offered = iter([config.port + 1, config.port, 40001, config.port + 2, 40001, 40002, *range(40003, 40010)])
    monkeypatch.setattr(broker, "free_port", lambda taken=(): next(p for p in offered if p not in taken))
    nodes = Cluster.plan(config).nodes
    ports = [p for n in nodes for p in (n.port, n.controller_port, n.internal_port)]
    assert len(ports) == len(set(ports)) == 9
