"""The ledger's topics: creating them, their partitions, and where each partition ends.

:func:`create_topics` creates the events and dead-letter topics (and the inboxes of a
guarded ledger) if they do not exist, kept for ever and never compacted
(:data:`TOPIC_CONFIG`), and hands them over once every partition has a leader. A
topic it finds made otherwise that would delete records is refused
(:class:`TopicForgets`).

How many replicas, and how many must hold a record before it counts, is chosen by
:func:`layout` from the brokers the cluster has: ``min(3, brokers)`` replicas and
``min.insync.replicas`` one less (at least 1), the production rule of thumb that
survives one broker down with every append still acknowledged by two. A layout that
can never accept a write (more replicas than brokers; more in-sync replicas required
than replicas) is refused before anything is created; one replica is allowed, with a
warning that says what it costs.

A missing topic is found by :func:`topic_partitions` before any client waits for it
(:class:`TopicMissing`): it asks the admin client, whose metadata request neither
creates the topic nor waits for it.

A cluster's events land in one partition (:func:`partition_of`). Where each partition
ends is asked on a connection of its own (:class:`EndOffsets`), not behind a reader's
long-polling fetch.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Self

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError, for_code
from aiokafka.partitioner import DefaultPartitioner

from ledger.errors import Unavailable, UsageError
from ledger.kafka.connection import connect
from ledger.kafka.errors import BrokerUnavailable, NotAuthorized, lost, refusals
from ledger.settings import KafkaSettings

# Retention forever and no compaction: the history is the product.
# Kept for ever, never compacted: the ledger's history is its records.
TOPIC_CONFIG: Final = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}

_TOPIC_ALREADY_EXISTS: Final = 36
# A topic's creation refused for the settings asked: partitions, replication factor.
_REFUSED_SETTINGS: Final = frozenset({37, 38})  # INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR
_UNKNOWN_TOPIC: Final = 3
_TOPIC_AUTHORIZATION_FAILED: Final = TopicAuthorizationFailedError.errno


class TopicMissing(Unavailable):
    """The topic to consume does not exist on the broker."""


class TopicForgets(Unavailable):
    """The events topic exists but does not keep its records for ever (compacted, or a
    finite retention): the broker would delete the ledger's history."""


@dataclasses.dataclass(frozen=True, slots=True)
class TopicLayout:
    """How the ledger's topics are replicated on a cluster of ``brokers`` brokers."""

    brokers: int
    replication_factor: int
    min_insync_replicas: int

    @property
    def warning(self) -> str | None:
        """What this layout risks, in words, or None for a layout that tolerates a broker down."""
        if self.replication_factor == 1:
            return (
                "replication factor 1: every record has one copy, so a lost disk loses the"
                " ledger and every append waits while that broker restarts; fine for one"
                " development broker, use three brokers (replication factor 3,"
                " min.insync.replicas 2) in production"
            )
        if self.min_insync_replicas == self.replication_factor:
            return (
                f"min.insync.replicas {self.min_insync_replicas} equals the replication factor:"
                " a single broker down stops every append until it is back; set"
                " SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS one lower to ride out a broker restart"
            )
        return None

    def __str__(self) -> str:
        return (
            f"replication factor {self.replication_factor},"
            f" min.insync.replicas {self.min_insync_replicas}"
            f" ({self.brokers} broker{'s' if self.brokers != 1 else ''})"
        )


def layout(settings: KafkaSettings, brokers: int) -> TopicLayout:
    """The replication of the ledger's topics on ``brokers`` brokers, from ``settings``
    (None in a field: the default rule); raises :class:`~ledger.errors.UsageError` for a
    layout that could never accept a write with ``acks=all``."""
    replicas = settings.replication_factor or min(3, brokers)
    in_sync = settings.min_insync_replicas or max(1, replicas - 1)
    where = f"the cluster at {settings.bootstrap_servers!r} has {brokers} broker(s)"
    if replicas > brokers:
        raise UsageError(
            f"SVLEDGER_KAFKA_REPLICATION_FACTOR={replicas}: {where}, and a partition cannot"
            f" have more replicas than brokers; set SVLEDGER_KAFKA_PARTITIONS and"
            f" SVLEDGER_KAFKA_REPLICATION_FACTOR to what the cluster can hold (a replication"
            f" factor of at most {brokers}), or leave the latter unset for min(3, brokers)"
        )
    if in_sync > replicas:
        raise UsageError(
            f"SVLEDGER_KAFKA_MIN_INSYNC_REPLICAS={in_sync} is more than the replication factor"
            f" {replicas}: with acks=all no append could ever be acknowledged; set it to at"
            f" most {replicas} (or leave it unset for {max(1, replicas - 1)})"
        )
    return TopicLayout(brokers, replicas, in_sync)


