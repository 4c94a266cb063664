"""What every Kafka role shares: connecting (refused credentials and an unreachable cluster named as
such), secrets kept out of kafka-python's logs, the default partitioner, and closing a producer."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from trajlake.ingest.bus.base import BusUnreachable
from trajlake.ingest.bus.kafka_refusals import credentials_refused, diagnose
from trajlake.ingest.config import KafkaConfig
from trajlake.schemas.errors import TrajlakeError

T = TypeVar("T")
FIRST_TRY_S = 3.0
"""How long a consumer or admin tries to bootstrap before asking why it cannot (`connect`)."""


def close_kafka_producer(producer: Any, timeout_s: float) -> None:
    """Close a kafka-python producer whatever it still holds (our spool holds it too).

    kafka-python 3's `close` flushes first and raises `KafkaTimeoutError` before it gets to force
    the sender closed: the producer stayed open, its sender retrying, and its `__del__` failed
    the same way at exit with a traceback. Here a close that times out forces the sender closed
    (it aborts the batches still unacknowledged) and closes again.
    """
    from kafka.errors import KafkaTimeoutError

    try:
        producer.close(timeout=timeout_s)
    except KafkaTimeoutError:
        producer._sender.force_close()  # no public way: `close` never reaches its own force_close
        producer._sender.join(5)
        with contextlib.suppress(KafkaTimeoutError):
            producer.close(timeout=0)


def kafka_partition_of(partitions: Sequence[int]) -> Callable[[str | None], int | None]:
    """The partition Kafka's default partitioner (murmur2 of the key, as the Java client) gives a
    key, among `partitions`; None for no key (those go to a random partition)."""
    from kafka.partitioner.default import murmur2

    ordered = sorted(partitions)

    def partition_of(key: str | None) -> int | None:
        if key is None:
            return None
        return ordered[(murmur2(key.encode()) & 0x7FFFFFFF) % len(ordered)]

    return partition_of


def event_bytes(events: Sequence[Mapping[str, Any]]) -> int:
    """About the Arrow bytes of event dicts: 4 per token id and logprob, 200 per event besides."""
    size = 0
    for e in events:
        size += 200
        for name in ("input_token_ids", "output_token_ids", "output_logprobs"):
            value = e.get(name)
            if value is not None:
                size += 4 * len(value)
    return size


class _Redact(logging.Filter):
    """Masks secrets in log records (kafka-python logs SASL handshakes, password included, at DEBUG)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(secret in message for secret in self.secrets):
            for secret in self.secrets:
                message = message.replace(secret, "**********")
            record.msg, record.args = message, None
        return True


_REDACT = _Redact()


def redact_secrets_in_kafka_logs(config: KafkaConfig) -> None:
    import kafka  # noqa: F401 - its modules create their loggers on import

    secrets = [s.get_secret_value() for s in (config.sasl_password, config.ssl_password) if s is not None]
    if not secrets:
        return
    _REDACT.secrets.update(secrets)
    for name in list(logging.root.manager.loggerDict):
        if name == "kafka" or name.startswith("kafka."):
            logger = logging.getLogger(name)
            if _REDACT not in logger.filters:
                logger.addFilter(_REDACT)


class AuthFailureWatch(logging.Handler):
    """Turns a bootstrap that timed out because the broker refused our credentials into that error.

    kafka-python retries a failed SASL handshake until its bootstrap timeout and then reports
    only a timeout, which would look like an outage and be spooled for ever.
    """

    def __init__(self, config: KafkaConfig) -> None:
        super().__init__(logging.WARNING)
        self.config = config
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if "SaslAuthenticationFailedError" in record.getMessage():
            self.failed = True

    def __enter__(self) -> AuthFailureWatch:
        logging.getLogger("kafka").addHandler(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        logging.getLogger("kafka").removeHandler(self)
        if exc is not None and self.failed and not isinstance(exc, TrajlakeError):
            raise credentials_refused(self.config) from None


def connect(config: KafkaConfig, make: Callable[[int], T]) -> T:
    """`make(bootstrap_timeout_ms)`: a kafka-python consumer or admin of `config`. When a first try
    of `FIRST_TRY_S` fails, `diagnose` says at once whether this client's settings are the cause (TLS,
    CA, credentials); otherwise it waits the rest of `connect_timeout_s` for a cluster coming up."""
    from kafka.errors import KafkaTimeoutError

    first = min(FIRST_TRY_S, config.connect_timeout_s)
    with bootstrapping(config):
        try:
            return make(int(first * 1000))
        except KafkaTimeoutError:
            if (refused := diagnose(config)) is not None:
                raise refused from None
            if config.connect_timeout_s <= first:
                raise
        return make(int((config.connect_timeout_s - first) * 1000))


@contextmanager
def bootstrapping(config: KafkaConfig) -> Iterator[None]:
    """Around a kafka-python consumer's or admin's bootstrap: refused credentials, and a cluster that
    never answered or stopped answering mid-way, become errors that name the fix, not bare timeouts."""
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError, RequestTimedOutError

    with AuthFailureWatch(config):
        try:
            yield
        except KafkaTimeoutError as err:  # kafka-python 3: "Unable to bootstrap from [...]"
            raise BusUnreachable(
                f"no Kafka broker answered at {config.bootstrap} within {config.connect_timeout_s:g} s; "
                "start one with `trajlake kafka up` or point --kafka (TRAJLAKE_KAFKA) at a running cluster "
                "(TRAJLAKE_KAFKA_CONNECT_TIMEOUT_S waits longer)"
            ) from err
        except (RequestTimedOutError, KafkaConnectionError) as err:
            # bootstrapped, then the broker died or hung before the topic's metadata came back
            raise BusUnreachable(
                f"the Kafka broker at {config.bootstrap} stopped answering while connecting ({err}); "
                "check that it is up (`trajlake kafka up` for a local one) and run the command again"
            ) from err
