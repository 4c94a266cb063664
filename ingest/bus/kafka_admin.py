"""The Kafka admin role: create topics replicated as the cluster allows, read end offsets and the group's
state, and tell "a node is down, leadership moving" from "the cluster is unreachable"."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trajlake.common.retry import retrying
from trajlake.ingest.bus.kafka_client import connect
from trajlake.ingest.bus.kafka_refusals import AccessRefused, access_refused
from trajlake.ingest.config import KafkaConfig, replication

log = logging.getLogger(__name__)
T = TypeVar("T")
ASK_ATTEMPTS = 4


@dataclass(frozen=True)
class TopicHealth:
    """What the brokers say about one topic: who is up, who leads, what is in sync."""

    topic: str
    brokers: list[int]
    """The brokers that answered (registered with the controller)."""
    replicas: list[int]
    """Every broker that holds a replica of the topic."""
    replication_factor: int
    leaderless: list[int] = field(default_factory=list)
    """Partitions without a leader right now (leadership moving, or every replica down)."""
    under_min_isr: dict[int, int] = field(default_factory=dict)
    """partition -> in-sync replicas, where fewer than min.insync.replicas: acks=all writes wait."""
    min_insync_replicas: int | None = None

    @property
    def down(self) -> list[int]:
        """Brokers holding replicas of the topic that did not answer."""
        return sorted(set(self.replicas) - set(self.brokers))

    def describe(self) -> str:
        """One line: healthy, a node down (and what that means for writes), or leadership moving."""
        if not (self.down or self.leaderless or self.under_min_isr):
            return f"all {len(self.brokers)} broker(s) up; every partition of {self.topic} has a leader"
        parts = []
        if self.down:
            parts.append(
                f"broker(s) {', '.join(map(str, self.down))} of {len(set(self.replicas) | set(self.brokers))} down"
            )
        if self.leaderless:
            parts.append(
                f"leadership moving: partitions {self.leaderless} of {self.topic} have no leader yet"
            )
        if self.under_min_isr:
            worst = min(self.under_min_isr.values())
            parts.append(
                f"partitions {sorted(self.under_min_isr)} have {worst} in-sync replica(s), fewer than "
                f"min.insync.replicas={self.min_insync_replicas}: acks=all writes wait (producers spool) "
                "until a node comes back"
            )
        elif self.down:
            parts.append("the others lead and take writes")
        return "; ".join(parts)


class KafkaAdmin:
    """Admin requests to one cluster (`with KafkaAdmin(config) as admin: …`)."""

    def __init__(self, config: KafkaConfig, timeout_s: float | None = None) -> None:
        from kafka import KafkaAdminClient

        self.config = config
        timeout_ms = int((timeout_s or config.connect_timeout_s) * 1000)
        self._admin = connect(  # nothing answers: BusUnreachable; refused settings: said at once
            config.model_copy(update={"connect_timeout_s": timeout_ms / 1000}),
            lambda bootstrap_ms: KafkaAdminClient(
                **config.client_kwargs(), bootstrap_timeout_ms=bootstrap_ms, request_timeout_ms=timeout_ms
            ),
        )

    def __enter__(self) -> KafkaAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._admin.close()

    def _ask(self, request: Callable[[], T]) -> T:
        """`request()`, again on another broker when the one asked is down (a dead node stays in the
        client's metadata until the controller fences it)."""
        from kafka.errors import KafkaConnectionError, NodeNotReadyError, RequestTimedOutError

        for attempt in retrying(
            retry_on=(KafkaConnectionError, NodeNotReadyError, RequestTimedOutError),
            attempts=ASK_ATTEMPTS,
            wait=0.5,
        ):
            with attempt:
                return request()
        raise AssertionError("unreachable")  # retrying re-raises the last error

    def brokers(self) -> list[int]:
        """Ids of the brokers up: registered with the controller, not fenced, and taking connections
        (with its quorum lost, a controller fences nobody: the metadata still lists a dead node)."""
        cluster = self._ask(self._admin.describe_cluster)
        return sorted(
            b["broker_id"]
            for b in cluster["brokers"]
            if not b.get("is_fenced") and _listening(b["host"], b["port"])
        )

    def quorum_leader(self) -> int:
        """The node leading the KRaft metadata quorum: the active controller."""
        quorum = self._ask(self._admin.describe_metadata_quorum)
        return int(quorum["topics"][0]["partitions"][0]["leader_id"])

    def create_topic(
        self,
        topic: str | None = None,
        partitions: int | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> bool:
        """Create `topic` (default: the config's) unless it exists, replicated as `replication` says for
        the brokers up now; wait until every partition has a leader. Return whether it was created."""
        from kafka.errors import KafkaError, TopicAlreadyExistsError, TopicAuthorizationFailedError

        c = self.config
        name = topic or c.topic
        rf, min_isr = replication(
            len(self.brokers()),
            replication_factor or c.replication_factor,
            min_insync_replicas or c.min_insync_replicas,
        )
        spec = {"num_partitions": partitions or c.partitions, "replication_factor": rf,
                "configs": {"min.insync.replicas": str(min_isr)}}  # fmt: skip
        try:
            self._ask(lambda: self._admin.create_topics({name: spec}, wait_for_metadata=True))
        except TopicAlreadyExistsError:
            return False
        except TopicAuthorizationFailedError as err:  # a principal without CREATE: fine if it exists
            with contextlib.suppress(KafkaError):
                self.topic(name)
                return False
            raise access_refused(err, c.model_copy(update={"topic": name}), "admin") from None
        log.info("created topic %s: %d partitions, replication factor %d, min.insync.replicas %d",
                 name, spec["num_partitions"], rf, min_isr)  # fmt: skip
        return True

    def grant(self, acls: Sequence[Any]) -> None:
        """Create kafka-python `ACL`s (those that exist stay as they are); raise `AccessRefused` if the
        brokers refuse one (no authorizer, or this principal may not alter the cluster)."""
        result = self._ask(lambda: self._admin.create_acls(list(acls)))
        if result["failed"]:
            acl, err = result["failed"][0]
            raise AccessRefused(f"the brokers at {self.config.bootstrap} refused ACL {acl}: {err}")

    def topic(self, topic: str | None = None) -> dict[str, Any]:
        """The metadata of `topic` (partitions with leader, replicas, isr); raises if it does not exist."""
        from kafka.errors import UnknownTopicOrPartitionError

        name = topic or self.config.topic
        [described] = self._ask(lambda: self._admin.describe_topics([name]))
        if described.get("error_code", 0) != 0 or not described.get("partitions"):
            raise UnknownTopicOrPartitionError(f"topic {name} does not exist at {self.config.bootstrap}")
        return described

    def partitions(self, topic: str | None = None) -> list[int]:
        """The topic's partition ids."""
        return sorted(p["partition_index"] for p in self.topic(topic)["partitions"])

    def end_offsets(self, topic: str | None = None, timeout_s: float = 10.0) -> dict[int, int]:
        """partition -> its end offset as a read_committed consumer sees it (the last stable offset),
        from a fresh ListOffsets to each partition's leader."""
        from kafka import IsolationLevel, OffsetSpec, TopicPartition

        name = topic or self.config.topic
        specs = {TopicPartition(name, p): OffsetSpec.LATEST for p in self.partitions(name)}
        found = self._ask(
            lambda: self._admin.list_partition_offsets(
                specs, isolation_level=IsolationLevel.READ_COMMITTED, timeout_ms=int(timeout_s * 1000)
            )
        )
        return {tp.partition: info.offset for tp, info in found.items()}

    def group(self, group: str | None = None) -> tuple[str, int]:
        """The consumer group's state (e.g. "Stable") and how many members it has; raises `KafkaError`
        when no coordinator answers (the group never existed, or its broker is down)."""
        name = group or self.config.group_id
        described = self._ask(lambda: self._admin.describe_groups([name]))
        info = described[name] if isinstance(described, dict) else described[0]
        return str(info.get("group_state") or info.get("state")), len(info.get("members") or [])

    def group_state(self, group: str | None = None) -> str:
        """The consumer group's state and members, in words (e.g. "PreparingRebalance, 3 members")."""
        from kafka.errors import KafkaError

        try:
            state, members = self.group(group)
        except KafkaError as err:
            return f"unknown ({type(err).__name__})"
        return f"{state}, {members} member(s)"

    def health(self, topic: str | None = None) -> TopicHealth:
        """Brokers up, leaders and in-sync replicas of `topic`."""
        from kafka.admin import ConfigResource, ConfigResourceType

        name = topic or self.config.topic
        partitions = self.topic(name)["partitions"]
        resource = ConfigResource(ConfigResourceType.TOPIC, name, ["min.insync.replicas"])
        configs = self._ask(lambda: self._admin.describe_configs([resource], config_filter="all"))
        min_isr = int(configs["topic"][name]["min.insync.replicas"]["value"])
        return TopicHealth(
            topic=name,
            brokers=self.brokers(),
            replicas=sorted({r for p in partitions for r in p["replica_nodes"]}),
            replication_factor=max(len(p["replica_nodes"]) for p in partitions),
            leaderless=sorted(p["partition_index"] for p in partitions if p["leader_id"] < 0),
            under_min_isr={
                p["partition_index"]: len(p["isr_nodes"]) for p in partitions if len(p["isr_nodes"]) < min_isr
            },
            min_insync_replicas=min_isr,
        )


def create_topic(config: KafkaConfig, topic: str | None = None, partitions: int | None = None) -> None:
    """Create `topic` (default: the config's) unless it exists, replicated as the cluster allows
    (`KafkaAdmin.create_topic`), and wait until every partition has a leader."""
    with KafkaAdmin(config) as admin:
        admin.create_topic(topic, partitions)


def _listening(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts a TCP connection at host:port."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def cluster_state(config: KafkaConfig, timeout_s: float = 5.0) -> str:
    """What the brokers say of the topic now, for a report on undelivered messages: a node down
    (below min.insync.replicas acks=all writes wait) is not the cluster unreachable."""
    from kafka.errors import KafkaError

    from trajlake.ingest.bus.base import BusUnreachable

    try:
        with KafkaAdmin(config, timeout_s=min(timeout_s, config.connect_timeout_s)) as admin:
            return admin.health(config.topic).describe()
    except BusUnreachable:
        return "no broker answers: the cluster is unreachable"
    except (KafkaError, KeyError, ValueError) as err:  # they answered but could not say (a leader moving)
        return f"the brokers could not say ({type(err).__name__})"