@dataclasses.dataclass(frozen=True, slots=True)
class CreatedTopics:
    """What :func:`create_topics` did: the topics it created, with which layout."""

    layout: TopicLayout
    created: tuple[str, ...]
    existing: tuple[str, ...]


async def create_topics(settings: KafkaSettings, inboxes: Iterable[str] = ()) -> CreatedTopics:
    """Create the event, dead-letter and placement topics if they do not exist
    (idempotent), with the layout :func:`layout` chooses.

    ``inboxes`` names clusters whose inbox topic (one partition: one order per
    cluster) is created too, for a ledger guarded by ``svledger admit``.
    """
    wanted = {
        settings.topic: settings.partitions,
        settings.dlq_topic: settings.partitions,
        settings.placement_topic: 1,
    }
    wanted.update((settings.inbox_topic(cluster), 1) for cluster in inboxes)
    admin = await connect(lambda: AIOKafkaAdminClient(**settings.client_kwargs()), settings)
    try:
        with lost(settings, "reading the cluster's brokers"):
            cluster = await admin.describe_cluster()
        chosen = layout(settings, len(cluster["brokers"]))
        config = {**TOPIC_CONFIG, "min.insync.replicas": str(chosen.min_insync_replicas)}
        response = await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=chosen.replication_factor,
                    topic_configs=config,
                )
                for name, partitions in wanted.items()
            ]
        )
        existing = []
        for topic, code, *rest in response.topic_errors:
            if code == _TOPIC_ALREADY_EXISTS:
                existing.append(topic)
            if code == _TOPIC_AUTHORIZATION_FAILED:
                raise NotAuthorized(
                    settings, "Create", f"topic {topic!r}", "TopicAuthorizationFailed"
                )
            if code and code != _TOPIC_ALREADY_EXISTS:
                message = rest[0] if rest and rest[0] else for_code(code).description
                refused = (
                    f"cannot create topic {topic!r} ({wanted[topic]} partitions, "
                    f"replication factor {chosen.replication_factor}): {message}"
                )
                if code in _REFUSED_SETTINGS:
                    raise UsageError(
                        f"{refused}; set SVLEDGER_KAFKA_PARTITIONS and"
                        " SVLEDGER_KAFKA_REPLICATION_FACTOR to what the cluster can hold"
                        " (a replication factor of at most its brokers)"
                    )
                raise BrokerUnavailable(f"{refused}; check the broker's log")
        await await_leaders(admin, settings, list(wanted))
        await _check_kept(admin, settings)
    finally:
        await admin.close()
    created = tuple(name for name in wanted if name not in existing)
    return CreatedTopics(chosen, created, tuple(existing))


async def _check_kept(
    admin: AIOKafkaAdminClient, settings: KafkaSettings, timeout: float = 30.0
) -> None:
    """Raise :class:`TopicForgets` if the events topic would delete records.

    A topic found, not created here, may have been made otherwise: by a producer on a
    broker that creates topics on first use (Kafka's default), with the broker's
    defaults (seven days' retention), or by hand.
    """
    topic = settings.topic
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(TOPIC_CONFIG))
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        (response,) = await admin.describe_configs([resource])
        # A broker learns of a new topic a moment after the one that led its partitions:
        # the request may reach one that does not know it yet.
        unknown = any(code == _UNKNOWN_TOPIC for code, *_ in response.resources)
        if not unknown or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)
    for code, message, _, _, entries in response.resources:
        if code == _TOPIC_AUTHORIZATION_FAILED:
            raise NotAuthorized(
                settings, "DescribeConfigs", f"topic {topic!r}", "TopicAuthorizationFailed"
            )
        if code:
            raise KafkaError(
                f"cannot read the settings of topic {topic!r}: "
                f"{message or for_code(code).description}"
            )
        wrong = {
            name: value for name, value, *_ in entries if TOPIC_CONFIG.get(name, value) != value
        }
        if wrong:
            found = ", ".join(f"{name}={value}" for name, value in sorted(wrong.items()))
            wanted = ",".join(f"{name}={value}" for name, value in TOPIC_CONFIG.items())
            raise TopicForgets(
                f"topic {topic!r} on {settings.bootstrap_servers!r} does not keep its records"
                f" for ever ({found}): the broker would delete the ledger's history. Run"
                f" kafka-configs.sh --bootstrap-server {settings.bootstrap_servers} --alter"
                f" --entity-type topics --entity-name {topic} --add-config {wanted}; records"
                " deleted already are gone (a replay then starts where the log does)"
            )


