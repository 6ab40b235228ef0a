"""Reaching the broker: starting a client, riding out an outage, stopping in time.

Connecting retries for a bounded time and then fails with
:class:`~ledger.kafka.errors.BrokerUnavailable`, which names the bootstrap address and
what to check (:func:`connect`). A client the broker turns away at the door fails at
once with :class:`~ledger.kafka.errors.NotAuthenticated`: the broker is asked why on a
connection of its own (:func:`_turned_away`), as aiokafka says only that it could not
bootstrap. A service that waits for a broker that is away tries again every
:data:`RETRY_SECONDS` (:func:`while_away`).

Nothing waits for the broker past a service's stop. A service told to stop
(:func:`stop_connecting_on`) gives up connecting at once (:class:`StoppedConnecting`),
and a transaction waiting for the broker soon after (:func:`finish_within`); a client
that has not stopped within :data:`STOP_TIMEOUT_SECONDS` is abandoned
(:func:`stop_within`): a broker that hangs would otherwise hold the shutdown past
Kubernetes' grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)
from aiokafka.protocol.metadata import MetadataRequest

from ledger.kafka.errors import BrokerUnavailable, NotAuthenticated
from ledger.settings import KafkaSettings, bootstrap_addresses

log = logging.getLogger(__name__)

# A client's stop (a producer's flush, a member's leave) not completed by then is given up.
STOP_TIMEOUT_SECONDS: Final = 10.0


class _Client(Protocol):
    async def start(self) -> None: ...


async def stop_within(client: _Client, what: str) -> None:
    """Stop ``client``, or abandon it with a warning if it has not stopped within
    :data:`STOP_TIMEOUT_SECONDS`: a broker that does not answer (hung, not gone) holds
    a producer's flush and a group member's leave request for the whole request
    timeout (40 s), past Kubernetes' grace period. A member that does not leave is
    dropped by the group coordinator after its session timeout."""
    if not await _finish_or_abandon(asyncio.create_task(_shut(client)), STOP_TIMEOUT_SECONDS):
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


_abandoned: set[asyncio.Task[Any]] = set()


async def finish_within(task: asyncio.Task[Any], seconds: float, what: str) -> bool:
    """:func:`_finish_or_abandon`, in a service that may be told to stop
    (:func:`stop_connecting_on`): once it is, ``task`` gets :data:`_UNWIND_SECONDS`
    more, then it is abandoned with :class:`StoppedConnecting` (``what`` waited for
    Kafka). A broker that does not answer would otherwise hold the shutdown for the
    whole of ``seconds``, past Kubernetes' grace period."""
    stop = _STOP.get()
    if stop is None:
        return await _finish_or_abandon(task, seconds)
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
    if await _finish_or_abandon(task, max(0.0, deadline - loop.time())):
        return True
    if stop.is_set():
        raise StoppedConnecting(f"told to stop while {what} waited for Kafka")
    return False


async def _finish_or_abandon(task: asyncio.Task[Any], seconds: float) -> bool:
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
