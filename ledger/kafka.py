"""Kafka I/O for the ledger: topics, the record format, producing and consuming events.

The record format is the contract every writer shares (:func:`to_record`):

* key: the cluster name, UTF-8, so all events of a cluster land in one partition
  (the default murmur2 partitioner) and form one total order;
* value: the codec's Avro single-object encoding;
* header ``svledger-type``: the event type name, for humans reading with console tools;
* header ``svledger-lease``, on heartbeats only: the 16-byte
  :func:`~ledger.events.lease_term` of what the heartbeat says besides its renew time.
  A reader that knows the lease's current term can tell a plain renewal without
  decoding the record (the projector's thinning, :mod:`projections.thinning`). Every
  writer builds it from the event it encodes, so it always matches the value;
  admission builds it again from the decoded inbox record.

One other record is written, never read: a transactional producer that starts while a
transaction is open on its partition appends an empty record with header
``svledger-fence`` (its transactional ID) in a transaction it aborts
(:class:`PartitionProducer`), so ``read_committed`` readers, as every reader of the
ledger is, never see it.

:class:`EventProducer` is idempotent with ``acks=all`` and lets aiokafka batch:
``send`` awaits one acknowledgement, ``send_many`` hands every record to the
accumulator first and then awaits all acknowledgements, so a burst costs a few round
trips, not one per event. Per key (per partition) the order of the list is the order
in the log.

:class:`EventConsumer` yields decoded :class:`Record` s one by one or in batches. It
reads either as a member of a consumer group or, without a group, every partition by
manual assignment. Where each partition starts is chosen by the caller
(``start_offsets``; the projector resumes from its SQL checkpoint), else it is the
group's committed offset or the beginning. With ``until="end"`` it stops once every
partition reaches the end it had when the consumer started (replay).

A record that does not decode, or whose key is not its event's ``meta.cluster``,
never stops the stream: it is copied to the dead-letter topic with its original key,
value and headers plus ``svledger-dlq-*`` headers (reason, source topic, partition,
offset), logged as a warning, and skipped. Dead letters of a batch are acknowledged
before the batch is handed out, so a caller that checkpoints past a bad record never
loses it.

Connecting retries for a bounded time and then fails with :class:`BrokerUnavailable`,
which names the bootstrap address and what to check. A missing topic is found by
:func:`topic_partitions` before any client waits for it (:class:`TopicMissing`).

A broker that enforces security is told apart from one that is down. A client it
turns away at the door (a refused SASL login, a certificate the client cannot verify,
a listener that speaks another security protocol) fails at once with
:class:`NotAuthenticated`, not after the connect timeout; a request its ACLs refuse
fails with :class:`NotAuthorized`, naming the principal, the operation and the
resource. Both are :class:`~ledger.errors.AccessDenied`: not an outage, so the
services that ride out outages stop on them instead of retrying for ever.

This module is the one place that speaks to aiokafka (settings aside, which build
its TLS context): topics, the record format, the producers (plain, and transactional
per partition for consume-transform-produce), the readers (decoding with a dead-letter
topic, raw group members for per-partition folds), end offsets and lags. It is long for
that reason: everything that depends on the client library's behaviour is here.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import contextvars
import dataclasses
import inspect
import itertools
import logging
import operator
import random
import ssl
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from types import TracebackType
from typing import Any, Final, Literal, NamedTuple, Protocol, Self, TypeAlias, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as TopicPartition  # re-exported: a partition of any topic
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.cluster import ClusterMetadata
from aiokafka.conn import create_conn
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    IllegalStateError,
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFenced,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
    for_code,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.metadata import MetadataRequest

from ledger import assignment, metrics
from ledger.codec import CodecError, decode, encode
from ledger.errors import AccessDenied, Unavailable, UsageError
from ledger.events import (
    ApiserverHeartbeat,
    Event,
    Position,
    heartbeat_term,
    micros,
    type_name,
)
from ledger.settings import KafkaSettings, bootstrap_addresses
from ledger.tasks import retrieved

log = logging.getLogger(__name__)

TYPE_HEADER: Final = "svledger-type"
LEASE_HEADER: Final = "svledger-lease"
TIME_HEADER: Final = "svledger-time"
DLQ_REASON_HEADER: Final = "svledger-dlq-reason"
DLQ_TOPIC_HEADER: Final = "svledger-dlq-topic"
DLQ_PARTITION_HEADER: Final = "svledger-dlq-partition"
DLQ_OFFSET_HEADER: Final = "svledger-dlq-offset"
FENCE_HEADER: Final = "svledger-fence"

# Retention forever and no compaction: the history is the product.
# Kept for ever, never compacted: the ledger's history is its records.
TOPIC_CONFIG: Final = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}

_TOPIC_ALREADY_EXISTS: Final = 36
# A topic's creation refused for the settings asked: partitions, replication factor.
_REFUSED_SETTINGS: Final = frozenset({37, 38})  # INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR
_UNKNOWN_TOPIC: Final = 3
_TOPIC_AUTHORIZATION_FAILED: Final = TopicAuthorizationFailedError.errno
# A transaction (or a producer's stop) that has not completed by then is given up.
TRANSACTION_TIMEOUT_SECONDS: Final = 60.0
STOP_TIMEOUT_SECONDS: Final = 10.0
METADATA_MAX_AGE_MS: Final = 5_000  # a reader's metadata refresh (ledger_consumer)
DEAD_LETTER_SENDERS: Final = "svledger-dead-letters"  # prefix of their transactional IDs
DEAD_LETTER_ATTEMPTS: Final = 10
_FENCED: Final = (ProducerFenced, InvalidProducerEpoch)  # a newer producer of the ID began


Headers: TypeAlias = list[tuple[str, bytes]]


class BrokerUnavailable(Unavailable):
    """Kafka could not be reached within the connect timeout."""


class DeadLettersUnsent(BrokerUnavailable):
    """A partition's dead letters could not be sent: the broker is away or refuses the
    transaction. The records that hold them are read again, as after any broker outage."""


class TopicMissing(Unavailable):
    """The topic to consume does not exist on the broker."""


class TopicForgets(Unavailable):
    """The events topic exists but does not keep its records for ever (compacted, or a
    finite retention): the broker would delete the ledger's history."""


GRANT_HINT: Final = "grant its role's ACLs with deploy/kafka/acls.py (docs/production.md)"


class NotAuthenticated(AccessDenied):
    """The broker turned the client away before any request: credentials or protocol."""


class NotAuthorized(AccessDenied):
    """The broker's ACLs refused the client's principal an operation on a resource.

    ``refused`` says who may not do what (``principal User:bob may not Write topic
    'svledger.events' (Kafka: TopicAuthorizationFailed)``); the message adds how to
    grant it. ``principal`` is None where Kafka names the client from its certificate;
    ``topic`` is the events topic the client was set up for.
    """

    def __init__(self, settings: KafkaSettings, operation: str, resource: str, kafka: str) -> None:
        self.principal = settings.principal
        self.topic = settings.topic
        self.operation = operation
        self.resource = resource
        who = f"principal {self.principal}" if self.principal else "this client's principal"
        self.refused = f"{who} may not {operation} {resource} (Kafka: {kafka})"
        super().__init__(f"{self.refused}; {GRANT_HINT}")


# What a broker outage raises from any client call; callers that ride out an outage
# catch these and retry.
BROKER_ERRORS: Final = (BrokerUnavailable, KafkaError)


async def drop_fetch(fetch: asyncio.Future[Any]) -> None:
    """Cancel a fetch whose records are not wanted: how it ends does not matter, a broker
    error included (the next fetch meets the broker as it is)."""
    fetch.cancel()
    with contextlib.suppress(asyncio.CancelledError, *BROKER_ERRORS):
        await fetch


class OutgoingRecord(NamedTuple):
    key: bytes | None  # None only for a fencing record (PartitionProducer)
    value: bytes
    headers: Headers


def to_record(event: Event, value: bytes | None = None) -> OutgoingRecord:
    """The Kafka record for an event; every writer of the ledger uses this.

    ``value``: the event's encoding as it was logged elsewhere (admission copies an
    inbox record byte for byte), instead of encoding it again.
    """
    headers = [
        (TYPE_HEADER, type_name(event).encode()),
        (TIME_HEADER, micros(event.meta.occurred_at).to_bytes(8, "big", signed=True)),
    ]
    if isinstance(event, ApiserverHeartbeat):
        headers.append((LEASE_HEADER, heartbeat_term(event)))
    return OutgoingRecord(
        key=event.meta.cluster.encode(),
        value=encode(event) if value is None else value,
        headers=headers,
    )