async def await_leaders(
    admin: AIOKafkaAdminClient, settings: KafkaSettings, topics: list[str], timeout: float = 30.0
) -> None:
    """Wait until every partition of ``topics`` has a leader.

    A topic exists as soon as the controller has accepted it, but its partitions are
    led a moment later; clients that start in between only log retriable errors, so
    the caller is handed the topics once they are usable.
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        described = await admin.describe_topics(topics)
        for topic in described:
            _check_described(settings, topic)
        leaderless = [
            f"{topic['topic']}/{partition['partition']}"
            for topic in described
            for partition in topic["partitions"]
            if partition["leader"] < 0
        ]
        leaderless += [
            topic["topic"] for topic in described if topic["error_code"] or not topic["partitions"]
        ]
        if not leaderless and len(described) == len(topics):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise KafkaError(
                f"partitions {', '.join(leaderless)} have no leader after {timeout:.0f} s; "
                "check the broker's log"
            )
        await asyncio.sleep(0.1)


async def _describe_in_sync(
    settings: KafkaSettings, topics: Sequence[str]
) -> tuple[list[dict[str, Any]], list[Any]]:
    """``topics``' partitions and their ``min.insync.replicas``, from one admin client."""
    admin = await connect(
        lambda: AIOKafkaAdminClient(**settings.client_kwargs()), settings, timeout=5
    )
    try:
        described = list(await admin.describe_topics(list(topics)))
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, t, {"min.insync.replicas": None})
            for t in topics
        ]
        return described, list(await admin.describe_configs(resources))
    finally:
        await admin.close()


async def why_unacknowledged(settings: KafkaSettings, topics: Sequence[str]) -> str:
    """Why appends to ``topics`` are not acknowledged, as far as the brokers can say: the
    partitions with fewer in-sync replicas than their ``min.insync.replicas`` (Kafka
    refuses ``acks=all`` writes there), or without a leader. Asked within a few seconds;
    says so where the brokers cannot be asked."""
    asked: object = "no answer"
    try:
        async with asyncio.timeout(10):
            while True:  # the admin client asks a broker at random: maybe one that is down
                try:
                    described, configs = await _describe_in_sync(settings, topics)
                    break
                except (KafkaError, Unavailable, OSError) as error:
                    asked = error
                    await asyncio.sleep(0.2)
    except TimeoutError:
        return f"the brokers could not be asked why ({asked})"
    needed = max(
        (
            int(value)
            for response in configs
            for _, _, _, _, entries in response.resources
            for name, value, *_ in entries
            if name == "min.insync.replicas"
        ),
        default=1,
    )
    reasons = []
    for topic in described:
        for partition in topic["partitions"]:
            where = f"partition {partition['partition']} of {topic['topic']!r}"
            isr, replicas = partition["isr"], partition["replicas"]
            if partition["leader"] < 0:
                reasons.append(f"{where} has no leader (replicas on brokers {replicas})")
            elif len(isr) < needed:
                away = sorted(set(replicas) - set(isr))
                reasons.append(
                    f"{where} has {len(isr)} in-sync replica(s) (broker {', '.join(map(str, isr))})"
                    f" and min.insync.replicas is {needed}: no write is accepted until one of"
                    f" brokers {', '.join(map(str, away))} is back in sync"
                )
    return "; ".join(reasons) or "every partition has a leader and enough in-sync replicas now"


