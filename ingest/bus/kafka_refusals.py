"""Brokers that refuse a client, said as such and at once, never as an outage to wait out or spool through.

kafka-python reports a wrong SCRAM password, and a PLAINTEXT client on a TLS listener, only as
"Unable to bootstrap" once its bootstrap timeout has passed (the broker hangs up, and the client
retries), and a principal without a right as a bare `*AuthorizationFailedError`. `diagnose` asks
the first broker that takes a TCP connection which of this client's settings is wrong (a TLS
handshake, a few milliseconds); `access_refused` names the principal and the right it lacks.
"""

from __future__ import annotations

import re
import socket
import ssl
import struct
from typing import Literal

from kafka.errors import AuthorizationError, KafkaConfigurationError, SaslAuthenticationFailedError

from trajlake.ingest.config import KafkaConfig
from trajlake.schemas.errors import TrajlakeError

PROBE_TIMEOUT_S = 2.0
STACK_ENV = "a `trajlake stack`'s are in its DIR/env/<role>.env"
Role = Literal["producer", "consumer", "admin"]


class CredentialsRefused(TrajlakeError, SaslAuthenticationFailedError):
    """The brokers refused the SASL user or its password."""

    def __str__(self) -> str:
        return str(self.args[0])


class ProtocolMismatch(TrajlakeError, KafkaConfigurationError):
    """The client's security protocol or CA is not the brokers'."""

    def __str__(self) -> str:
        return str(self.args[0])


class AccessRefused(TrajlakeError, AuthorizationError):
    """The brokers' ACLs do not give the client's principal a right it needs."""

    def __str__(self) -> str:
        return str(self.args[0])


def credentials_refused(config: KafkaConfig) -> CredentialsRefused:
    return CredentialsRefused(
        f"the brokers at {config.bootstrap} refused the SASL {config.sasl_mechanism} credentials of user "
        f"{config.sasl_username!r} (a wrong password, or no such user); set TRAJLAKE_KAFKA_SASL_USERNAME and "
        f"TRAJLAKE_KAFKA_SASL_PASSWORD to a user of the cluster ({STACK_ENV})"
    )


def diagnose(config: KafkaConfig) -> TrajlakeError | None:
    """Why a bootstrap that reached a broker failed, when this client's settings are the cause:
    TLS on one side only, a CA that did not sign the brokers' certificate, or refused SASL
    credentials (the broker took TLS, then hung up); None when no broker takes a connection."""
    for server in config.bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            sock = socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S)
        except OSError:
            continue
        with sock:
            return _diagnose_socket(config, sock, host)
    return None


def _diagnose_socket(config: KafkaConfig, sock: socket.socket, host: str) -> TrajlakeError | None:
    uses_tls = config.security_protocol.endswith("SSL")
    context = ssl.create_default_context(cafile=str(config.ssl_cafile) if config.ssl_cafile else None)
    context.check_hostname = uses_tls and config.ssl_check_hostname
    if not uses_tls:
        context.verify_mode = ssl.CERT_NONE
    try:
        with context.wrap_socket(sock, server_hostname=host) as tls:
            answers = _answers_requests(tls) if uses_tls else True
    except ssl.SSLCertVerificationError as err:
        return ProtocolMismatch(
            f"the brokers at {config.bootstrap} speak TLS with a certificate this client does not trust "
            f"({err.verify_message}); set TRAJLAKE_KAFKA_SSL_CAFILE to the CA that signed it ({STACK_ENV})"
        )
    except (OSError, ssl.SSLError):
        if uses_tls:
            return ProtocolMismatch(
                f"the brokers at {config.bootstrap} do not speak TLS; set TRAJLAKE_KAFKA_SECURITY_PROTOCOL "
                f"to PLAINTEXT or SASL_PLAINTEXT, as they do (it is {config.security_protocol})"
            )
        return credentials_refused(config) if config.security_protocol == "SASL_PLAINTEXT" else None
    if not uses_tls:
        return ProtocolMismatch(
            f"the brokers at {config.bootstrap} speak TLS, and this client {config.security_protocol}; set "
            "TRAJLAKE_KAFKA_SECURITY_PROTOCOL=SASL_SSL, TRAJLAKE_KAFKA_SSL_CAFILE (the CA that signed the "
            "brokers' certificate), TRAJLAKE_KAFKA_SASL_MECHANISM, TRAJLAKE_KAFKA_SASL_USERNAME and "
            f"TRAJLAKE_KAFKA_SASL_PASSWORD ({STACK_ENV})"
        )
    # TLS as the client expects, a broker that answers requests, and still no bootstrap: the SASL step
    return credentials_refused(config) if config.security_protocol == "SASL_SSL" and answers else None