# --------------------------------------------------------------------------- connecting


class _Client(Protocol):
    async def start(self) -> None: ...


async def stop_within(client: _Client, what: str) -> None:
    """Stop ``client``, or abandon it with a warning if it has not stopped within
    :data:`STOP_TIMEOUT_SECONDS`: a broker that does not answer (hung, not gone) holds
    a producer's flush and a group member's leave request for the whole request
    timeout (40 s), past Kubernetes' grace period. A member that does not leave is
    dropped by the group coordinator after its session timeout."""
    if not await _finish_within(asyncio.create_task(_shut(client)), STOP_TIMEOUT_SECONDS):
        log.warning("%s did not stop within %.0f s; abandoned", what, STOP_TIMEOUT_SECONDS)


async def _shut(client: _Client) -> None:
    """Stop a client: consumers and producers ``stop()``, the admin client ``close()``s."""
    shut = getattr(client, "stop", None) or getattr(client, "close", None)
    assert shut is not None, f"{type(client).__name__} has neither stop() nor close()"
    await shut()
    _see_undelivered(client)


def _see_undelivered(client: _Client) -> None:
    """Mark the failures of the batches a stopped producer could not deliver as seen.

    A producer that failed (fenced by a newer producer of its transactional ID, say)
    fails each batch it still holds with the error its last send or transaction
    raised, also the batch's drain waiter, which aiokafka itself reads only when a
    send waits for room in the batch. Left unread, asyncio logs each one as "Future
    exception was never retrieved" when it is collected: an error the caller was
    already given, told again as if it were a bug. A client without such batches
    (a consumer, another aiokafka) has nothing to mark.
    """
    accumulator = getattr(client, "_message_accumulator", None)
    queued = itertools.chain(*getattr(accumulator, "_batches", {}).values())
    for batch in [*queued, *getattr(accumulator, "_pending_batches", ())]:
        waiter = getattr(batch, "_drain_waiter", None)
        if isinstance(waiter, asyncio.Future) and waiter.done() and not waiter.cancelled():
            waiter.exception()


_C = TypeVar("_C", bound=_Client)

_CHECK_REACHABLE: Final = (
    "Check that the broker is running and listening there, that the bootstrap servers"
    " (--bootstrap or SVLEDGER_KAFKA_BOOTSTRAP) name its advertised address, and that"
    " the security settings match its listener."
)


class StoppedConnecting(asyncio.CancelledError):
    """The service was told to stop while :func:`connect` waited for the broker.

    A cancellation (so ``except Exception`` retry loops let it through, and code that
    ends tasks treats it as one): a client that never connected has nothing to finish.
    """


_UNWIND_SECONDS: Final = 5.0
_STOP: Final[contextvars.ContextVar[asyncio.Event | None]] = contextvars.ContextVar(
    "svledger_stop", default=None
)


def stop_connecting_on(stop: asyncio.Event) -> None:
    """Have :func:`connect`, in this task and the tasks it starts from now on, give up
    with :class:`StoppedConnecting` once ``stop`` is set while it waits for the broker,
    instead of waiting out its timeout (a service told to stop while the broker is down
    then exits at once, well within Kubernetes' grace period)."""
    _STOP.set(stop)


async def unless_stopped(work: Awaitable[object], stop: asyncio.Event | None) -> bool:
    """Await ``work`` unless ``stop`` is set first: then cancel it and return False.
    True once ``work`` has ended (its exception, if any, is raised)."""
    if stop is None:
        await work
        return True
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled, or the caller's timeout
        await _cancelled(task)
        raise
    finally:
        stopped.cancel()
    if not task.done():
        await _cancelled(task)
        return False
    task.result()
    return True


RETRY_SECONDS: Final = 5.0  # between attempts to reach a broker that is away
_T = TypeVar("_T")


