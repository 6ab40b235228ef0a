"""What the broker's failures mean to the ledger: an outage, or a refusal.

An outage is :class:`BrokerUnavailable`: the broker could not be reached within the
connect timeout (:mod:`ledger.kafka.connection`), or it went away after the connection
was made (:func:`lost`). What a broker outage raises from any client call is
:data:`BROKER_ERRORS`; the services that ride out an outage catch these and retry.

A broker that enforces security is told apart from one that is down. A client it
turns away at the door (a refused SASL login, a certificate the client cannot verify,
a listener that speaks another security protocol) fails at once with
:class:`NotAuthenticated`, not after the connect timeout; a request its ACLs refuse
fails with :class:`NotAuthorized`, naming the principal, the operation and the
resource (:func:`refusals`, told what the caller was doing). Both are
:class:`~ledger.errors.AccessDenied`: not an outage, so the services that ride out
outages stop on them instead of retrying for ever.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaError,
    KafkaTimeoutError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from ledger.errors import AccessDenied, Unavailable
from ledger.settings import KafkaSettings


class BrokerUnavailable(Unavailable):
    """Kafka could not be reached within the connect timeout."""


GRANT_HINT: Final = "grant its role's ACLs with deploy/kafka/acls.py (docs/production.md)"


class NotAuthenticated(AccessDenied):
    """The broker turned the client away before any request: credentials or protocol."""


class NotAuthorized(AccessDenied):
    """The broker's ACLs refused the client's principal an operation on a resource.

    ``refused`` says who may not do what (``principal User:bob may not Write topic
    'svledger.events' (Kafka: TopicAuthorizationFailed)``); the message adds how to
    grant it. A TLS client's principal is named after its certificate's CN
    (:attr:`~ledger.settings.KafkaSettings.principal`), and the certificate file with
    it, since the broker's mapping rules decide; ``principal`` is None where the
    client has no name to give. ``topic`` is the events topic the client was set up for.
    """

    def __init__(self, settings: KafkaSettings, operation: str, resource: str, kafka: str) -> None:
        self.principal = settings.principal
        self.topic = settings.topic
        self.operation = operation
        self.resource = resource
        certificate = (
            settings.ssl_certfile if settings.uses_ssl and not settings.uses_sasl else None
        )
        if certificate is None:
            who = f"principal {self.principal}" if self.principal else "this client's principal"
        elif self.principal:
            who = f"principal {self.principal} (the CN of certificate {certificate})"
        else:
            who = f"the principal of certificate {certificate}"
        self.refused = f"{who} may not {operation} {resource} (Kafka: {kafka})"
        super().__init__(f"{self.refused}; {GRANT_HINT}")


# What a broker outage raises from any client call; callers that ride out an outage
# catch these and retry.
BROKER_ERRORS: Final = (BrokerUnavailable, KafkaError)


_REFUSALS: Final = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    ClusterAuthorizationFailedError,
)


def as_refusal(
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
def refusals(
    settings: KafkaSettings,
    *,
    topic: tuple[str, str] | None = None,
    group: str | None = None,
    transactional_id: str | None = None,
) -> Iterator[None]:
    """Raise an ACL's refusal inside the block as :class:`NotAuthorized` (:func:`as_refusal`)."""
    try:
        yield
    except _REFUSALS as error:
        refusal = as_refusal(
            error, settings, topic=topic, group=group, transactional_id=transactional_id
        )
        assert refusal is not None
        raise refusal from error


@contextlib.contextmanager
def lost(settings: KafkaSettings, doing: str) -> Iterator[None]:
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