def _answers_requests(sock: ssl.SSLSocket) -> bool:
    """Whether the broker answers an ApiVersions request (v0, allowed before authentication): up and
    serving, not starting or hung."""
    client = b"trajlake-probe"
    request = struct.pack(">hhih", 18, 0, 1, len(client)) + client  # api key, version, correlation id
    try:
        sock.sendall(struct.pack(">i", len(request)) + request)
        head = sock.recv(8)
    except OSError:
        return False
    return len(head) == 8 and struct.unpack(">ii", head)[1] == 1


def _refused_kind(err: BaseException) -> str | None:
    """The `*AuthorizationFailedError` in `err`, also when kafka-python wraps it in a plain KafkaError."""
    if isinstance(err, AccessRefused):
        return None
    if isinstance(err, AuthorizationError):
        return type(err).__name__
    found = re.search(r"(\w+AuthorizationFailedError)", str(err))
    return found.group(1) if found else None


def access_refused(err: BaseException, config: KafkaConfig, role: Role) -> AccessRefused | None:
    """`err` as the right the client's principal lacks, if it is an authorization failure."""
    kind = _refused_kind(err)
    if kind is None:
        return None
    topic_right = {"producer": "WRITE", "consumer": "READ", "admin": "CREATE"}[role]
    right = {
        "TopicAuthorizationFailedError": f"{topic_right} on topic {config.topic}",
        "GroupAuthorizationFailedError": f"READ on group {config.group_id}",
        "ClusterAuthorizationFailedError": "IDEMPOTENT_WRITE on the cluster (an idempotent producer's)"
        if role == "producer"
        else "a right on the cluster",
    }.get(kind, kind)
    principal = f"User:{config.sasl_username}" if config.sasl_username else "this client's principal"
    use = {"producer": "a producer's", "consumer": "a sink's", "admin": "an admin's"}[role]
    return AccessRefused(
        f"the brokers at {config.bootstrap} refused {principal} as a {role}: it lacks {right} ({kind}); "
        f"use {use} credentials in TRAJLAKE_KAFKA_SASL_USERNAME / TRAJLAKE_KAFKA_SASL_PASSWORD (a `trajlake "
        "stack`'s producers: env/writer.env or env/reader.env; its sinks: env/sink.env), or grant the right"
    )


def producer_refusal(err: BaseException, config: KafkaConfig, bootstrapped: bool) -> BaseException | None:
    """The refusal in `err`, met by a producer (`bootstrapped`: whether it ever reached the cluster):
    raised, never spooled through as an outage; None for anything a retry may cure."""
    from kafka import errors

    if isinstance(err, TrajlakeError):
        return err
    if (refused := access_refused(err, config, "producer")) is not None:
        return refused
    if isinstance(err, errors.SaslAuthenticationFailedError):
        return credentials_refused(config)
    if isinstance(err, (errors.KafkaConfigurationError, errors.UnsupportedSaslMechanismError)):
        return err
    if isinstance(err, errors.KafkaTimeoutError) and not bootstrapped:
        return diagnose(config)
    return None