async def while_away(
    stop: asyncio.Event, attempt: Callable[[], Awaitable[_T]], doing: str
) -> _T | None:
    """``attempt()``'s result, tried again every :data:`RETRY_SECONDS` while Kafka cannot
    be reached (a warning names ``doing``, "join group x"), as services ride out an
    outage; None if ``stop`` is set first. Refusals (a login, an ACL, a missing topic)
    are raised at once: waiting does not mend them."""
    while not stop.is_set():
        try:
            return await attempt()
        except BrokerUnavailable as error:
            log.warning("cannot %s yet: %s", doing, error)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RETRY_SECONDS)
    return None


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and let it unwind (a client's start closes what it opened)."""
    task.cancel()
    await asyncio.wait((task,), timeout=_UNWIND_SECONDS)


async def connect(make: Callable[[], _C], settings: KafkaSettings, *, timeout: float = 30.0) -> _C:
    """Start a fresh aiokafka client from ``make`` until it connects or ``timeout`` passes.

    A client whose ``start`` failed is stopped, and replaced if the broker was not
    reachable: aiokafka clients are not meant to be started twice. A client the
    broker turns away is :class:`NotAuthenticated` at once (:func:`_turned_away`).

    A start that has not finished by then is given up too, even one the broker answers:
    an idempotent or transactional producer starts only once the broker's transaction
    coordinator gives it a producer ID, and aiokafka asks again and again, logging
    nothing, while there is none (the ``__transaction_state`` topic cannot be created,
    say, because its replication factor exceeds the brokers). Without the bound the
    caller would wait for ever, unseen; with it the caller gets
    :class:`BrokerUnavailable`, saying what to check, and a service retries later.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.25
    attempts = 0
    stop = _STOP.get()
    if stop is not None and stop.is_set():
        stop = None  # stopping already: whatever connects now is part of a clean stop
    while True:
        attempts += 1
        client = make()
        try:
            async with asyncio.timeout_at(deadline):
                if not await unless_stopped(client.start(), stop):
                    raise StoppedConnecting("told to stop while waiting for Kafka")
            return client
        except TimeoutError as error:
            await _shut(client)
            if loop.time() < deadline:  # the client's own, not the bound's
                raise
            raise BrokerUnavailable(
                f"an {type(client).__name__} for Kafka at {settings.bootstrap_servers!r}"
                f" ({settings.security_protocol}) did not start within {timeout:g} s."
                f" {_CHECK_REACHABLE} If all that holds, a"
                " transactional or idempotent producer is waiting for a producer ID from"
                " the broker's transaction coordinator: check the broker's log, and that"
                " transaction.state.log.replication.factor and"
                " transaction.state.log.min.isr do not exceed the brokers running."
            ) from error
        except KafkaConnectionError as error:
            await _shut(client)
            refusal = await _turned_away(settings)
            if refusal is not None:
                raise refusal from error
            if loop.time() + delay > deadline:
                raise BrokerUnavailable(
                    f"cannot reach Kafka at {settings.bootstrap_servers!r} "
                    f"({settings.security_protocol}) after {attempts} attempts in "
                    f"{timeout:g} s: {error}. {_CHECK_REACHABLE}"
                ) from error
            if not await unless_stopped(asyncio.sleep(delay), stop):
                raise StoppedConnecting("told to stop while waiting for Kafka") from error
            delay = min(delay * 2, 2.0)
        except BaseException:
            await _shut(client)
            raise


# A listener that expects TLS or SASL closes the connection of a client that speaks
# anything else, at once; a broker shutting down or over its connection quota may
# close one now and then. Closed every time, so many times in a row, is a mismatch.
_CLOSED_IN_A_ROW: Final = 5


async def _turned_away(settings: KafkaSettings) -> NotAuthenticated | None:
    """Why the first bootstrap server does not let this client in, if it is up and does not.

    aiokafka logs why a bootstrap failed and raises only "Unable to bootstrap", the
    same as when nothing listens; so ask again on a connection of our own, as the
    client's bootstrap does (connect, log in, ask for metadata), and read the error.
    None when the broker is unreachable, or lets the client in now.
    """
    where = settings.bootstrap_servers.split(",")[0].strip()
    host, port = bootstrap_addresses(settings.bootstrap_servers)[0]
    options = settings.client_kwargs()
    del options["bootstrap_servers"]
    for _ in range(_CLOSED_IN_A_ROW):
        try:
            connection = await create_conn(host, port, request_timeout_ms=10_000, **options)
            try:
                await connection.send(MetadataRequest([]))
            finally:
                connection.close()
        except SaslAuthenticationFailed as error:
            return NotAuthenticated(
                f"Kafka at {where!r} refused the {settings.sasl_mechanism} login of user "
                f"{settings.sasl_username!r} ({error.args[0] if error.args else error}); "
                "check SVLEDGER_KAFKA_SASL_USERNAME and SVLEDGER_KAFKA_SASL_PASSWORD against "
                "the users the cluster knows, and SVLEDGER_KAFKA_SASL_MECHANISM"
            )
        except UnsupportedSaslMechanismError:
            return NotAuthenticated(
                f"Kafka at {where!r} does not offer the SASL mechanism "
                f"{settings.sasl_mechanism} on this listener; check SVLEDGER_KAFKA_SASL_MECHANISM"
            )
        except ssl.SSLCertVerificationError as error:
            return NotAuthenticated(
                f"cannot verify the certificate of Kafka at {where!r} "
                f"({error.verify_message}); give the CA that signed it in "
                "SVLEDGER_KAFKA_SSL_CAFILE, and a bootstrap address the certificate names"
            )
        except KafkaConnectionError as error:
            if "closed" not in str(error):
                return None
            await asyncio.sleep(0.1)
            continue
        except (OSError, KafkaError, TimeoutError):
            return None
        return None
    return NotAuthenticated(
        f"Kafka at {where!r} closed the connection unanswered {_CLOSED_IN_A_ROW} times in a "
        f"row: its listener there expects another security protocol than "
        f"{settings.security_protocol} (SASL_SSL, say); check "
        "SVLEDGER_KAFKA_SECURITY_PROTOCOL against the listener, and the broker's log"
    )


_REFUSALS: Final = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    ClusterAuthorizationFailedError,
)


def _refusal(
    error: BaseException,
    settings: KafkaSettings,
    *,
    topic: tuple[str, str] | None = None,
    group: str | None = None,
    transactional_id: str | None = None,
) -> NotAuthorized | None:
    """``error`` as :class:`NotAuthorized` if it is an ACL's refusal, else None.

    The caller says what it was doing: ``topic`` is the operation it needs on a topic
    (``("Write", name)``), ``group`` the consumer group it reads as, and
    ``transactional_id`` the ID its transactions run under.
    """
    kafka = type(error).__name__.removesuffix("Error")
    named = str(error.args[0]) if error.args else "?"
    match error:
        case TopicAuthorizationFailedError():
            operation, name = topic or ("Describe", named)
            return NotAuthorized(settings, operation, f"topic {name!r}", kafka)
        case GroupAuthorizationFailedError():
            return NotAuthorized(settings, "Read", f"group {group or named!r}", kafka)
        case TransactionalIdAuthorizationFailed():
            return NotAuthorized(
                settings, "Write", f"transactional ID {transactional_id or named!r}", kafka
            )
        case ClusterAuthorizationFailedError() if topic is not None and topic[0] == "Write":
            # A producer's first request asks for an idempotent producer ID, which Kafka
            # grants to a principal that may write some topic (or IdempotentWrite the cluster).
            return NotAuthorized(settings, "Write", f"topic {topic[1]!r}", kafka)
        case ClusterAuthorizationFailedError():
            return NotAuthorized(settings, "act on", "the cluster", kafka)
    return None


@contextlib.contextmanager
def _refusals(
    settings: KafkaSettings,
    *,
    topic: tuple[str, str] | None = None,
    group: str | None = None,
    transactional_id: str | None = None,
) -> Iterator[None]:
    """Raise an ACL's refusal inside the block as :class:`NotAuthorized` (see :func:`_refusal`)."""
    try:
        yield
    except _REFUSALS as error:
        refusal = _refusal(
            error, settings, topic=topic, group=group, transactional_id=transactional_id
        )
        assert refusal is not None
        raise refusal from error


# --------------------------------------------------------------------------- topics


async def create_topics(settings: KafkaSettings, inboxes: Iterable[str] = ()) -> None:
    """Create the event and dead-letter topics if they do not exist (idempotent).

    ``inboxes`` names clusters whose inbox topic (one partition: one order per
    cluster) is created too, for a ledger guarded by ``svledger admit``.
    """
    wanted = {settings.topic: settings.partitions, settings.dlq_topic: settings.partitions}
    wanted.update((settings.inbox_topic(cluster), 1) for cluster in inboxes)
    admin = await connect(lambda: AIOKafkaAdminClient(**settings.client_kwargs()), settings)
    try:
        response = await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions,
                    replication_factor=settings.replication_factor,
                    topic_configs=dict(TOPIC_CONFIG),
                )
                for name, partitions in wanted.items()
            ]
        )
        for topic, code, *rest in response.topic_errors:
            if code == _TOPIC_AUTHORIZATION_FAILED:
                raise NotAuthorized(
                    settings, "Create", f"topic {topic!r}", "TopicAuthorizationFailed"
                )
            if code and code != _TOPIC_ALREADY_EXISTS:
                message = rest[0] if rest and rest[0] else for_code(code).description
                refused = (
                    f"cannot create topic {topic!r} ({wanted[topic]} partitions, "
                    f"replication factor {settings.replication_factor}): {message}"
                )
                if code in _REFUSED_SETTINGS:
                    raise UsageError(
                        f"{refused}; set SVLEDGER_KAFKA_PARTITIONS and"
                        " SVLEDGER_KAFKA_REPLICATION_FACTOR to what the cluster can hold"
                        " (a replication factor of at most its brokers)"
                    )
                raise BrokerUnavailable(f"{refused}; check the broker's log")
        await _await_leaders(admin, settings, list(wanted))
        await _check_kept(admin, settings)
    finally:
        await admin.close()


async def _check_kept(admin: AIOKafkaAdminClient, settings: KafkaSettings) -> None:
    """Raise :class:`TopicForgets` if the events topic would delete records.

    A topic found, not created here, may have been made otherwise: by a producer on a
    broker that creates topics on first use (Kafka's default), with the broker's
    defaults (seven days' retention), or by hand.
    """
    topic = settings.topic
    resource = ConfigResource(ConfigResourceType.TOPIC, topic, dict.fromkeys(TOPIC_CONFIG))
    (response,) = await admin.describe_configs([resource])
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


async def _await_leaders(
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


@contextlib.contextmanager
def _lost(settings: KafkaSettings, doing: str) -> Iterator[None]:
    """A request that failed as the broker went away after the connection was made (a
    killed broker's closed connection, a partition without a leader yet, the request's
    timeout) raises :class:`BrokerUnavailable`: an outage, as at connect."""
    try:
        yield
    except KafkaError as error:
        if not (error.retriable or isinstance(error, KafkaTimeoutError)):
            raise
        raise BrokerUnavailable(
            f"lost Kafka at {settings.bootstrap_servers!r} while {doing}: {error}. Check"
            " that the broker is running; services try again."
        ) from error


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
        with _lost(settings, f"describing topic {topic!r}"):
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
            _lost(self.settings, f"asking the ends of topic {topic!r}"),
            _refusals(self.settings, topic=("Describe", topic)),  # first: refusals are not lost
        ):
            ends = await self._consumer.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}


async def end_offsets(settings: KafkaSettings) -> dict[int, int]:
    """The last stable offset of every partition of the topic, now."""
    async with EndOffsets(settings) as ends:
        return await ends()


# --------------------------------------------------------------------------- producing