async def topic_partitions(
    settings: KafkaSettings, topic: str | None = None, *, timeout: float = 30.0
) -> list[int]:
    """The partitions of the events topic (or ``topic``); :class:`TopicMissing` at once if
    there is none, :class:`BrokerUnavailable` if the broker cannot be reached (connecting
    is given ``timeout`` s) or is lost on the way (a killed broker's closed connection, a node not
    ready).

    Asked of the admin client, whose metadata request neither creates the topic nor
    waits for it: a consumer or producer would retry for its whole request timeout,
    logging an error per attempt, before saying the topic is unknown.
    """
    topic = settings.topic if topic is None else topic
    admin = await connect(
        lambda: AIOKafkaAdminClient(**settings.client_kwargs()), settings, timeout=timeout
    )
    try:
        with lost(settings, f"describing topic {topic!r}"):
            (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    _check_described(settings, described)
    if described["error_code"] == _UNKNOWN_TOPIC or not described["partitions"]:
        create, variable = "svledger topics create", "SVLEDGER_TOPIC"
        if topic == settings.dlq_topic:
            variable = "SVLEDGER_DLQ_TOPIC"
        elif topic.startswith(settings.inbox_prefix):
            create += f" --inbox {topic.removeprefix(settings.inbox_prefix)}"
        raise TopicMissing(
            f"topic {topic!r} does not exist on {settings.bootstrap_servers!r}: "
            f"create it first (`{create}`) or check {variable}"
        )
    if described["error_code"]:
        raise BrokerUnavailable(
            f"cannot describe topic {topic!r} on {settings.bootstrap_servers!r}:"
            f" {for_code(described['error_code']).description}; check the broker's log"
        )
    return sorted(partition["partition"] for partition in described["partitions"])


def _check_described(settings: KafkaSettings, described: Mapping[str, Any]) -> None:
    """Raise :class:`NotAuthorized` for a topic the admin client was not allowed to describe.

    Kafka answers so for a topic that does not exist as well, so as not to tell who
    may not see it that it exists.
    """
    if described["error_code"] == _TOPIC_AUTHORIZATION_FAILED:
        topic = described["topic"]
        raise NotAuthorized(settings, "Describe", f"topic {topic!r}", "TopicAuthorizationFailed")


def partition_of(cluster: str, partitions: Sequence[int]) -> int:
    """The partition a cluster's events land in: the producers' default partitioner."""
    ordered = sorted(partitions)
    partition: int = DefaultPartitioner()(cluster.encode(), ordered, ordered)
    return partition


class EndOffsets:
    """The end offset of each partition of the topic, asked on a connection of its own.

    ``async with EndOffsets(settings) as ends: await ends()``. A broker answers one
    connection's requests in order, so asked on a reader's connection they would wait
    behind its long-polling fetch. ``committed`` (the default) gives last stable
    offsets, the end a ``read_committed`` reader reaches; else high watermarks, which
    include the records of a transaction whose markers are still to be written.
    """

    def __init__(self, settings: KafkaSettings, *, committed: bool = True) -> None:
        self.settings = settings
        self.partitions: list[int] = []
        self._isolation = "read_committed" if committed else "read_uncommitted"
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        self.partitions = await topic_partitions(self.settings)
        self._consumer = await connect(
            lambda: AIOKafkaConsumer(
                **self.settings.client_kwargs(),
                enable_auto_commit=False,
                isolation_level=self._isolation,
            ),
            self.settings,
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def __call__(self, partitions: Iterable[int] | None = None) -> dict[int, int]:
        """The end offset of ``partitions`` (default: all), now."""
        assert self._consumer is not None, "use 'async with EndOffsets(...)'"
        topic = self.settings.topic
        wanted = self.partitions if partitions is None else partitions
        tps = [TopicPartition(topic, p) for p in wanted]
        with (
            lost(self.settings, f"asking the ends of topic {topic!r}"),
            refusals(self.settings, topic=("Describe", topic)),  # first: refusals are not lost
        ):
            ends = await self._consumer.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}


async def end_offsets(settings: KafkaSettings) -> dict[int, int]:
    """The last stable offset of every partition of the topic, now."""
    async with EndOffsets(settings) as ends:
        return await ends()