class EventProducer:
    """Appends events to the ledger topic; ``async with EventProducer(settings) as p``.

    With ``settings.inbox`` each event goes to its cluster's inbox topic instead, for
    ``svledger admit`` to check and move into the ledger (:mod:`consumers.admission`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        linger_ms: int = 10,
        max_batch_size: int = 512 * 1024,
        connect_timeout: float = 30.0,
    ) -> None:
        self.settings = settings
        self._linger_ms = linger_ms
        self._max_batch_size = max_batch_size
        self._connect_timeout = connect_timeout
        self._producer: AIOKafkaProducer | None = None
        self._found: set[str] = set()  # topics found to exist

    def _make(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.settings.client_kwargs(),
            enable_idempotence=True,
            acks="all",
            linger_ms=self._linger_ms,
            max_batch_size=self._max_batch_size,
        )

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def start(self) -> None:
        """Connect, unless connected already (:func:`connect`: for ``connect_timeout`` s)."""
        if self._producer is not None:
            return
        # An idempotent producer asks for its producer ID as it starts: Kafka grants one
        # to a principal that may write some topic (or IdempotentWrite the cluster).
        writes = f"{self.settings.inbox_prefix}<cluster>" if self.settings.inbox else None
        with self._refusals(writes or self.settings.topic):
            self._producer = await connect(self._make, self.settings, timeout=self._connect_timeout)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Bounded: aiokafka delivers what it holds before it stops, and waits for a
            # broker that is away as long as it stays away.
            await stop_within(producer, "the event producer (holding unacknowledged events)")

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("EventProducer is not started: use 'async with EventProducer(...)'")
        return self._producer

    def _refusals(self, topic: str) -> contextlib.AbstractContextManager[None]:
        return _refusals(self.settings, topic=("Write", topic))

    async def _enqueue(self, event: Event) -> tuple[str, asyncio.Future[Any]]:
        key, value, headers = to_record(event)
        topic = self.settings.write_topic(event.meta.cluster)
        if topic not in self._found:
            # aiokafka asks for a topic's metadata in a way that has a broker which creates
            # topics on first use (Kafka's default) create it, with the broker's defaults
            # (one partition, seven days' retention): ask first, without creating it.
            try:
                await topic_partitions(self.settings, topic, timeout=self._connect_timeout)
            except NotAuthorized as refused:  # Describe, which Write would grant
                raise NotAuthorized(
                    self.settings, "Write", f"topic {topic!r}", "TopicAuthorizationFailed"
                ) from refused
            self._found.add(topic)
        with self._refusals(topic):
            future: asyncio.Future[Any] = await self.producer.send(
                topic, value=value, key=key, headers=headers
            )
        return topic, future

    async def send(self, event: Event) -> Position:
        """Append one event and wait until the broker has it on every in-sync replica."""
        topic, future = await self._enqueue(event)
        with self._refusals(topic):
            metadata = await future
        return Position(metadata.partition, metadata.offset)

    async def send_many(self, events: Iterable[Event]) -> list[Position]:
        """Append events (order kept per cluster) and wait for all acknowledgements."""
        enqueued = [await self._enqueue(event) for event in events]
        topics = ", ".join(sorted({topic for topic, _ in enqueued}))
        with self._refusals(topics):
            acknowledged = await asyncio.gather(*(future for _, future in enqueued))
        return [Position(m.partition, m.offset) for m in acknowledged]


class TransactionFailed(Exception):
    """A transaction did not commit, or did not answer in time (then it may have): the
    producer was fenced, the broker refused the transaction, or the broker is away. The
    producer is not used again; its owner rebuilds what it knows from the log."""


class Addressed(NamedTuple):
    """A record and where it goes: a topic and a partition (None: by its key)."""

    topic: str
    partition: int | None
    record: OutgoingRecord


class _Aborted(Exception):
    """Raised inside a transaction that is meant to be aborted."""


class TransactionalProducer:
    """Records to any topics plus a group's consumed offsets, in one Kafka transaction.

    Starting it fences every earlier producer with the same ``transactional_id`` (their
    open transaction is aborted, their later ones refused).
    """

    def __init__(self, settings: KafkaSettings, transactional_id: str) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        with _refusals(self.settings, transactional_id=self.transactional_id):
            self._producer = await connect(
                lambda: AIOKafkaProducer(
                    **self.settings.client_kwargs(),
                    transactional_id=self.transactional_id,
                    enable_idempotence=True,
                    acks="all",
                    linger_ms=0,
                    # A transaction begun right after the last one ended is refused
                    # (CONCURRENT_TRANSACTIONS) until its markers are written; retry soon.
                    retry_backoff_ms=10,
                ),
                self.settings,
            )

    async def stop(self) -> None:
        """Stop the producer, or abandon it if it has not stopped within
        :data:`STOP_TIMEOUT_SECONDS`."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        # Stopping flushes what is pending, which waits for the broker: for ever if a
        # transaction can no longer complete. The next producer of the ID fences this
        # one, and the broker aborts what it has open.
        await stop_within(producer, f"transactional producer {self.transactional_id}")

    async def commit(
        self,
        records: Sequence[Addressed],
        *,
        group_id: str | None = None,
        offsets: Mapping[TopicPartition, int] | None = None,
    ) -> list[Position]:
        """Append ``records`` and commit ``group_id``'s ``offsets`` (if given), atomically.

        Raises :class:`TransactionFailed` when the transaction does not commit, or does
        not complete within :data:`TRANSACTION_TIMEOUT_SECONDS` (the next producer of the
        ID aborts it if it is still open); nothing of it is then visible to
        ``read_committed`` readers, and the producer must be stopped and replaced.
        :class:`NotAuthorized` when an ACL refused it: a new producer would not help.
        """
        return await self._transact(records, group_id, offsets, commit=True)

    async def abort(
        self,
        records: Sequence[Addressed],
        *,
        group_id: str | None = None,
        offsets: Mapping[TopicPartition, int] | None = None,
    ) -> None:
        """Send ``records`` and ``group_id``'s ``offsets`` in a transaction, then abort it:
        nothing of it is visible, but each partition it touched gets this producer's abort
        marker. Raises as :meth:`commit`."""
        await self._transact(records, group_id, offsets, commit=False)

    async def _transact(
        self,
        records: Sequence[Addressed],
        group_id: str | None,
        offsets: Mapping[TopicPartition, int] | None,
        *,
        commit: bool,
    ) -> list[Position]:
        assert self._producer is not None, "start() the TransactionalProducer first"
        producer = self._producer
        futures: list[asyncio.Future[Any]] = []

        async def transact() -> list[Position]:
            with contextlib.suppress(_Aborted):
                async with producer.transaction():
                    for topic, partition, (key, value, headers) in records:
                        future = await producer.send(
                            topic, value=value, key=key, headers=headers, partition=partition
                        )
                        # A transaction that fails fails its records' futures too, which
                        # no one awaits then: the failure is raised once, by the transaction.
                        future.add_done_callback(retrieved)
                        futures.append(future)
                    if group_id is not None and offsets:
                        await producer.send_offsets_to_transaction(dict(offsets), group_id)
                    if not commit:
                        raise _Aborted
            if not commit:
                return []
            return [Position(m.partition, m.offset) for m in await asyncio.gather(*futures)]

        task = asyncio.create_task(transact())
        try:
            if not await _transaction_within(task, TRANSACTION_TIMEOUT_SECONDS):
                # An idempotent producer retries a refused batch for ever (a coordinator
                # that keeps answering "not enough replicas", a broker that is gone), and
                # the abort a cancellation starts waits for the same broker: give up on
                # this producer without waiting for it; the caller builds a new one.
                raise TransactionFailed(
                    f"{self.transactional_id}: the transaction did not complete within"
                    f" {TRANSACTION_TIMEOUT_SECONDS:.0f} s; check that the broker is up and"
                    " its log"
                )
            return task.result()
        except KafkaError as error:
            topics = ", ".join(sorted({record.topic for record in records}))
            refusal = _refusal(
                error,
                self.settings,
                topic=("Write", topics),
                group=group_id,
                transactional_id=self.transactional_id,
            )
            if refusal is not None:
                raise refusal from error
            raise TransactionFailed(f"{self.transactional_id}: {error}") from error
        finally:
            for future in futures:  # their error is the one raised here
                if future.done() and not future.cancelled():
                    future.exception()
                elif not future.done():
                    future.cancel()


class PartitionProducer(TransactionalProducer):
    """Appends events to one partition of the ledger in transactions that also commit
    ``group_id``'s consumed offset of that partition (consume-transform-produce).

    Its transactional ID fences: starting it aborts any open transaction of an earlier
    producer with the same ID and refuses that producer's later ones, so a consumer
    that lost its partition (or crashed mid-transaction) can no longer commit for it.

    Starting it also ends a transaction that no coordinator knows to be open. When the
    coordinator writes the markers of a transaction it has prepared to commit (the
    producer has been told it committed), a partition of the transaction may have no
    leader for a moment, as when the only broker restarts; the coordinator then skips
    that partition as if it had been deleted and records the transaction complete. The
    partition keeps it open for ever: its last stable offset stays at the transaction's
    first record and no ``read_committed`` reader gets past it. Only a marker of the same
    producer ID ends it, and the init that fences writes none (the coordinator knows of
    nothing open). So when the partition's last stable offset is below its end (some
    transaction is open on it), the new producer appends one record (empty, header
    ``svledger-fence``) to its partition, and the group's offset, in a transaction it
    aborts: the abort marker ends whatever the ID left open there, as aborted. No reader
    has seen such a record; the consumer that appended it rebuilds from the log
    (:mod:`consumers.partitions`) and appends it again if it still decides to.
    """

    def __init__(
        self, settings: KafkaSettings, partition: int, transactional_id: str, group_id: str
    ) -> None:
        super().__init__(settings, transactional_id)
        self.partition = partition
        self.group_id = group_id

    async def start(self) -> None:
        """Connect, fence earlier producers of the ID and abort what they left open.

        Raises what :func:`connect` raises, :class:`~aiokafka.errors.KafkaError`,
        :class:`NotAuthorized` or :class:`TransactionFailed`.
        """
        await super().start()
        try:
            if await self._transaction_open():
                tp = TopicPartition(self.settings.topic, self.partition)
                fence = OutgoingRecord(None, b"", [(FENCE_HEADER, self.transactional_id.encode())])
                await self.abort(
                    [Addressed(tp.topic, tp.partition, fence)],
                    group_id=self.group_id,
                    offsets={tp: 0},
                )
        except BaseException:
            await self.stop()
            raise

    async def append(self, events: Sequence[Event], *, consumed: int) -> list[Position]:
        """Append ``events`` and commit the group's next offset ``consumed``, atomically."""
        topic = self.settings.topic
        return await self.commit(
            [Addressed(topic, self.partition, to_record(event)) for event in events],
            group_id=self.group_id,
            offsets={TopicPartition(topic, self.partition): consumed},
        )

    async def _transaction_open(self) -> bool:
        """Whether a transaction is open on the partition: its last stable offset is below
        its end (the end is read first, so that records appended meanwhile do not count)."""
        async with EndOffsets(self.settings, committed=False) as high:
            end = (await high([self.partition]))[self.partition]
        async with EndOffsets(self.settings) as stable:
            return (await stable([self.partition]))[self.partition] < end


_abandoned: set[asyncio.Task[Any]] = set()


async def _transaction_within(task: asyncio.Task[Any], seconds: float) -> bool:
    """:func:`_finish_within`, for a transaction of a service that may be told to stop
    (:func:`stop_connecting_on`): once it is, the transaction gets
    :data:`_UNWIND_SECONDS` more, then it is abandoned with :class:`StoppedConnecting`.
    A broker that does not answer would otherwise hold the shutdown for the whole
    transaction timeout, past Kubernetes' grace period; an abandoned transaction is
    invisible to every reader, and the next producer of its ID aborts it."""
    stop = _STOP.get()
    if stop is None:
        return await _finish_within(task, seconds)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    if not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                {task, stopped}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            _abandon(task)
            raise
        finally:
            stopped.cancel()
    if stop.is_set():
        deadline = min(deadline, loop.time() + _UNWIND_SECONDS)
    if await _finish_within(task, max(0.0, deadline - loop.time())):
        return True
    if stop.is_set():
        raise StoppedConnecting("told to stop while a transaction waited for Kafka")
    return False


async def _finish_within(task: asyncio.Task[Any], seconds: float) -> bool:
    """Wait up to ``seconds`` for ``task``; if it has not finished, cancel it and leave it.

    Unlike :func:`asyncio.wait_for`, this does not wait for the cancelled task to end:
    a cancellation inside aiokafka's transaction aborts the transaction, and the abort
    waits for the broker like the transaction did. A cancelled caller cancels the task.
    """
    try:
        await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        _abandon(task)
        raise
    if task.done():
        return True
    _abandon(task)
    return False


def _abandon(task: asyncio.Task[Any]) -> None:
    task.cancel()
    # Held until it ends (the event loop holds tasks weakly); its outcome is not wanted.
    _abandoned.add(task)
    task.add_done_callback(_forget)


def _forget(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()


# --------------------------------------------------------------------------- consuming


def ledger_consumer(
    settings: KafkaSettings, group_id: str | None, **options: Any
) -> AIOKafkaConsumer:
    """An aiokafka consumer that reads the ledger as every reader must.

    Only committed records (``read_committed`` hides those of aborted transactions),
    offsets committed by the caller and never automatically, and the beginning of a
    partition where the group has no committed offset. ``options`` tune fetching.

    Metadata is refreshed every :data:`METADATA_MAX_AGE_MS`, not aiokafka's 5 min: a
    member that joined its group while the broker, just restarted, did not yet list
    the topic's partitions was assigned none, and it rejoins only once a refresh shows
    them (the group's leader then sees the topic's metadata change).
    """
    options.setdefault("metadata_max_age_ms", METADATA_MAX_AGE_MS)
    return AIOKafkaConsumer(
        **settings.client_kwargs(),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **options,
    )


async def lags(consumer: AIOKafkaConsumer) -> dict[int, int]:
    """Per assigned partition fetched at least once: its end minus the consumer's position.

    The end is the last stable offset the last fetch response carried: the end a
    ``read_committed`` reader reaches. The high watermark would not do: it counts the
    records of a transaction still open, and the position passes the commit marker that
    ends every transaction (the consumers append in transactions), so a partition whose
    last record is a marker would show a lag of 1 to a reader that has read it all.
    Asked between fetches, it costs no request: both numbers are the consumer's own.
    """
    ends = {tp: consumer.last_stable_offset(tp) for tp in consumer.assignment()}
    found: dict[int, int] = {}
    for tp, end in ends.items():
        if end is None or end < 0:
            continue
        try:
            position: int = await consumer.position(tp)
        except IllegalStateError:  # revoked while an earlier position was awaited
            continue
        found[tp.partition] = max(0, end - position)
    return found


class _Member:
    """What the group members below share: one consumer, stopped on leaving the block."""

    _consumer: AIOKafkaConsumer | None = None

    async def __aexit__(self, *exc_info: object) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await stop_within(consumer, "group member")

    @property
    def _kafka(self) -> AIOKafkaConsumer:
        assert self._consumer is not None, f"use 'async with {type(self).__name__}(...)'"
        return self._consumer


class GroupMember(_Member):
    """A member of a consumer group on the topic that reads raw records, partition by partition.

    For consumers that keep a fold per assigned partition (:mod:`consumers.partitions`):
    ``on_change`` is called with the partitions revoked or newly assigned, whose folds
    must be rebuilt; :meth:`fetch` returns each partition's raw records (``offset``,
    ``value``), undecoded, read as every ledger reader reads (:func:`ledger_consumer`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        group_id: str,
        on_change: Callable[[set[int]], None],
        *,
        fetch_max_wait_ms: int = 10,
    ) -> None:
        self.settings = settings
        self.group_id = group_id
        self.partitions: list[int] = []
        self._on_change = on_change
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        # A missing topic is an error, not a wait.
        self.partitions = await topic_partitions(self.settings)
        self._consumer = await connect(
            lambda: ledger_consumer(
                self.settings, self.group_id, fetch_max_wait_ms=self._fetch_max_wait_ms
            ),
            self.settings,
        )
        self._consumer.subscribe([self.settings.topic], listener=_ChangeListener(self._on_change))
        return self

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.settings.topic, partition)

    def _refusals(self) -> contextlib.AbstractContextManager[None]:
        return _refusals(self.settings, topic=("Read", self.settings.topic), group=self.group_id)

    def assignment(self) -> set[int]:
        return {tp.partition for tp in self._kafka.assignment()}

    async def end_offset(self, partition: int) -> int:
        """The partition's last stable offset now (read_committed end)."""
        tp = self._tp(partition)
        with self._refusals():
            ends: dict[TopicPartition, int] = await self._kafka.end_offsets([tp])
        return ends[tp]

    def last_stable_offset(self, partition: int) -> int | None:
        """The partition's last stable offset as the last fetch response gave it, if any."""
        end: int | None = self._kafka.last_stable_offset(self._tp(partition))
        return None if end is None or end < 0 else end

    async def seek(self, partition: int, offset: int = 0) -> bool:
        """Read ``partition`` from ``offset`` (0: its start, whatever the log's retention
        left); False if a rebalance has taken it meanwhile, or the broker did not answer
        the seek to the start within the request timeout (the caller tries again)."""
        tp = self._tp(partition)
        if tp not in self._kafka.assignment():
            return False
        try:
            with self._refusals():
                if offset:
                    self._kafka.seek(tp, offset)
                    return True
                return bool(await self._kafka.seek_to_beginning(tp))
        except IllegalStateError:  # revoked between the check and the seek
            return False

    async def position(self, partition: int) -> int:
        with self._refusals():
            position: int = await self._kafka.position(self._tp(partition))
        return position

    async def lags(self) -> dict[int, int]:
        """Records each assigned partition has yet to hand out (:func:`lags`)."""
        return await lags(self._kafka)

    async def fetch(self, timeout_ms: int) -> dict[int, list[Any]]:
        """The records fetched within ``timeout_ms``, by partition."""
        with self._refusals():
            fetched = await self._kafka.getmany(timeout_ms=timeout_ms)
        return {tp.partition: messages for tp, messages in fetched.items()}


class PatternMember(_Member):
    """A consumer group member of every topic whose name matches ``pattern``; raw records.

    For consumers that move records from many topics in transactions of their own
    (:mod:`consumers.admission`): before moving a newly assigned partition, the caller
    fences its last owner and then :meth:`resume` s it from the group's committed offset.
    Topics created later are found within :data:`METADATA_MAX_AGE_MS`.
    """

    def __init__(self, settings: KafkaSettings, group_id: str, pattern: str) -> None:
        self.settings = settings
        self.group_id = group_id
        self._pattern = pattern
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> Self:
        self._consumer = await connect(
            lambda: ledger_consumer(self.settings, self.group_id), self.settings
        )
        self._consumer.subscribe(pattern=self._pattern)
        return self

    def assignment(self) -> set[TopicPartition]:
        return set(self._kafka.assignment())

    async def resume(self, tp: TopicPartition) -> int | None:
        """Seek ``tp`` to the group's committed offset (else its beginning) and return it;
        None if the partition was revoked meanwhile; :class:`BrokerUnavailable` if the
        broker is lost on the way."""
        with _lost(self.settings, f"asking group {self.group_id}'s offset of {tp.topic}"):
            committed: int | None = await self._kafka.committed(tp)
            if tp not in self._kafka.assignment():
                return None
            if committed is None:
                await self._kafka.seek_to_beginning(tp)
                committed = await self._kafka.position(tp)
            else:
                self._kafka.seek(tp, committed)
        return committed

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        """The records fetched within ``timeout_ms``, by topic partition."""
        fetched: dict[TopicPartition, list[Any]] = await self._kafka.getmany(
            timeout_ms=timeout_ms, max_records=max_records
        )
        return fetched

    def lag(self, tp: TopicPartition, next_offset: int) -> int | None:
        """The last stable offset of an assigned ``tp`` minus ``next_offset``; None if unknown."""
        if tp not in self._kafka.assignment():
            return None
        end: int | None = self._kafka.last_stable_offset(tp)
        return None if end is None or end < 0 else max(0, end - next_offset)


class _ChangeListener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, on_change: Callable[[set[int]], None]) -> None:
        self._on_change = on_change

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self._on_change({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._on_change({tp.partition for tp in assigned})


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """A decoded event with where it sits in the log, and its encoding as logged."""

    position: Position
    event: Event
    value: bytes

    @property
    def time(self) -> int:
        """When the event occurred, in microseconds since 1970 (as :func:`message_time`)."""
        return micros(self.event.meta.occurred_at)

    @property
    def partition(self) -> int:
        return self.position.partition

    @property
    def offset(self) -> int:
        return self.position.offset


Message: TypeAlias = Any
"""A record as the consumer hands it out undecoded (aiokafka's ``ConsumerRecord``):
``partition``, ``offset``, ``key``, ``value`` and ``headers`` are what the ledger reads."""

Messages: TypeAlias = dict[int, list[Message]]
"""Consumed records per partition, each partition's in log order: one poll's worth."""

StartOffsets: TypeAlias = Callable[[set[int]], Mapping[int, int] | Awaitable[Mapping[int, int]]]
"""Where newly assigned partitions resume (:class:`EventConsumer`'s ``start_offsets``)."""


class EventConsumer:
    """Reads decoded events from the ledger topic; ``async with EventConsumer(settings) as c``.

    * ``group_id``: join this consumer group (partitions balanced across members);
      None reads every partition by manual assignment.
    * ``start_offsets``: called with the partitions just assigned, returns (or, as a
      coroutine, comes to) the next offset to read for those it knows; the others start
      at the beginning. aiokafka holds the group's heartbeats while it runs: keep it short.
    * ``until="end"``: stop at the end offsets of the moment the consumer started;
      a mapping stops each partition it names before that offset (only without a
      group).
    * ``partitions``: without a group, read only these.
    * ``dead_letters=False``: a reader that does not own the log's dead letters (the
      read API, a point-in-time read) skips an undecodable record with a warning
      instead of copying it to the dead-letter topic again.
    * ``fetch_max_wait_ms``: how long the broker may hold a fetch for data; a reader
      that follows the log live wants it short.
    * ``backlog``: with a group, deal the partitions among its members by the records
      each has left to read, as this callable reports them each time the consumer
      joins (:class:`BacklogAssignor`), instead of by count.

    It reads committed records only (:func:`ledger_consumer`).
    """

    def __init__(
        self,
        settings: KafkaSettings,
        *,
        group_id: str | None = None,
        start_offsets: StartOffsets | None = None,
        until: Literal["end"] | Mapping[int, int] | None = None,
        partitions: Iterable[int] | None = None,
        dead_letters: bool = True,
        fetch_max_wait_ms: int = 500,
        backlog: Callable[[], Mapping[int, int]] | None = None,
    ) -> None:
        if (until is not None or partitions is not None) and group_id is not None:
            raise ValueError(
                f"until={until!r} and partitions need manual assignment; drop group_id={group_id!r}"
            )
        self.settings = settings
        self.group_id = group_id
        self._start_offsets = start_offsets
        self._until = until
        self._partitions = None if partitions is None else sorted(partitions)
        self._with_dead_letters = dead_letters
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._assignors = () if backlog is None else (BacklogAssignor(backlog),)
        self._consumer: AIOKafkaConsumer | None = None
        self._dead_letters: DeadLetters | None = None
        self._ends: dict[TopicPartition, int] = {}  # until-mode partitions not finished yet

    def _make(self) -> AIOKafkaConsumer:
        return ledger_consumer(
            self.settings,
            self.group_id,
            max_partition_fetch_bytes=4 * 1024 * 1024,
            fetch_max_bytes=32 * 1024 * 1024,
            fetch_max_wait_ms=self._fetch_max_wait_ms,
            **({"partition_assignment_strategy": self._assignors} if self._assignors else {}),
        )

    async def __aenter__(self) -> Self:
        try:
            partitions = await topic_partitions(self.settings)
            if self._with_dead_letters:
                self._dead_letters = await DeadLetters(self.settings).__aenter__()
            if self._partitions is not None:
                missing = sorted(set(self._partitions) - set(partitions))
                if missing:
                    raise ValueError(f"partitions {missing} are not in topic {self.settings.topic}")
                partitions = self._partitions
            consumer = await connect(self._make, self.settings)
            self._consumer = consumer
            if self.group_id is None:
                with self._refusals():
                    await self._assign_all(consumer, partitions)
            else:
                consumer.subscribe([self.settings.topic], listener=_Listener(self))
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        consumer, self._consumer = self._consumer, None
        dead_letters, self._dead_letters = self._dead_letters, None
        try:
            if consumer is not None:
                await stop_within(consumer, "consumer")
        finally:
            if dead_letters is not None:
                await dead_letters.__aexit__(None, None, None)

    @property
    def _kafka(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("EventConsumer is not started: use 'async with EventConsumer(...)'")
        return self._consumer

    def _refusals(self) -> contextlib.AbstractContextManager[None]:
        return _refusals(self.settings, topic=("Read", self.settings.topic), group=self.group_id)

    def assignment(self) -> set[int]:
        """The partitions this consumer reads now."""
        return {tp.partition for tp in self._kafka.assignment()}

    def seek(self, next_offsets: Mapping[int, int]) -> None:
        """Read each assigned partition next from ``next_offsets`` (0 where it has none)."""
        kafka = self._kafka
        for tp in kafka.assignment():
            kafka.seek(tp, next_offsets.get(tp.partition, 0))

    async def positions(self) -> dict[int, int]:
        """The next offset this consumer reads, per assigned partition."""
        kafka = self._kafka
        with self._refusals():
            return {tp.partition: await kafka.position(tp) for tp in kafka.assignment()}

    async def lags(self) -> dict[int, int]:
        """Records each assigned partition has yet to hand out (:func:`lags`)."""
        return await lags(self._kafka)

    async def _assign_all(self, consumer: AIOKafkaConsumer, partitions: list[int]) -> None:
        topic = self.settings.topic
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await self._seek(consumer, assigned)
        if self._until == "end":
            ends = await consumer.end_offsets(assigned)
            self._ends = dict(ends)
            await self._pause_finished(consumer)
        elif self._until is not None:
            self._ends = {tp: self._until[tp.partition] for tp in assigned}
            await self._pause_finished(consumer)

    async def _seek(self, consumer: AIOKafkaConsumer, assigned: Iterable[TopicPartition]) -> None:
        assigned = list(assigned)
        if self._start_offsets is None:
            if self.group_id is None:
                await consumer.seek_to_beginning(*assigned)
            return  # a group member starts at its committed offset, else the beginning
        chosen = self._start_offsets({tp.partition for tp in assigned})
        if inspect.isawaitable(chosen):
            chosen = await chosen
        rest = []
        for tp in assigned:
            if tp.partition in chosen:
                consumer.seek(tp, chosen[tp.partition])
            else:
                rest.append(tp)
        if rest:
            await consumer.seek_to_beginning(*rest)

    async def _pause_finished(self, consumer: AIOKafkaConsumer) -> None:
        for tp, end in list(self._ends.items()):
            if await consumer.position(tp) >= end:
                del self._ends[tp]
                consumer.pause(tp)

    async def batches(
        self, max_records: int = 10_000, timeout_ms: int = 1_000, *, key: bytes | None = None
    ) -> AsyncIterator[list[Record]]:
        """Yield non-empty lists of records as they arrive, at most ``max_records`` read
        each; with ``key``, as :meth:`fetch`, only the records of that key."""
        while self._until is None or self._ends:
            if batch := await self.fetch(max_records, timeout_ms, key=key):
                yield batch

    async def batches_for_fold(
        self, max_records: int = 10_000, timeout_ms: int = 1_000
    ) -> AsyncGenerator[Messages, None]:
        """As :meth:`batches`, of what :meth:`fetch_for_fold` returns, one batch ahead:
        the next is fetched while the caller awaits something else (its batch's write,
        say), as aiokafka parses the records when it hands them out. A caller that leaves
        early closes the iterator (:func:`contextlib.aclosing`), which cancels that fetch.
        """
        ahead: asyncio.Future[Messages] | None = None
        if self._until is None or self._ends:
            ahead = asyncio.ensure_future(self.fetch_for_fold(max_records, timeout_ms))
        try:
            while ahead is not None:
                # Whether to read on is asked as each fetch ends, as it may have reached
                # the last ends: every fetch started is handed out.
                messages, ahead = await ahead, None
                if self._until is None or self._ends:
                    ahead = asyncio.ensure_future(self.fetch_for_fold(max_records, timeout_ms))
                if messages:
                    yield messages
        finally:
            if ahead is not None:
                await drop_fetch(ahead)

    async def fetch(
        self, max_records: int = 10_000, timeout_ms: int = 1_000, *, key: bytes | None = None
    ) -> list[Record]:
        """The records that arrive within ``timeout_ms`` (at most ``max_records``); maybe none.

        For a caller that must look up between fetches (a stop signal, positions);
        cancelling it loses nothing, as no record is handed out before it returns. With
        ``key`` (a cluster's name, encoded), only the records of that key are decoded and
        returned: one cluster's log, read from its partition with the others' records
        passed over undecoded.
        """
        records: list[Record] = []
        dead: list[tuple[Message, str]] = []
        for messages in (await self.fetch_for_fold(max_records, timeout_ms)).values():
            if key is not None:
                messages = [message for message in messages if message.key == key]
            decode_messages(messages, records, dead)
        await self.send_dead_letters(dead)
        return records

    async def fetch_for_fold(self, max_records: int = 10_000, timeout_ms: int = 1_000) -> Messages:
        """As :meth:`fetch`, undecoded: for a fold that decodes only what it must (most
        heartbeats it need not; :mod:`projections.thinning`). The caller decodes the rest
        (:func:`decode_message`) and sends those that belong in the dead-letter topic by
        :meth:`send_dead_letters` before it checkpoints past them."""
        consumer = self._kafka
        with self._refusals():
            fetched = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        batch: Messages = {}
        for tp, messages in fetched.items():
            end = self._ends.get(tp)
            if end is not None and messages and messages[-1].offset >= end:
                messages = messages[: first_at(messages, end)]
            if messages:
                batch[tp.partition] = messages
        if self._until is not None:
            with self._refusals():
                await self._pause_finished(consumer)
        return batch

    async def send_dead_letters(self, dead: Sequence[tuple[Any, str]]) -> None:
        """Copy ``(record, reason)`` s to the dead-letter topic, in log order (a reader
        without ``dead_letters`` logs and skips them)."""
        if not dead:
            return
        dead = sorted(dead, key=lambda letter: (letter[0].partition, letter[0].offset))
        if self._dead_letters is None:
            for message, reason in dead:
                log.warning(
                    "record %s:%d@%d skipped: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    reason,
                )
            return
        await self._send_dead_letters(dead)

    async def __aiter__(self) -> AsyncIterator[Record]:
        async for batch in self.batches():
            for record in batch:
                yield record

    async def _send_dead_letters(self, dead: Sequence[tuple[Any, str]]) -> None:
        assert self._dead_letters is not None
        for message, reason in dead:
            log.warning(
                "record %s:%d@%d is a dead letter: %s",
                message.topic,
                message.partition,
                message.offset,
                reason,
                extra={
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "dlq_topic": self.settings.dlq_topic,
                    "reason": reason,
                },
            )
        sent = await self._dead_letters.send(dead)
        metrics.RECORDS_DEAD_LETTERED.labels(self.settings.topic).inc(sent)


class DeadLetters:
    """Copies the log's undecodable records to the dead-letter topic, each once, whoever reads them.

    Every reader of the ledger meets a bad record again: the projector after a crash or
    a rebalance, every replay. So before a record is sent, the dead-letter topic itself
    is asked whether it has it: a source partition's dead letters go to one partition
    of the dead-letter topic (the same number, modulo its partitions) in Kafka
    transactions, with one transactional ID per source partition
    (``svledger-dead-letters-<topic>-<partition>``). A sender starts its producer
    (which fences any other sender of the partition and ends its open transaction),
    then reads the dead-letter partition once to learn the highest source offset sent,
    and from then on sends only records past it. If another sender fenced it meanwhile,
    its transaction fails; it waits a random, growing while (readers side by side, such
    as projectors of two databases or replays, fence each other in turn otherwise),
    reads, and sends what is still missing, if anything (read before it starts a
    producer, which would fence the other again). After :data:`DEAD_LETTER_ATTEMPTS`
    fenced attempts, or any other failure, it gives up (:class:`DeadLettersUnsent`, a
    broker outage to its caller: the records are read and sent again later).
    The dead-letter topic is small (bad records are rare), so reading a partition of it
    is cheap, and nothing else has to remember what was sent.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._dlq_partitions: list[int] = []
        self._senders: dict[int, tuple[TransactionalProducer, int]] = {}  # producer, sent until

    async def __aenter__(self) -> Self:
        self._dlq_partitions = await topic_partitions(self.settings, self.settings.dlq_topic)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        senders, self._senders = self._senders, {}
        for producer, _ in senders.values():
            await producer.stop()

    def _dlq_partition(self, partition: int) -> int:
        return self._dlq_partitions[partition % len(self._dlq_partitions)]

    async def send(self, dead: Sequence[tuple[Any, str]]) -> int:
        """Send ``(message, reason)`` pairs not sent before; the number sent."""
        by_partition: dict[int, list[tuple[Any, str]]] = {}
        for message, reason in dead:
            by_partition.setdefault(message.partition, []).append((message, reason))
        sent = 0
        for partition, letters in sorted(by_partition.items()):
            sent += await self._send_partition(partition, letters)
        return sent

    async def _send_partition(self, partition: int, letters: list[tuple[Any, str]]) -> int:
        for attempt in itertools.count(1):
            if partition not in self._senders:
                # Read before starting a producer, which would fence the sender that may
                # be sending these very letters: if it sent them, there is nothing to do.
                last = max(message.offset for message, _ in letters)
                if last < await self._sent_until(partition):
                    return 0
            producer, sent_until = await self._sender(partition)
            todo = [(m, r) for m, r in letters if m.offset >= sent_until]
            if not todo:
                return 0
            records = [
                Addressed(
                    self.settings.dlq_topic,
                    self._dlq_partition(partition),
                    OutgoingRecord(
                        message.key, message.value, dead_letter_headers(message, reason)
                    ),
                )
                for message, reason in todo
            ]
            try:
                await producer.commit(records)
            except TransactionFailed as error:
                await producer.stop()
                del self._senders[partition]
                if attempt == DEAD_LETTER_ATTEMPTS or not isinstance(error.__cause__, _FENCED):
                    raise DeadLettersUnsent(
                        f"the dead letters of {self.settings.topic}:{partition} were not sent"
                        f" to {self.settings.dlq_topic} ({attempt} attempts, the last: {error});"
                        " check that the broker is up and its log; they are sent when the"
                        " records are read again"
                    ) from error
                # Readers of one partition (projectors of two databases, replays) send its
                # dead letters at once: each new producer fences the others, so they wait
                # a random while, growing, before starting again, and one gets through.
                pause = random.uniform(0, min(2.0, 0.05 * 2**attempt))
                log.warning(
                    "dead letters of %s:%d: %s; checking again in %.2f s",
                    self.settings.topic,
                    partition,
                    error,
                    pause,
                )
                await asyncio.sleep(pause)
                continue
            self._senders[partition] = (producer, todo[-1][0].offset + 1)
            return len(todo)
        raise AssertionError("unreachable")

    async def _sender(self, partition: int) -> tuple[TransactionalProducer, int]:
        if partition not in self._senders:
            producer = TransactionalProducer(
                self.settings, f"{DEAD_LETTER_SENDERS}-{self.settings.topic}-{partition}"
            )
            await producer.start()
            try:
                sent_until = await self._sent_until(partition)
            except BaseException:
                await producer.stop()
                raise
            self._senders[partition] = (producer, sent_until)
        return self._senders[partition]

    async def _sent_until(self, partition: int) -> int:
        """One past the highest offset of ``partition`` in the dead-letter topic, else 0."""
        tp = TopicPartition(self.settings.dlq_topic, self._dlq_partition(partition))
        topic, source = self.settings.topic.encode(), str(partition).encode()
        consumer = await connect(
            lambda: AIOKafkaConsumer(
                **self.settings.client_kwargs(),
                enable_auto_commit=False,
                isolation_level="read_committed",
            ),
            self.settings,
        )
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            sent_until = 0
            while await consumer.position(tp) < end:
                for message in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                    headers = dict(message.headers)
                    if (
                        headers.get(DLQ_TOPIC_HEADER) == topic
                        and headers.get(DLQ_PARTITION_HEADER) == source
                    ):
                        offset = int(headers[DLQ_OFFSET_HEADER])
                        sent_until = max(sent_until, offset + 1)
            return sent_until
        finally:
            await consumer.stop()


def dead_letter_headers(message: Any, reason: str) -> Headers:
    """A dead letter's headers: the original ones, then why and where it came from."""
    return [
        *message.headers,
        (DLQ_REASON_HEADER, reason.encode()),
        (DLQ_TOPIC_HEADER, message.topic.encode()),
        (DLQ_PARTITION_HEADER, str(message.partition).encode()),
        (DLQ_OFFSET_HEADER, str(message.offset).encode()),
    ]


def decode_message(message: Message) -> Record | str:
    """The record of a consumed message, or why it belongs in the dead-letter topic."""
    if message.value is None:
        return "record has no value (a tombstone); the ledger never deletes"
    try:
        event = decode(message.value)
    except CodecError as error:
        return str(error)
    cluster = event.meta.cluster
    if message.key != cluster.encode():
        return f"record key {message.key!r} is not the event's meta.cluster {cluster!r}"
    if (lie := _header_lie(message.headers, event)) is not None:
        return lie
    return Record(Position(message.partition, message.offset), event, message.value)


def _header_lie(headers: Headers, event: Event) -> str | None:
    """Which of the headers readers trust without decoding (:func:`to_record`) says
    other than ``event``, if one does.

    The fold counts a plain lease renewal by its lease header and cuts the log by the
    time header, undecoded, so a record whose headers disagree with its event would
    be folded one way by a reader that decodes it and another by one that does not:
    it is refused by both, as a dead letter.
    """
    for name, value in headers:
        if name == TIME_HEADER and len(value) == 8:
            moment = int.from_bytes(value, "big", signed=True)
            if moment != micros(event.meta.occurred_at):
                return (
                    f"header {TIME_HEADER} says the event occurred at {moment} us, its"
                    f" meta.occurred_at {event.meta.occurred_at.isoformat()}: a writer"
                    " must build the headers from the event it encodes"
                )
        elif name == LEASE_HEADER and not (
            isinstance(event, ApiserverHeartbeat) and value == heartbeat_term(event)
        ):
            return (
                f"header {LEASE_HEADER} does not hold the lease term of the"
                f" {type_name(event)} it comes with: a writer must build the headers"
                " from the event it encodes"
            )
    return None


def decode_messages(
    messages: Iterable[Message], records: list[Record], dead: list[tuple[Message, str]]
) -> None:
    """Append the record of each consumed message to ``records``, or the message and why
    it belongs in the dead-letter topic to ``dead``."""
    for message in messages:
        read = decode_message(message)
        if isinstance(read, str):
            dead.append((message, read))
        else:
            records.append(read)


_OFFSET: Final = operator.attrgetter("offset")


def first_at(messages: Sequence[Message], offset: int) -> int:
    """The index of the first of ``messages`` (one partition's, in log order) at or after
    ``offset``; their count if there is none."""
    return bisect.bisect_left(messages, offset, key=_OFFSET)


def message_time(message: Message) -> int | None:
    """When a consumed message's event occurred, in microseconds since 1970: from its
    ``svledger-time`` header, else (a record written before the header) its decoded
    event; None if it does not decode (a dead letter)."""
    for name, value in message.headers:
        if name == TIME_HEADER and len(value) == 8:
            return int.from_bytes(value, "big", signed=True)
    read = decode_message(message)
    return None if isinstance(read, str) else read.time


def max_time(messages: Iterable[Message], latest: int | None) -> int | None:
    """``latest`` (microseconds; None: not kept) moved to the latest time an event of
    ``messages`` occurred at (:func:`message_time`; a dead letter has none)."""
    if latest is None:
        return None
    for message in messages:
        moment = message_time(message)
        if moment is not None and moment > latest:
            latest = moment
    return latest


class BacklogAssignor:
    """aiokafka's side of :mod:`ledger.assignment`: offers this member's backlog (what
    ``backlog()`` returns each time the member joins) and, as the group's leader, deals
    the partitions by every member's report."""

    name: Final = assignment.NAME
    version: Final = 0

    def __init__(self, backlog: Callable[[], Mapping[int, int]]) -> None:
        self._backlog = backlog

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(
            self.version, sorted(topics), assignment.report(self._backlog())
        )

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        backlog = assignment.merged(member.user_data for member in members.values())
        # A ledger reader subscribes to the events topic alone, whose partitions the
        # backlog numbers; each topic is dealt among its subscribers.
        topics = sorted({topic for member in members.values() for topic in member.subscription})
        dealt: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        for topic in topics:
            subscribers = [m for m, member in members.items() if topic in member.subscription]
            partitions = cluster.partitions_for_topic(topic) or set()
            for member, held in assignment.deal(partitions, backlog, subscribers).items():
                if held:
                    dealt[member].append((topic, held))
        return {
            member: ConsumerProtocolMemberAssignment(self.version, held, b"")
            for member, held in dealt.items()
        }

    def on_assignment(self, assigned: ConsumerProtocolMemberAssignment) -> None:
        pass


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """Seeks newly assigned partitions to where the caller wants to resume."""

    def __init__(self, owner: EventConsumer) -> None:
        self._owner = owner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        await self._owner._seek(self._owner._kafka, assigned)
